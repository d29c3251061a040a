"""The git side of a review: resolve the refs, find the stacks a change touches, and take a
snapshot of each side with that side's own code (what rendering reads at the ref, unpacked
into a scratch folder; the working tree itself for the head when no --head is given).

Both snapshots run at once, as child processes: each imports its side's `kilonode` package
(PYTHONPATH starts with that side's infra/), so nothing of one side's code leaks into the
other's. A side whose inputs were snapshotted before is read from the cache instead
(kilonode.review.snapcache): no checkout, no child.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilonode.review import snapcache
from kilonode.review import snapshot as snapshot_module

# A change under these paths is a change to the toolkit: it may change every stack. In a user's
# project (`kilonode new`: no infra/kilonode/) the toolkit is the installed kilonode, which
# requirements.txt pins, with the project's own locks (node-image/) and VM sizes (catalog/).
TOOLKIT = ("infra/", "templates/", "sysctl/", "node-image/", "pyproject.toml", "Pulumi.yaml",
           "catalog/", "requirements.txt")
# What rendering reads at a ref: all a side's checkout holds, and what its snapshot is cached by.
INPUTS = (*TOOLKIT, "stacks/")
STACK_FILE = re.compile(r"^stacks/Pulumi\.(?P<name>[^/]+)\.ya?ml$")
SNAPSHOT_TIMEOUT_S = 600


class ReviewError(Exception):
    """A review that cannot be made: a bad ref, not a git checkout, a side that failed."""


@dataclass(frozen=True)
class Side:
    label: str  # base | head
    ref: str  # as given, or "working tree"
    commit: str | None  # None: the working tree


def git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False, timeout=120)
    except FileNotFoundError:
        raise ReviewError("git is not installed; kilonode diff reads the refs with it") from None
    if done.returncode != 0:
        raise ReviewError(f"git {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def toplevel(start: Path) -> Path:
    try:
        return Path(git(start, "rev-parse", "--show-toplevel").strip())
    except ReviewError:
        raise ReviewError(f"{start} is not inside a git checkout: run kilonode diff in a clone of your "
                          "cluster repository") from None


def resolve(repo: Path, ref: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except ReviewError:
        raise ReviewError(f"{ref!r} names no commit in {repo} (a branch, tag, commit or HEAD~1; in a CI "
                          "checkout, fetch the base first: `git fetch origin main`)") from None


def changed_paths(repo: Path, base: str, head: str | None) -> list[str]:
    """Paths that differ between base and head (head None: the working tree, untracked files
    included)."""
    if head is None:
        paths = git(repo, "diff", "--name-only", base).splitlines()
        paths += git(repo, "ls-files", "--others", "--exclude-standard").splitlines()
    else:
        paths = git(repo, "diff", "--name-only", base, head).splitlines()
    return sorted(set(p for p in paths if p))


def stacks_at(repo: Path, commit: str | None) -> set[str]:
    if commit is None:
        files = [p.name for p in (repo / "stacks").glob("Pulumi.*.y*ml")]
    else:
        files = [Path(p).name for p in git(repo, "ls-tree", "--name-only", commit, "stacks/").splitlines()]
    return {m.group("name") for f in files if (m := STACK_FILE.match(f"stacks/{f}"))}


def affected(paths: Sequence[str], known: set[str]) -> tuple[list[str], str]:
    """The stacks a change touches, and why: every stack for a change to the toolkit, else
    the stacks whose files changed."""
    toolkit = [p for p in paths if p.startswith(TOOLKIT)]
    if toolkit:
        more = f" and {len(toolkit) - 1} more" if len(toolkit) > 1 else ""
        return sorted(known), f"the toolkit changed ({toolkit[0]}{more}): every stack"
    named = sorted({m.group("name") for p in paths if (m := STACK_FILE.match(p))})
    if named:
        return named, "their stack files changed"
    return [], "no stack file and no toolkit file changed"


@contextlib.contextmanager
def checkout(repo: Path, commit: str, scratch: Path) -> Iterator[Path]:
    """The INPUTS at `commit` in a folder of their own, removed afterwards whatever happens:
    `git archive` of those paths, unpacked. Unlike a worktree nothing is registered in the
    repository (no add, remove and prune: about 2 s of a review's wall time), and the child
    sees exactly what its snapshot is cached by."""
    path = scratch / f"tree-{commit[:12]}"
    top = set(git(repo, "ls-tree", "--name-only", "-z", commit).split("\0"))
    present = [p for p in INPUTS if p.rstrip("/") in top]
    try:
        done = subprocess.run(["git", "archive", "--format=tar", commit, "--", *present], cwd=repo,
                              capture_output=True, check=False, timeout=120)
    except FileNotFoundError:
        raise ReviewError("git is not installed; kilonode diff reads the refs with it") from None
    if done.returncode != 0:
        raise ReviewError(f"git archive {commit}: {done.stderr.decode(errors='replace').strip()}")
    path.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:") as archive:
            # "data": nothing lands outside the folder, whatever the commit holds
            archive.extractall(path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def rendered_inputs(repo: Path, commit: str | None) -> list[str] | None:
    """Each file under INPUTS at `commit` (None: the working tree, untracked files included)
    as "<mode> <git blob id> <path>": the same lines for a commit and for a working tree with
    the same content. None where the working tree holds something else than files and links
    under INPUTS (a nested repository): its content is unknown, so nothing is cached."""
    if commit is not None:
        lines = []
        for record in filter(None, git(repo, "ls-tree", "-r", "-z", commit, "--", *INPUTS).split("\0")):
            meta, _, path = record.partition("\t")
            mode, _, oid = meta.split(" ")
            lines.append(f"{mode} {oid} {path}")
        return lines
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *INPUTS)
    lines = []
    for path in sorted(set(filter(None, listed.split("\0")))):
        line = _working_file(repo / path, path)
        if line is None:
            return None
        if line:
            lines.append(line)
    return lines


def _working_file(file: Path, path: str) -> str | None:
    """A working-tree file's line as `git ls-tree -r` prints it once committed: the blob id
    is sha1 over "blob <size>\\0" and the content (~10 ms for the 2 MB under INPUTS; git
    hash-object would be a child per call, or an object written per file). "" for a file
    deleted since it was staged; None for neither a file nor a link, or one that cannot be read
    (the child will say why, if it reads it)."""
    try:
        info = file.lstat()
        if stat.S_ISLNK(info.st_mode):
            mode, data = "120000", os.fsencode(os.readlink(file))
        elif stat.S_ISREG(info.st_mode):
            mode, data = ("100755" if info.st_mode & stat.S_IXUSR else "100644"), file.read_bytes()
        else:
            return None
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
    return f"{mode} {blob} {path}"


def is_project(tree: Path) -> bool:
    """A user's project (what `kilonode new` makes), not kilonode's own source tree."""
    return (tree / "Pulumi.yaml").is_file() and (tree / "stacks").is_dir() and \
        not (tree / "infra" / "kilonode" / "__init__.py").is_file()


def pin_note(repo: Path, base: str, head: str | None) -> str | None:
    """In a user's project, what to know when requirements.txt (the kilonode pin) changed
    between the refs: both sides render with the installed kilonode, so the review shows the
    stacks' changes under one version, not what the upgrade itself changes. None otherwise."""
    def pinned(commit: str | None) -> str:
        if commit is None:
            file = repo / "requirements.txt"
            return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else ""
        try:
            return git(repo, "show", f"{commit}:requirements.txt")
        except ReviewError:  # no requirements.txt at that commit
            return ""

    def kilonode_line(text: str) -> str:
        return next((line.strip() for line in text.splitlines() if line.strip().lower().startswith("kilonode")),
                    "no kilonode line")

    before, after = pinned(base), pinned(head)
    if not is_project(repo) or before == after:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("kilonode")
    except PackageNotFoundError:
        installed = "unknown"
    return (f"requirements.txt changed between the refs ({kilonode_line(before)} -> {kilonode_line(after)}): "
            f"both sides were rendered with the installed kilonode ({installed}), so this report shows what the "
            "stacks' own changes do under that version, not what the upgrade changes. To see the upgrade: install "
            "the base's pin, run `kilonode diff --base REF --write-json base.json` there and compare, or upgrade in "
            "a change of its own with no stack edits and check it with `pulumi preview`")


def _command(tree: Path, out: Path, stacks: Sequence[str],
             label: str) -> tuple[list[str], dict[str, str]]:
    # Each side imports its own tree's package: infra/ holds it as kilonode/, so infra/ goes first
    # on the path (before the installed kilonode, which is this side's or another checkout's).
    package = tree / "infra" / "kilonode"
    if (package / "__init__.py").is_file():
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(tree / "infra"), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "PYTHONDONTWRITEBYTECODE": "1"}
    elif is_project(tree):
        # a user's project: its code is the installed kilonode (this process's), the same on both
        # sides; the child runs in the side's tree, so it reads that side's stacks, locks and sizes
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    else:
        raise ReviewError(f"the {label} side holds neither kilonode's source (infra/kilonode/) nor a kilonode "
                          "project at the repository's root (Pulumi.yaml beside stacks/, as `kilonode new` makes "
                          "it): review against a base where the repository already had that layout")
    args = [sys.executable, str(Path(snapshot_module.__file__)), "--out", str(out)]
    for name in stacks:
        args += ["--stack", name]
    return args, env


