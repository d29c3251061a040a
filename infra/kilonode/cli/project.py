"""Commands for a platform team's own infrastructure repository: `new` and `schema`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from enum import StrEnum
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer

from kilonode.cli.common import die, err, out
from kilonode.paths import NODE_IMAGE_DIR, REPO_ROOT

PROGRAM = '''"""Pulumi program: one cluster per stack (stacks/Pulumi.<stack>.yaml), built by kilonode."""

from kilonode.azure.program import main

main()
'''

GITIGNORE = "venv/\nout/\nbuild/\n__pycache__/\n"
# where `--pin wheel` puts the wheel, relative to the project (requirements.txt's --find-links)
VENDOR = "vendor"
# the lock files the image build keeps (kilonode.catalog.binaries, kilonode.image.vendor_apt):
# seeded into the project from the packaged ones, so the digests kilonode's maintainers
# recorded stay trusted, and a first fetch is recorded where the project can commit it
LOCK_FILES = ("binaries.lock.toml", "apt.lock.toml")
VM_SIZES = """\
# VM sizes this project adds to kilonode's catalogue (kilonode/catalog/vm_sizes.yaml, packaged).
# kilonode reads this file whenever it runs in this project (`pulumi up` included) and merges
# it over the packaged catalogue: a size named here that the package already has must repeat
# the packaged row exactly (a different row is refused, so an upgrade never silently changes
# a size under you); an entry that is not a complete row is refused with its problem.
# Each row has the packaged rows' keys (`kilonode schema` does not cover this file; copy a row
# of the same series from the packaged file and correct it from the size's Microsoft Learn page):
#
# sizes:
#   Standard_ND96isr_H200_v5:
#     vcpus: 96
#     memoryGib: 1850
#     gpus: 8
#     gpuModel: "NVIDIA H200"
#     infiniband: true
#     tempDiskGib: 1024
#     nvmeDisks: {count: 8, sizeGib: 3584}
#     maxNics: 8
#     acceleratedNetworking: true
#     generations: [2]
#     nvswitch: true
#     source: https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/nd-h200-v5-series
sizes: {}
"""


class PinKind(StrEnum):
    wheel = "wheel"
    git = "git"
    path = "path"


def _pyproject_version() -> str:
    """The running kilonode's version. In a source checkout pyproject.toml says it: an editable
    install's metadata keeps the version it was installed at until it is installed again."""
    if REPO_ROOT is not None and (REPO_ROOT / "pyproject.toml").is_file():
        import tomllib

        return str(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"])
    try:
        return package_version("kilonode")
    except PackageNotFoundError:
        return "0+unknown"


def _project_yaml(name: str) -> str:
    return (
        f"name: {name}\n"
        "description: GPU Kubernetes clusters on Azure, one stack per cluster (stacks/), built by kilonode\n"
        "runtime:\n"
        "  name: python\n"
        "  options:\n"
        "    virtualenv: venv\n"
        "# the program is __main__.py in this folder; the stack files live in stacks/\n"
        "stackConfigDir: stacks\n"
    )


def new(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A new or empty directory for the project.")],
    stack: Annotated[str, typer.Option("--stack", help="The first stack's name (stacks/Pulumi.<stack>.yaml).")] = "dev",
    name: Annotated[
        str | None,
        typer.Option("--name", help="The cluster's name (default: DIR's name, lowercased; it prefixes Azure names)."),
    ] = None,
    pin: Annotated[PinKind, typer.Option(
        "--pin", help="How requirements.txt pins kilonode (it is not on PyPI). wheel: the wheel copied into "
                      "DIR/vendor/ and pinned by version (--wheel FILE, or built from the checkout this kilonode "
                      "runs from); git: `kilonode @ git+URL@v<version>` (--git-url, or the checkout's origin; "
                      "the tag must be pushed); path: this checkout's folder (this machine only).")] = PinKind.wheel,
    wheel: Annotated[Path | None, typer.Option(
        "--wheel", help="With --pin wheel: the kilonode wheel to vendor (the one this kilonode was installed from).",
        show_default=False, metavar="FILE")] = None,
    git_url: Annotated[str | None, typer.Option(
        "--git-url", help="With --pin git: the URL of your clone of kilonode that carries the v<version> tag.",
        show_default=False, metavar="URL")] = None,
) -> None:
    """Scaffold a Pulumi project for your clusters in your own repository, pinned to this kilonode.

    Writes Pulumi.yaml (stackConfigDir: stacks), __main__.py (a few lines that call kilonode),
    requirements.txt (kilonode pinned to this version, installable: see --pin), .gitignore,
    stacks/Pulumi.<stack>.yaml (the required keys set and every other key commented with its
    default and why), node-image/*.lock.toml (the image build's download locks, seeded from
    kilonode's) and catalog/vm_sizes.yaml (VM sizes you add to kilonode's catalogue). Then:
    `cd DIR && kilonode validate <stack>`; STACK names resolve in the current project's stacks.
    docs/own-repository.md goes on from there to `pulumi up`.
    """
    # imported here: the model and its reference are the bulk of `--help`'s import time otherwise
    from kilonode.config.model import NAME_PATTERN
    from kilonode.config.reference import starter_stack

    cluster = name or re.sub(r"[^a-z0-9-]+", "-", directory.resolve().name.lower()).strip("-")
    if not re.fullmatch(NAME_PATTERN, cluster):
        die(f"{cluster!r} is not a valid cluster name (1-32 of a-z, 0-9 and '-', starting with a letter); "
            "pass --name")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stack):
        die(f"{stack!r} is not a valid stack name (letters, digits, '_', '.', '-'); pass another --stack")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        die(f"{directory} exists and is not an empty directory; choose a new one")
    version = _pyproject_version()
    requirement, vendored = _requirement(pin, version, wheel, git_url)
    files: dict[str, str | Path] = {
        "Pulumi.yaml": _project_yaml(cluster),
        "__main__.py": PROGRAM,
        "requirements.txt": requirement,
        ".gitignore": GITIGNORE,
        f"stacks/Pulumi.{stack}.yaml": starter_stack(cluster, stack),
        "catalog/vm_sizes.yaml": VM_SIZES,
    }
    files.update({f"node-image/{lock}": NODE_IMAGE_DIR / lock for lock in LOCK_FILES
                  if (NODE_IMAGE_DIR / lock).is_file()})
    if vendored is not None:
        files[f"{VENDOR}/{vendored.name}"] = vendored
    _write_project(directory, files)
    if vendored is not None and wheel is None:  # built here: its scratch folder (kilonode-wheel.*/dist/)
        shutil.rmtree(vendored.parent.parent, ignore_errors=True)
    for rel in files:
        out.print(f"  wrote {directory / rel}")
    out.print(f"[green]✓[/] project for cluster '{cluster}' in {directory}. Next: cd {directory} && "
              f"kilonode validate {stack}")


