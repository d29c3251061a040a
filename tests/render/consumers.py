"""Real consumers of rendered artefacts: systemd-analyze, and cloud-init's own schema
validator taken from Debian's cloud-init package (unpacked, not installed)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kilonode.render.files import RenderedFile

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kilonode"


def _apt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def cloud_init_dist_packages(fetch: bool = False) -> Path:
    """Debian's cloud-init, unpacked under the cache, keyed by its package version.

    Tests only read the cache (they never reach the package mirror); `make test-artefacts`
    fetches it with fetch=True (python -m tests.artefacts), once per cloud-init version.
    """
    policy = subprocess.run(["apt-cache", "policy", "cloud-init"], capture_output=True, text=True, check=False)
    candidate = next((line.split()[-1] for line in policy.stdout.splitlines() if "Candidate:" in line), "")
    if (not candidate or candidate == "(none)") and fetch:
        _apt("update", "-qq")
        return cloud_init_dist_packages(fetch=False)
    target = CACHE / f"cloud-init-{candidate}"
    dist = target / "usr/lib/python3/dist-packages"
    if (dist / "cloudinit/config/schema.py").is_file():
        return dist
    if not fetch:
        raise RuntimeError(f"Debian's cloud-init {candidate or '(unknown version)'} is not unpacked under {CACHE}: "
                           "run `make test-artefacts` (python -m tests.artefacts)")
    with tempfile.TemporaryDirectory() as work:
        result = _apt("download", f"cloud-init={candidate}", cwd=Path(work))
        if result.returncode != 0:
            raise RuntimeError(f"apt-get download cloud-init failed: {result.stderr}")
        [deb] = Path(work).glob("cloud-init_*.deb")
        staging = Path(work) / "x"
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(str(staging), target)
    return dist


def import_cloud_init() -> None:
    """Import Debian's unpacked `cloudinit` package from its own folder, sys.path untouched: its
    submodules are found through the package's __path__, its dependencies in this venv."""
    if "cloudinit" in sys.modules:
        return
    spec = importlib.machinery.PathFinder.find_spec("cloudinit", [str(cloud_init_dist_packages())])
    assert spec is not None and spec.loader is not None, "cloud-init's package was not unpacked"
    module = importlib.util.module_from_spec(spec)
    sys.modules["cloudinit"] = module
    spec.loader.exec_module(module)


def cloud_init_validator() -> Any:
    """Return validate(config: dict) -> list[str] using cloud-init's own code and schema."""
    import_cloud_init()
    from cloudinit.config.schema import SchemaValidationError, get_schema, validate_cloudconfig_schema

    schema = get_schema()
    # cloud-init 22.4's schema does not reject unknown top-level keys (`runcmnd` passes);
    # every module's properties together are the keys it knows.
    known = {key for definition in schema.get("$defs", {}).values() for key in definition.get("properties", {})}

    def validate(config: dict[str, Any]) -> list[str]:
        problems = [f"unknown top-level key {key!r}" for key in config if key not in known]
        try:
            validate_cloudconfig_schema(config, schema, strict=True)
        except SchemaValidationError as error:
            problems.append(str(error))
        return problems

    return validate


def verify_rendered_units(unit_dir: Path, files: Mapping[str, RenderedFile], paths: Iterable[str]) -> list[str]:
    """Write the rendered units at `paths` (host paths in `files`) into `unit_dir` under their own
    names and systemd-analyze verify them together; every line it printed."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: run `make setup` (installs .ci/debian-packages.txt)")
    units = []
    for path in paths:
        unit = unit_dir / Path(path).name
        unit.write_text(files[path].content)
        units.append(unit)
    return systemd_verify(unit_dir, units)


def systemd_verify(unit_dir: Path, units: list[Path]) -> list[str]:
    """systemd-analyze verify the units with `unit_dir` ahead of the system unit path;
    returns every line it printed."""
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:", "SYSTEMD_LOG_COLOR": "0"}
    result = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    return [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
