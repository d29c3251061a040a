"""Set-up on a fresh Debian 12: the README's prerequisites are all it may assume.

scripts/check-bare-debian holds the one list of what set-up and the tests run on the host
(HOST_NEEDS) and proves it on a minimal Debian 12 root (slow: mmdebstrap, then apt installs
.ci/debian-packages.txt in it). The fast tests keep that list, the README and the Makefile's
order honest: every command the tests and the image build name is in the list, the README names
every prerequisite the minimal root gets, and set-up installs the host packages before the venvs.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "check-bare-debian"
# Where host commands are named: the tests, and the host side of the image build, the local
# rehearsal and the benches (infra/kilonode/node runs on nodes, not here).
SCANNED = ("tests", "infra/kilonode/image", "infra/kilonode/local", "bench")
WHICH = re.compile(r'shutil\.which\(\s*"([^"]+)"')
ARGV = re.compile(r'subprocess\.(?:run|Popen|check_output|check_call)\(\s*\[\s*"([^"]+)"')
TIMEOUT_S = 1800  # cold: the minimal root and ~1 GB of packages downloaded; warm (cached) a few minutes


def check_bare_debian() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_bare_debian", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def named_commands() -> dict[str, set[str]]:
    """Every command a scanned file runs by a literal name, in shutil.which or first in a subprocess argv."""
    found: dict[str, set[str]] = {}
    for top in SCANNED:
        for path in (REPO / top).rglob("*.py"):
            if "golden" in path.relative_to(REPO).parts:
                continue
            text = path.read_text()
            for match in [*WHICH.finditer(text), *ARGV.finditer(text)]:
                found.setdefault(match.group(1), set()).add(str(path.relative_to(REPO)))
    return found


def test_every_command_the_tests_name_is_in_the_one_list() -> None:
    module = check_bare_debian()
    unlisted = {name: sorted(files) for name, files in named_commands().items()
                if name not in module.HOST_NEEDS and name not in module.ELSEWHERE}
    # each belongs in HOST_NEEDS of scripts/check-bare-debian, and its package in .ci/debian-packages.txt
    assert unlisted == {}


def test_the_readme_names_every_prerequisite_the_bare_root_gets() -> None:
    readme = (REPO / "README.md").read_text()
    [sentence] = [p for p in readme.split("\n\n") if p.startswith("Both work on a fresh Debian 12 machine")]
    module = check_bare_debian()
    for package in module.PREREQUISITES:
        assert f"`{package}`" in sentence, package
    assert f"`{module.APT_SOURCES}`" in sentence  # the deb822 sources the image bases are built from
    assert "root" in sentence and "sudo" in sentence


def test_setup_installs_the_host_packages_before_it_makes_the_venvs() -> None:
    makefile = (REPO / "Makefile").read_text()
    [setup] = re.findall(r"^setup:([^#\n]*)", makefile, flags=re.MULTILINE)
    assert setup.split()[0] == "host-packages", setup
    # order-only prerequisites: `make -j` and a direct `make .venv/.installed` keep the order too
    for venv in ("$(VENV)/.installed", "$(CHECKOV_VENV)/.installed"):
        [rule] = re.findall(rf"^{re.escape(venv)}:([^\n]*)", makefile, flags=re.MULTILINE)
        assert "host-packages" in rule.partition("|")[2].split(), (venv, rule)
    listed = (REPO / ".ci" / "debian-packages.txt").read_text().split()
    assert "python3-venv" in listed


@pytest.mark.slow
def test_install_host_packages_brings_a_minimal_debian_12_everything_the_tests_run() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: mmdebstrap --mode=root, chroot and mounts")
    if shutil.which("mmdebstrap") is None:
        pytest.fail("mmdebstrap missing: run `make setup` (installs .ci/debian-packages.txt)")
    before = set(Path(tempfile.gettempdir()).glob("kilonode-bare-debian-*"))
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=TIMEOUT_S,
                            check=False)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert "complete:" in result.stdout, result.stdout
    print(f"check-bare-debian: {took:.0f} s")
    # what it unpacked is gone, and nothing is mounted (its mounts lived in a namespace of their own)
    assert set(Path(tempfile.gettempdir()).glob("kilonode-bare-debian-*")) <= before
    # by mount point (mountinfo's 5th field): run inside check-bare-debian's own root (`--run test`),
    # that root's "/" is a bind mount whose source (4th field) is such a directory on the host
    leftovers = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                 if "kilonode-bare-debian-" in line.split()[4]]
    assert leftovers == []