def _write_project(directory: Path, files: dict[str, str | Path]) -> None:
    """Written into a staging folder beside DIR and renamed: DIR holds the whole project or nothing."""
    staging: Path | None = None
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        for rel, content in files.items():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, staging / rel)
            else:
                (staging / rel).write_text(content, encoding="utf-8")
        os.chmod(staging, 0o755)
        if directory.exists():
            directory.rmdir()  # empty, checked above
        os.rename(staging, directory)
    except OSError as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        die(f"cannot create {directory}: {error.strerror or error}; nothing was written")


def _requirement(pin: PinKind, version: str, wheel: Path | None, git_url: str | None) -> tuple[str, Path | None]:
    """requirements.txt's text, and the wheel to copy into vendor/ (for --pin wheel). Every
    choice installs without kilonode on PyPI; the comment says which was taken and why."""
    if wheel is not None and pin is not PinKind.wheel:
        die(f"--wheel goes with --pin wheel, not --pin {pin.value}")
    if git_url is not None and pin is not PinKind.git:
        die(f"--git-url goes with --pin git, not --pin {pin.value}")
    raise_it = ("# Raise it deliberately: read kilonode's CHANGELOG.md for the new version, change the pin, then\n"
                "# run `kilonode diff --base <the commit before>` (docs/own-repository.md, Upgrading kilonode).\n")
    if pin is PinKind.git:
        url = git_url or _origin_url()
        return (f"# kilonode is not on PyPI. pip (and Pulumi's python runtime, which runs pip on this file) clones\n"
                f"# it at the release tag: every machine that installs needs git and read access to this URL,\n"
                f"# and the tag v{version} must exist there (the maintainer's `git tag -a v{version}`, pushed).\n"
                f"{raise_it}kilonode @ git+{url}@v{version}\n", None)
    if pin is PinKind.path:
        if REPO_ROOT is None:
            die("--pin path needs kilonode running from a source checkout (this one is installed from a wheel); "
                "use --pin wheel --wheel FILE or --pin git --git-url URL")
        return (f"# kilonode is not on PyPI. Installed from the checkout at {REPO_ROOT}: on THIS machine only, and\n"
                f"# whatever that checkout holds when pip runs (not a pinned version). For trying kilonode out;\n"
                f"# a repository that CI or a colleague uses needs `kilonode new --pin wheel` or `--pin git`.\n"
                f"{raise_it}kilonode @ {REPO_ROOT.as_uri()}\n", None)
    built = _checked_wheel(wheel, version) if wheel is not None else _build_wheel(version)
    return (f"# kilonode is not on PyPI: pip takes it from the wheel in {VENDOR}/ (commit that folder). pip reads\n"
            f"# --find-links relative to this file, so `pip install -r` and Pulumi's python runtime find it\n"
            f"# from any directory, with no index and no git access for kilonode itself (its dependencies\n"
            f"# come from your usual index). The version below is the wheel's: pip refuses another.\n"
            f"{raise_it}# Upgrading also replaces the wheel in {VENDOR}/ with the new version's.\n"
            f"--find-links {VENDOR}\nkilonode=={version}\n", built)


