"""The review's snapshot cache (kilonode.review.snapcache) and what it is keyed by
(kilonode.review.refs.rendered_inputs): a hit reviews byte for byte as a miss does, any change
to what rendering reads misses, a damaged entry is ignored and replaced, --no-cache neither
reads nor writes. The key and storage tests use a small hand-made repository; the reviews
render `local` (slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kilonode.review import refs, review, snapcache
from kilonode.review.refs import INPUTS, checkout, rendered_inputs
from kilonode.review.report import to_json
from tests.review.conftest import change, edit_stack, git

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of this test's own (the child processes inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "kilonode" / "diff"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A repository with a file under each kind of input, and docs, committed."""
    root = tmp_path / "small"
    for path, text in {"infra/kilonode/__init__.py": "", "templates/unit.j2": "a\n", "sysctl/base.yaml": "x: 1\n",
                       "node-image/recipe.toml": "v = 1\n", "pyproject.toml": "[project]\n",
                       "Pulumi.yaml": "name: k\n", "stacks/Pulumi.a.yaml": "config: {}\n",
                       "docs/readme.md": "hi\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / ".gitignore").write_text("*.log\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "add", "-A")
    git(root, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "base")
    return root


def key_now(repo: Path, stacks: tuple[str, ...] = ("a",)) -> str:
    inputs = rendered_inputs(repo, None)
    assert inputs is not None
    return snapcache.key(inputs, stacks)


def test_a_working_tree_keys_as_the_commit_with_its_content(small: Path) -> None:
    head = git(small, "rev-parse", "HEAD")
    assert rendered_inputs(small, None) == rendered_inputs(small, head)
    listed = {line.split(" ", 2)[2] for line in rendered_inputs(small, head) or []}
    assert "docs/readme.md" not in listed and {"pyproject.toml", "stacks/Pulumi.a.yaml"} <= listed


@pytest.mark.parametrize("edit", [
    "infra/kilonode/__init__.py", "templates/unit.j2", "sysctl/base.yaml", "node-image/recipe.toml",
    "pyproject.toml", "Pulumi.yaml", "stacks/Pulumi.a.yaml",
])
def test_a_change_to_any_input_misses(small: Path, edit: str) -> None:
    before = key_now(small)
    (small / edit).write_text((small / edit).read_text() + "# changed\n")
    assert key_now(small) != before


def test_new_deleted_and_executable_inputs_miss_docs_and_ignored_files_do_not(small: Path) -> None:
    before = key_now(small)
    (small / "docs" / "new.md").write_text("more\n")
    (small / "infra" / "debug.log").write_text("ignored\n")
    assert key_now(small) == before
    (small / "templates" / "new.j2").write_text("b\n")  # untracked, not ignored: rendering may read it
    untracked = key_now(small)
    assert untracked != before
    (small / "templates" / "new.j2").unlink()
    assert key_now(small) == before
    (small / "templates" / "unit.j2").chmod(0o755)
    assert key_now(small) != before
    (small / "templates" / "unit.j2").chmod(0o644)
    (small / "sysctl" / "base.yaml").unlink()
    assert key_now(small) != before


def test_a_working_tree_with_a_nested_repository_or_an_unreadable_input_is_not_cached(small: Path) -> None:
    nested = small / "templates" / "vendored"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "x.j2").write_text("x\n")
    git(nested, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "add", "-A")
    git(nested, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "x")
    assert rendered_inputs(small, None) is None  # git lists it as one entry, "templates/vendored/"
    shutil.rmtree(nested)
    assert rendered_inputs(small, None) is not None
    if os.geteuid() != 0:  # root reads anything
        (small / "sysctl" / "base.yaml").chmod(0)
        assert rendered_inputs(small, None) is None