def snapshots(repo: Path, sides: Sequence[tuple[Side, Sequence[str]]],
              progress: Callable[[str], None] = lambda _: None, cache: bool = True,
              meanwhile: Callable[[], None] = lambda: None) -> dict[str, dict[str, Any]]:
    """Each side's snapshot of its stacks: read from the cache where the same inputs were
    snapshotted before (unless cache is False), else taken in parallel, one child per distinct
    key (a base and a head with the same inputs are taken once), and then cached. `meanwhile`
    runs while the children do (or at once, when every side is cached)."""
    keys = {side.label: _key(repo, side, stacks) if cache else None for side, stacks in sides}
    found: dict[str, dict[str, Any]] = {}
    for side, _ in sides:
        entry = keys[side.label]
        if entry is not None and (hit := snapcache.load(entry)) is not None:
            found[side.label] = hit
            progress(f"{side.label} ({side.ref}): read from the cache, {snapcache.directory()}")
    missing = [(side, stacks) for side, stacks in sides if side.label not in found]
    taker: dict[str, str] = {}  # side -> the side whose child's output it reads (its own, or one with its key)
    by_key: dict[str, str] = {}
    for side, _ in missing:
        entry = keys[side.label]
        taker[side.label] = side.label if entry is None else by_key.setdefault(entry, side.label)
    takes = [(side, stacks) for side, stacks in missing if taker[side.label] == side.label]
    taken = _take(repo, takes, progress, meanwhile) if takes else {}
    if not takes:
        meanwhile()
    for side, _ in missing:
        body = taken[taker[side.label]]
        found[side.label] = json.loads(body)  # parsed per side: neither shares the other's objects
        entry = keys[side.label]
        if entry is not None and taker[side.label] == side.label:
            snapcache.store(entry, body)
    return found