def _checked_wheel(wheel: Path, version: str) -> Path:
    """The wheel as given, refused unless it is this kilonode's version: the starter stack is
    written for the running kilonode, so the pin must install the same one."""
    match = re.fullmatch(r"kilonode-([^-]+)-.+\.whl", wheel.name)
    if not wheel.is_file() or match is None:
        die(f"--wheel {wheel}: not a kilonode wheel file (kilonode-<version>-py3-none-any.whl)")
    if match.group(1) != version:
        die(f"--wheel {wheel} is kilonode {match.group(1)}, and this kilonode is {version}: the starter stack is "
            f"written for {version}; run `kilonode new` from the kilonode that wheel installs, or pass its own wheel")
    return wheel


def _build_wheel(version: str) -> Path:
    """The wheel of the checkout this kilonode runs from, built offline (no index, no build
    isolation: setuptools from this environment) from a copy, so the checkout gets no build/."""
    if REPO_ROOT is None:
        die("--pin wheel needs the wheel this kilonode was installed from: pass --wheel FILE "
            "(or --pin git --git-url URL of your kilonode clone, which must carry the tag "
            f"v{version})")
    work = Path(tempfile.mkdtemp(prefix="kilonode-wheel."))
    source = work / "source"
    err.print(f"  building the kilonode {version} wheel from {REPO_ROOT} (pass --wheel FILE to use one you have)")
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "out", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache",
        ".hypothesis", "tests", "bench"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(work / "dist")],
                           capture_output=True, text=True, timeout=600, check=False)
    wheels = sorted((work / "dist").glob(f"kilonode-{version}-*.whl"))
    if built.returncode != 0 or len(wheels) != 1:
        die(f"could not build the wheel from {REPO_ROOT} ({(built.stderr or built.stdout).strip()[-600:]}); "
            "build it yourself (`pip wheel --no-deps .` there) and pass --wheel FILE")
    return wheels[0]


def _origin_url() -> str:
    """The checkout's `origin` remote: the default --git-url where kilonode runs from a clone."""
    found = None
    if REPO_ROOT is not None and (REPO_ROOT / ".git").exists():
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "remote", "get-url", "origin"],
                              capture_output=True, text=True, timeout=30, check=False)
        found = done.stdout.strip() if done.returncode == 0 else None
    if not found:
        die("--pin git needs --git-url URL: the clone of kilonode your machines can read, carrying the tag "
            "(no `origin` remote to take it from)")
    return found


def schema() -> None:
    """Print the stack file's JSON Schema (from kilonode's own model, with every key's reason).

    Point your editor at it for completion and checks, for example with the YAML language
    server: `# yaml-language-server: $schema=./kilonode-stack.schema.json` at the top of a stack
    file after `kilonode schema > kilonode-stack.schema.json`.
    """
    from kilonode.config.reference import stack_file_schema

    sys.stdout.write(json.dumps(stack_file_schema(), indent=2) + "\n")
