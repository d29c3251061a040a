"""Hostile stack files (tests/config/hostile/, plus a few made here that are too big to keep):
each is refused by `kilonode validate` with exit 2, one bounded line per problem naming the
file, the line and the exact field path its header expects, no traceback, and `kilonode render`
writes nothing.

A file's header says what it is and what must be reported:

    # why: <what the file does and where the value would land>
    # expect: <field path> @ <line>      (one line per problem; `(top level)` for the file itself)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kilonode.paths import EXAMPLE_STACKS_DIR
from tests.test_cli_errors import run_main

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

HOSTILE_DIR = Path(__file__).resolve().parent / "hostile"
# what a refusal may print at most, whatever the file holds
MAX_OUTPUT = 4096
PROBLEM_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<path>\S+|\(top level\)): (?P<message>.+)$")


@dataclass(frozen=True)
class Case:
    name: str
    expected: frozenset[tuple[str, int]]  # (field path, line)
    write: Callable[[Path], Path]  # writes the file into a folder, returns its path
    bounded: bool = False  # more problems than the output may show: the lines shown are some of them


def _expected(text: str) -> frozenset[tuple[str, int]]:
    found = re.findall(r"^# expect: (\S+|\(top level\)) @ (\d+)$", text, flags=re.MULTILINE)
    return frozenset((path, int(line)) for path, line in found)


def _kept(path: Path) -> Case:
    return Case(path.stem, _expected(path.read_text(encoding="utf-8", errors="replace")), lambda _folder: path)


def _made(name: str, content: bytes, expected: set[tuple[str, int]], bounded: bool = False) -> Case:
    def write(folder: Path) -> Path:
        target = folder / f"Pulumi.{name}.yaml"
        target.write_bytes(content)
        return target

    return Case(name, frozenset(expected), write, bounded)


LOCAL = (EXAMPLE_STACKS_DIR / "Pulumi.local.yaml").read_text(encoding="utf-8")


def line_of(text: str, marker: str) -> int:
    return 1 + text[: text.index(marker)].count("\n")


def _with(old: str, new: str) -> str:
    assert old in LOCAL
    return LOCAL.replace(old, new, 1)


NAME = "    name: local\n"
MANY_LABELS = _with("        podsPerNode: 8\n", "        podsPerNode: 8\n        labels:\n"
                    + "".join(f'          l{i}: "bad value {i}"\n' for i in range(10_000)))

MADE = [
    # 2 MiB of comments in front of a valid stack: refused before YAML reads a byte of it
    _made("huge-file", b"# padding\n" * 200_000 + LOCAL.encode(), {("(top level)", 1)}),
    # a 200 kB value in a file under the cap: its error shows ~80 characters of it
    _made("huge-value", _with(NAME, "    name: " + "a" * 200_000 + "\n").encode(), {("name", line_of(LOCAL, NAME))}),
    # (YAML takes keys up to 1,024 characters; a longer one is a syntax error)
    _made("huge-key", _with(NAME, NAME + "    " + "k" * 1000 + ": 1\n").encode(),
          {("k" * 77 + "...", line_of(LOCAL, NAME) + 1)}),
    # ten thousand bad labels: the output stays bounded
    _made("many-labels", MANY_LABELS.encode(), {
        (f"nodePools[0].labels.l{i}", line_of(MANY_LABELS, "        labels:") + 1 + i) for i in range(10_000)
    }, bounded=True),
    _made("zero-bytes", b"", {("(top level)", 1)}),
    _made("latin-1", _with(NAME, "    name: h\xf6stile\n").encode("latin-1"), {("(top level)", line_of(LOCAL, NAME))}),
]

CASES = [_kept(path) for path in sorted(HOSTILE_DIR.glob("*.yaml"))] + MADE


def test_the_corpus_covers_every_class() -> None:
    names = {case.name for case in CASES}
    for prefix in ("mount-point-", "device-", "sysctl-", "audit-log-path-", "auto-compaction-retention-", "label-",
                   "taint-", "type-", "boot-archive-", "preload-archive-", "kubernetes-version-", "duplicate-key-",
                   "merge-key", "alias", "billion-laughs", "huge-file", "huge-value", "empty-file",
                   "etcd-every-member-overridden", "etcd-override-outside-members", "image-replicas-capped"):
        assert any(name.startswith(prefix) for name in names), prefix
    assert all(case.expected for case in CASES), [case.name for case in CASES if not case.expected]
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_hostile_stack_file_is_refused_cleanly(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    stack = case.write(tmp_path)
    code, output = run_main(["validate", str(stack)], capsys, monkeypatch)
    assert code == 2, output
    assert len(output.encode()) < MAX_OUTPUT, output[:2000]
    problems = [line for line in output.splitlines() if not line.startswith("kilonode: ")]
    found = set()
    for line in problems:
        match = PROBLEM_LINE.match(line)
        assert match, f"not `file:line: path: message`: {line!r}"
        assert match["file"].endswith(stack.name), line
        found.add((match["path"], int(match["line"])))
    if case.bounded:
        assert found and found < case.expected and "more not shown" in output, output
    else:
        assert found == case.expected, output

    out = tmp_path / "out"
    code, output = run_main(["render", str(stack), "--out", str(out)], capsys, monkeypatch)
    assert code == 2, output
    assert not out.exists(), f"render wrote {sorted(p.name for p in out.iterdir())}"
