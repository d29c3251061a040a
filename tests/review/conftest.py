"""A temporary cluster repository for the review tests: the toolkit and the shipped stacks as
one commit on `main`, and helpers that add one commit per change on a branch of their own."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from kilonode.paths import REPO_ROOT
from kilonode.review.refs import TOOLKIT

# What a cluster repository holds: the toolkit and the stacks (tests and docs are not needed
# to render; they would only make the copy slower).
KEEP = (*TOOLKIT, "stacks/")  # what rendering needs: the toolkit and the stacks


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    assert REPO_ROOT is not None
    root = tmp_path_factory.mktemp("cluster-repo")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for path in listed:
        if path.startswith(KEEP) and (REPO_ROOT / path).is_file():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / path, root / path)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "reviewer@example.invalid")
    git(root, "config", "user.name", "kilonode tests")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base: the toolkit and the shipped stacks")
    yield root
    shutil.rmtree(root, ignore_errors=True)


Edit = Callable[[Path], None]


def change(repo: Path, branch: str, edit: Edit, message: str) -> str:
    """A branch off main with one commit made by `edit`; returns the branch."""
    git(repo, "checkout", "-q", "-B", branch, "main")
    edit(repo)
    git(repo, "commit", "-q", "-am", message)
    git(repo, "checkout", "-q", "main")
    return branch


def edit_stack(name: str, update: Callable[[dict], None]) -> Edit:
    """Change a stack's cluster value as a user would (the file re-serialised: comments go,
    which changes nothing rendered)."""
    def apply(repo: Path) -> None:
        path = repo / "stacks" / f"Pulumi.{name}.yaml"
        document = yaml.safe_load(path.read_text())
        update(document["config"]["kilonode:cluster"])
        path.write_text(yaml.safe_dump(document, sort_keys=False))
    return apply


def replace_text(path: str, old: str, new: str) -> Edit:
    def apply(repo: Path) -> None:
        file = repo / path
        text = file.read_text()
        assert old in text, f"{old!r} not in {path}"
        file.write_text(text.replace(old, new, 1))
    return apply


