"""`kilonode new`'s pin: requirements.txt must install kilonode on a machine where no package
index has it (kilonode is not on PyPI). The slow test builds the wheel the way `kilonode new`
does by default and installs the scaffold's requirements.txt into a fresh virtualenv with
`pip install --no-index -r requirements.txt`: no index is reached at all."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.paths import NODE_IMAGE_DIR, REPO_ROOT

runner = CliRunner()
assert REPO_ROOT is not None
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def requirements(project: Path) -> list[str]:
    """requirements.txt's lines that pip reads (its comments left out)."""
    text = (project / "requirements.txt").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def borrowed_dependencies(into: Path) -> Path:
    """A folder that shows this environment's packages but not kilonode (so pip must install
    kilonode from the pin, and finds every dependency already satisfied without an index)."""
    into.mkdir()
    for folder in map(Path, site.getsitepackages()):
        for entry in folder.iterdir():
            lowered = entry.name.lower()
            if lowered.startswith(("kilonode", "__editable__")) or entry.suffix == ".pth":
                continue
            if not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry)
    return into


@pytest.mark.slow  # builds the wheel and installs it (~10 s)
def test_the_default_pin_installs_with_no_index(tmp_path: Path) -> None:
    project = tmp_path / "infra-clusters"
    made = run([sys.executable, "-m", "kilonode", "new", str(project), "--stack", "prod"], cwd=tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    assert requirements(project) == ["--find-links vendor", f"kilonode=={VERSION}"]
    assert [p.name for p in (project / "vendor").iterdir()] == [f"kilonode-{VERSION}-py3-none-any.whl"]
    assert "kilonode is not on PyPI" in (project / "requirements.txt").read_text()
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path).returncode == 0
    [purelib] = venv.glob("lib/python*/site-packages")
    (purelib / "borrowed.pth").write_text(f"{borrowed_dependencies(tmp_path / 'borrowed')}\n")
    # from another directory: --find-links is read relative to requirements.txt, not the cwd
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-index", "-r", str(project / "requirements.txt")],
                          cwd=elsewhere, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"Successfully installed kilonode-{VERSION}" in done.stdout
    probe = run([str(venv / "bin" / "python"), "-c", "import kilonode, importlib.metadata as m; "
                 "print(kilonode.__file__); print(m.version('kilonode'))"], cwd=project)
    origin, version = probe.stdout.split()
    assert origin.startswith(str(purelib)) and version == VERSION, probe.stderr
    # the installed kilonode runs the project it was scaffolded with
    validated = run([str(venv / "bin" / "kilonode"), "validate", "prod"], cwd=project)
    assert validated.returncode == 0, validated.stdout + validated.stderr


def test_a_given_wheel_is_vendored_and_pinned_by_its_version(tmp_path: Path) -> None:
    wheel = tmp_path / f"kilonode-{VERSION}-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--wheel", str(wheel)])
    assert result.exit_code == 0, result.output
    assert requirements(tmp_path / "p") == ["--find-links vendor", f"kilonode=={VERSION}"]
    assert (tmp_path / "p" / "vendor" / wheel.name).read_bytes() == b"a wheel"


def test_a_wheel_of_another_version_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "kilonode-0.0.1-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--wheel", str(wheel)])
    assert result.exit_code == 2 and f"is kilonode 0.0.1, and this kilonode is {VERSION}" in result.output
    assert not (tmp_path / "p").exists()


def test_the_git_pin_names_the_release_tag(tmp_path: Path) -> None:
    url = "https://git.example.org/platform/kilonode.git"
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--pin", "git", "--git-url", url])
    assert result.exit_code == 0, result.output
    assert requirements(tmp_path / "p") == [f"kilonode @ git+{url}@v{VERSION}"]
    assert f"the tag v{VERSION} must exist there" in (tmp_path / "p" / "requirements.txt").read_text()
    assert not (tmp_path / "p" / "vendor").exists()


def test_the_path_pin_says_it_is_for_this_machine(tmp_path: Path) -> None:
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--pin", "path"])
    assert result.exit_code == 0, result.output
    assert requirements(tmp_path / "p") == [f"kilonode @ {REPO_ROOT.as_uri()}"]
    assert "on THIS machine only" in (tmp_path / "p" / "requirements.txt").read_text()


def test_mismatched_options_are_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--pin", "path", "--git-url", "x"])
    assert result.exit_code == 2 and "--git-url goes with --pin git" in result.output


def test_the_project_gets_its_own_locks_and_catalogue(tmp_path: Path) -> None:
    """Seeded from the packaged locks, so the digests kilonode records stay trusted and a first
    fetch is written into the project (not into site-packages, which a reinstall replaces)."""
    result = runner.invoke(app, ["new", str(tmp_path / "p"), "--pin", "path"])
    assert result.exit_code == 0, result.output
    for lock in ("binaries.lock.toml", "apt.lock.toml"):
        assert (tmp_path / "p" / "node-image" / lock).read_bytes() == (NODE_IMAGE_DIR / lock).read_bytes()
    assert "sizes: {}" in (tmp_path / "p" / "catalog" / "vm_sizes.yaml").read_text()
