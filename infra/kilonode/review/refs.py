"""The git side of a review: resolve the refs, find the stacks a change touches, and take a
snapshot of each side with that side's own code (a detached worktree per ref; the working
tree itself for the head when no --head is given).

Both snapshots run at once, as child processes: each imports its side's `kilonode` package
(PYTHONPATH points at a link to that side's infra/), so nothing of one side's code leaks into
the other's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilonode.review import snapshot as snapshot_module

# A change under these paths is a change to the toolkit: it may change every stack.
TOOLKIT = ("infra/", "templates/", "sysctl/", "node-image/", "pyproject.toml", "Pulumi.yaml")
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
def worktree(repo: Path, commit: str, scratch: Path) -> Iterator[Path]:
    """A detached worktree of `commit`, removed afterwards whatever happens."""
    path = scratch / f"tree-{commit[:12]}"
    git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        yield path
    finally:
        with contextlib.suppress(ReviewError):
            git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(ReviewError):
            git(repo, "worktree", "prune")


def _command(tree: Path, out: Path, stacks: Sequence[str],
             label: str) -> tuple[list[str], dict[str, str]]:
    # Each side imports its own tree's package: infra/ holds it as kilonode/, so infra/ goes first
    # on the path (before the installed kilonode, which is this side's or another checkout's).
    package = tree / "infra" / "kilonode"
    if not (package / "__init__.py").is_file():
        raise ReviewError(f"the {label} side has no infra/kilonode/ package: its commit predates the layout where "
                          "the package folder is named kilonode; review against a base from after that change")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tree / "infra"), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    args = [sys.executable, str(Path(snapshot_module.__file__)), "--out", str(out)]
    for name in stacks:
        args += ["--stack", name]
    return args, env


def snapshots(repo: Path, sides: Sequence[tuple[Side, Sequence[str]]],
              progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    """Each side's snapshot of its stacks, taken in parallel."""
    with tempfile.TemporaryDirectory(prefix="kilonode-diff-") as tmp, contextlib.ExitStack() as trees:
        scratch = Path(tmp)
        running: dict[str, tuple[subprocess.Popen[str], Path, float]] = {}
        for side, stacks in sides:
            tree = repo if side.commit is None else trees.enter_context(worktree(repo, side.commit, scratch))
            out = scratch / f"{side.label}.json"
            args, env = _command(tree, out, stacks, side.label)
            progress(f"rendering and recording {len(stacks)} stack(s) at {side.label} ({side.ref}) ...")
            running[side.label] = (subprocess.Popen(args, cwd=tree, env=env, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True), out, time.monotonic())
        found: dict[str, dict[str, Any]] = {}
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
            found[label] = json.loads(out.read_text(encoding="utf-8"))
            progress(f"{label} done in {time.monotonic() - started:.1f} s")
        return found