def test_the_key_covers_the_stacks_and_the_installed_packages(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = key_now(small)
    assert key_now(small, ("a", "b")) != before and key_now(small, ("b",)) != before
    monkeypatch.setattr(snapcache, "_distributions", lambda: ["pulumi-99.0.0.dist-info"])
    assert key_now(small) != before


def test_a_checkout_holds_the_inputs_at_the_commit_and_nothing_else(small: Path, tmp_path: Path) -> None:
    head = git(small, "rev-parse", "HEAD")
    (small / "templates" / "unit.j2").write_text("uncommitted\n")
    with checkout(small, head, tmp_path / "scratch") as tree:
        files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
        assert (tree / "templates" / "unit.j2").read_text() == "a\n"
        assert files == sorted(line.split(" ", 2)[2] for line in rendered_inputs(small, head) or [])
        assert all(f.startswith(INPUTS) for f in files)
    assert not tree.exists()
    assert git(small, "worktree", "list").count("\n") == 0  # nothing registered in the repository


def body(**extra: object) -> bytes:
    from kilonode.review.snapshot import FORMAT

    return json.dumps({"format": FORMAT, "stacks": {}, **extra}, sort_keys=True).encode()


def test_an_entry_reads_back_and_a_damaged_one_is_ignored_and_removed(cache: Path) -> None:
    snapcache.store("k1", body(n=1))
    assert snapcache.load("k1") == json.loads(body(n=1))
    path = cache / "k1.json"
    for damage in (lambda b: b[:-10], lambda b: b.replace(b'"n": 1', b'"n": 2'), lambda b: b"", lambda b: b"\0" * 40):
        snapcache.store("k1", body(n=1))
        path.write_bytes(damage(path.read_bytes()))
        assert snapcache.load("k1") is None
        assert not path.exists()
    snapcache.store("k2", json.dumps({"format": "another", "stacks": {}}).encode())  # whole, but not this format
    assert snapcache.load("k2") is None
    assert snapcache.load("absent") is None
    assert not list(cache.glob("*.tmp"))


def test_only_the_newest_entries_are_kept(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as writing:
        writing.setattr(snapcache, "prune", lambda: None)
        for i in range(snapcache.KEPT + 3):
            snapcache.store(f"k{i}", body(n=i))
            os.utime(cache / f"k{i}.json", (1_000_000 + i, 1_000_000 + i))
    (cache / ".dead.1.tmp").write_bytes(b"half")
    os.utime(cache / ".dead.1.tmp", (1, 1))
    snapcache.load("k0")  # used: kept over older ones
    snapcache.prune()
    kept = {p.stem for p in cache.glob("*.json")}
    assert len(kept) == snapcache.KEPT and "k0" in kept
    assert not {"k1", "k2", "k3"} & kept and "k4" in kept and not (cache / ".dead.1.tmp").exists()


def same(a: str, b: str) -> bool:
    """Two JSON reports, equal but for how long each took."""
    first, second = json.loads(a), json.loads(b)
    first.pop("seconds"), second.pop("seconds")
    return bool(first == second)


def no_child(*_: object) -> dict[str, bytes]:
    raise AssertionError("a side was rendered")


@pytest.mark.slow
def test_a_hit_reviews_as_a_miss_and_a_damaged_entry_is_replaced(repo: Path, cache: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    branch = change(repo, "cached", edit_stack("local", lambda c: c.setdefault("sysctl", {}).setdefault(
        "overrides", {}).update({"net.ipv4.neigh.default.gc_thresh3": 120000})), "raise gc_thresh3")
    missed: list[str] = []
    first = to_json(review(repo, "main", branch, progress=missed.append))
    assert sum("rendering and recording" in line for line in missed) == 2
    entries = sorted(cache.glob("*.json"))
    assert len(entries) == 2
    hit: list[str] = []
    with monkeypatch.context() as cached:
        cached.setattr(refs, "_take", no_child)  # neither a checkout nor a child process
        second = review(repo, "main", branch, progress=hit.append)
    assert sum("read from the cache" in line for line in hit) == 2
    assert same(first, to_json(second)) and second.risks and second.changed
    damaged = entries[0]
    damaged.write_bytes(damaged.read_bytes()[:1000])
    again: list[str] = []
    third = to_json(review(repo, "main", branch, progress=again.append))
    assert sum("rendering and recording" in line for line in again) == 1
    assert same(first, third)
    assert snapcache.load(damaged.stem) is not None  # rewritten whole


@pytest.mark.slow
def test_no_cache_neither_reads_nor_writes(repo: Path, cache: Path) -> None:
    """--no-cache on the command line, with both sides in the cache: both rendered again, the
    entries neither read (a read marks them used) nor rewritten; the same report."""
    branch = change(repo, "uncached", edit_stack("local", lambda c: c["etcd"]["main"].update(
        {"vmSize": "Standard_D8ds_v5"})), "bigger etcd VMs")
    cached = to_json(review(repo, "main", branch))
    entries = sorted(cache.glob("*.json"))
    assert len(entries) == 2
    for path in entries:
        os.utime(path, (1_000_000, 1_000_000))
    before = {path: (path.stat().st_ino, path.stat().st_mtime) for path in entries}
    args = [sys.executable, "-m", "kilonode.cli", "diff", "--base", "main", "--head", branch, "--format", "json"]
    fresh = subprocess.run([*args, "--no-cache"], cwd=repo, capture_output=True, text=True, timeout=300,
                           check=False)
    assert fresh.returncode == 0, fresh.stderr
    assert "read from the cache" not in fresh.stderr and fresh.stderr.count("rendering and recording") == 2
    assert {path: (path.stat().st_ino, path.stat().st_mtime) for path in cache.glob("*.json")} == before
    assert same(fresh.stdout, cached)
