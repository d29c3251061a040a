"""kilonode as users install it: the built wheel in a fresh virtualenv, run from a directory
outside the checkout. No package index is reached: the wheel is built without build
isolation, installed with --no-deps --no-index, and the fresh environment borrows the
dependencies of this one through a .pth line (so only `kilonode` comes from the wheel)."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kilonode.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # builds and installs a wheel (~15 s)


def run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the wheel; returns its bin/ directory."""
    assert REPO_ROOT is not None
    work = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools writes build/ and *.egg-info into the tree it builds, and
    # tests write nothing into the checkout.
    source = work / "source"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "out", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
    ))
    built = run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                 "--no-index", "-w", str(work / "dist")], cwd=work)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = (work / "dist").glob("kilonode-*.whl")
    venv = work / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work).returncode == 0
    [purelib] = venv.glob("lib/python*/site-packages")
    # the dependencies, from this environment; not kilonode itself (an editable install's
    # finder lives in a .pth file there, and .pth files are read only in site directories)
    (purelib / "borrowed-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                "--no-index", str(wheel)], cwd=work)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return venv / "bin"


def test_the_wheel_is_what_runs(installed: Path, tmp_path: Path) -> None:
    probe = run([str(installed / "python"), "-c", "import kilonode, kilonode.paths as p; "
                 "print(kilonode.__file__); print(p.REPO_ROOT); print(p.TEMPLATES_DIR)"], cwd=tmp_path)
    origin, repo_root, templates = probe.stdout.split()
    assert "site-packages/kilonode/" in origin and repo_root == "None"
    assert templates.endswith("site-packages/kilonode/_data/templates")
    version = run([str(installed / "kilonode"), "--version"], cwd=tmp_path)
    expected = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version.returncode == 0 and version.stdout.strip() == f"kilonode {expected}"


def test_render_explain_and_plan_work_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    kilonode = str(installed / "kilonode")
    rendered = run([kilonode, "render", "local", "--out", "out"], cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert (tmp_path / "out" / "pool-cpu" / "etc" / "sysctl.d" / "90-kilonode.conf").is_file()
    assert (tmp_path / "out" / "etcd-main-0" / "etc" / "systemd" / "system" / "etcd.service").is_file()
    explained = run([kilonode, "explain", "research-7500"], cwd=tmp_path)
    assert explained.returncode == 0 and "a100-ib" in explained.stdout, explained.stderr
    planned = run([kilonode, "plan", "local", "--format", "json"], cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert json.loads(planned.stdout)["counts"]["azure-native:compute:VirtualMachine"] == 7
    # preflight's checks are a package of their own (once missing from the wheel)
    checked = run([kilonode, "preflight", "local", "--check", "node-join", "--format", "json"], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert json.loads(checked.stdout) == []


def test_the_image_commands_find_their_recipe_and_suite(installed: Path, tmp_path: Path) -> None:
    probe = run([str(installed / "python"), "-c",
                 "from kilonode.image.recipe import load_recipe; from kilonode.paths import VERIFY_SUITE_DIR; "
                 "r = load_recipe(); print(r.root); print(sorted(p.name for p in VERIFY_SUITE_DIR.glob('test_*.py')))"],
                cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    root, suite = probe.stdout.splitlines()
    assert root.endswith("kilonode/_data/node_image")
    assert "test_offline_image.py" in suite and "test_runtime.py" in suite
    helped = run([str(installed / "kilonode"), "image", "verify", "--help"], cwd=tmp_path)
    assert helped.returncode == 0 and "testinfra" in helped.stdout


def test_the_gpu_health_rules_and_their_data_ship_in_the_wheel(installed: Path, tmp_path: Path) -> None:
    fixtures = Path(__file__).parent / "node" / "gpu" / "fixtures" / "h100-80gb-hbm3"
    node = tmp_path / "node"
    shutil.copytree(fixtures, node)
    log = node / "dmesg-xid.txt"
    log.chmod(0o644)
    # an Xid needs the catalogue (kilonode/node/gpu/xid_catalog.toml) from the wheel
    log.write_text(log.read_text() + "[ 9.0] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.\n")
    checked = run([str(installed / "kilonode"), "gpu-health", "--from", str(node), "--expect-gpus", "1"], cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "FAULT xid: Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" in checked.stdout
