"""The same refusal on every command: each hostile stack file (tests/config/hostile/ and the ones
test_hostile_stacks makes) goes through every command that takes STACK and through the Pulumi
program's config entry, and each prints the very problem lines `validate` prints, exits 2 and
writes nothing (no output folder, the stack file untouched). One loader and one set of checks
(kilonode.cli.common.load_and_plan, kilonode.config.load.program_stack) is what makes them agree.

The whole corpus on every command is slow (about 200 files x 9 commands); the fast suite runs a
sample of every class. `kilonode diff` is in tests/review/test_hostile_diff.py (it needs a git
repository and renders the base).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pulumi
import pytest

from kilonode.azure.mockplan import run_program
from kilonode.config import load_stack
from kilonode.problems import StackError
from tests.config.test_hostile_stacks import CASES, MAX_OUTPUT, Case
from tests.test_cli_errors import run_main

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# Every command that takes STACK (kilonode.cli.COMMANDS), with what it needs to run; OUT is a
# folder it would write. `local up` is left out: it starts etcd and a VM once a stack loads.
COMMANDS = {
    "validate": ["validate", "STACK"],
    "render": ["render", "STACK", "--out", "OUT"],
    "explain": ["explain", "STACK"],
    "plan": ["plan", "STACK"],
    "preflight": ["preflight", "STACK"],
    "fleet": ["fleet", "STACK", "--nodes", "10", "--out", "OUT"],
    "allocate": ["allocate", "STACK"],
    "image-build": ["image", "build", "STACK", "--pool", "cpu", "--out", "OUT"],
    "gpu-nccl-job": ["gpu", "nccl-job", "STACK", "--pool", "cpu"],
}
# One file of each class in the fast suite, the reading classes included.
SAMPLE = {"billion-laughs", "alias-bomb-wide", "duplicate-key-pool", "merge-key", "python-tag", "multiple-documents",
          "huge-value", "latin-1", "zero-bytes", "mount-point-pool-newline", "sysctl-core-pattern-pipe",
          "label-reserved-kilonode-pool", "type-nodes-float", "read-bool-yes-label-value", "read-octal-0o",
          "read-exponent-nodes", "read-timestamp-expires", "read-secure-label-map", "read-environment",
          "read-key-number-and-text", "read-huge-int-quota", "read-check-system-pool-missing"}


def _sampled(case: Case) -> object:
    return pytest.param(case, id=case.name, marks=() if case.name in SAMPLE else pytest.mark.slow)


def problem_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if not line.startswith("kilonode: ")]


@pytest.mark.parametrize("case", [_sampled(case) for case in CASES])
def test_every_command_refuses_a_hostile_file_with_the_same_lines_and_writes_nothing(
        case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    stack = case.write(tmp_path)
    before = stack.read_bytes()
    code, output = run_main(["validate", str(stack)], capsys, monkeypatch)
    assert code == 2 and len(output.encode()) < MAX_OUTPUT, output[:2000]
    expected = problem_lines(output)
    assert expected
    for name, argv in COMMANDS.items():
        out = tmp_path / f"out-{name}"
        args = [str(stack) if part == "STACK" else str(out) if part == "OUT" else part for part in argv]
        code, output = run_main(args, capsys, monkeypatch)
        assert code == 2, f"{name}: {output[:2000]}"
        assert problem_lines(output) == expected, f"{name} printed other lines:\n{output[:2000]}"
        assert not out.exists(), f"{name} wrote {out}"
        assert stack.read_bytes() == before, f"{name} changed the stack file"
    assert list(tmp_path.iterdir()) in ([stack], []), sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("case", [_sampled(case) for case in CASES])
def test_the_pulumi_program_refuses_a_hostile_file_with_the_same_lines(
        case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The program reads its stack file with the same loader (program_stack) before it looks
    at what Pulumi made of it: the file's own value where it loads (a file refused only once
    planned), else nothing (Pulumi itself refuses many of these files)."""
    from kilonode.azure.program import main

    stack = case.write(tmp_path)
    _, output = run_main(["validate", str(stack)], capsys, monkeypatch)
    try:
        value = load_stack(str(stack)).raw
    except StackError:
        value = {}
    program = functools.partial(main, require_recorded_addresses=False, stack_file=stack)
    with pytest.raises(pulumi.RunError) as refused:
        run_program(stack.name.removeprefix("Pulumi.").removesuffix(".yaml"), value, program)
    text = str(refused.value)
    assert len(text.encode()) < MAX_OUTPUT and "Traceback" not in text
    assert problem_lines(text) == problem_lines(output)