def _key(repo: Path, side: Side, stacks: Sequence[str]) -> str | None:
    inputs = rendered_inputs(repo, side.commit)
    return None if inputs is None else snapcache.key(inputs, stacks)


def _take(repo: Path, sides: Sequence[tuple[Side, Sequence[str]]], progress: Callable[[str], None],
          meanwhile: Callable[[], None] = lambda: None) -> dict[str, bytes]:
    """Each side's snapshot (its JSON as the child wrote it), taken in parallel: a child per
    side, in that side's checkout (the working tree itself for a head without a commit)."""
    with tempfile.TemporaryDirectory(prefix="kilonode-diff-") as tmp, contextlib.ExitStack() as trees:
        scratch = Path(tmp)
        running: dict[str, tuple[subprocess.Popen[str], Path, float]] = {}
        for side, stacks in sides:
            tree = repo if side.commit is None else trees.enter_context(checkout(repo, side.commit, scratch))
            out = scratch / f"{side.label}.json"
            args, env = _command(tree, out, stacks, side.label)
            progress(f"rendering and recording {len(stacks)} stack(s) at {side.label} ({side.ref}) ...")
            running[side.label] = (subprocess.Popen(args, cwd=tree, env=env, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True), out, time.monotonic())
        meanwhile()
        found: dict[str, bytes] = {}
        for label, (process, out, started) in running.items():
            try:
                _, err = process.communicate(timeout=SNAPSHOT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise ReviewError(f"the {label} side took over {SNAPSHOT_TIMEOUT_S} s and was stopped") from None
            if process.returncode != 0 or not out.is_file():
                tail = "\n".join(err.strip().splitlines()[-12:])
                raise ReviewError(f"the {label} side could not be rendered (exit {process.returncode}; does its code "
                                  f"predate kilonode.review's entry points?):\n{tail}")
            found[label] = out.read_bytes()
            progress(f"{label} done in {time.monotonic() - started:.1f} s")
        return found
