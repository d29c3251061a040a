"""`kilonode diff` on a pull request that brings a hostile stack file: the head's stack is read by
the loader every command uses (in the head's snapshot), and the review ends as `validate` would:
the same problem lines, exit 2, nothing written (no report, no --write-json file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config.test_hostile_stacks import HOSTILE_DIR, MAX_OUTPUT, PROBLEM_LINE
from tests.config.test_reading import text_bomb
from tests.review.conftest import change
from tests.test_cli_errors import run_main

pytestmark = pytest.mark.slow  # each review renders and records the base in a child process


def _where(lines: list[str]) -> list[tuple[str, str, str]]:
    """(line, field, message) of each problem line: the file's path differs (a scratch checkout)."""
    found = []
    for line in lines:
        match = PROBLEM_LINE.match(line)
        assert match, line
        found.append((match["line"], match["path"], match["message"]))
    return found


@pytest.mark.parametrize("hostile", ["read-bool-yes-label-value", "read-timestamp-expires", "billion-laughs",
                                     "read-check-system-pool-missing", "text-bomb"])
def test_a_pull_request_with_a_hostile_stack_file_is_refused_with_validates_lines(
        repo: Path, hostile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = text_bomb("zones") if hostile == "text-bomb" else (HOSTILE_DIR / f"{hostile}.yaml").read_text()
    copy = tmp_path / "Pulumi.local.yaml"
    copy.write_text(text)
    _, expected = run_main(["validate", str(copy)], capsys, monkeypatch)

    def bring(root: Path) -> None:
        (root / "stacks" / "Pulumi.local.yaml").write_text(text)

    branch = change(repo, f"hostile-{hostile}", bring, f"a hostile stack file: {hostile}")
    monkeypatch.chdir(repo)
    report = tmp_path / "diff.json"
    code, output = run_main(["diff", "--base", "main", "--head", branch, "--stack", "local", "--write-json",
                             str(report)], capsys, monkeypatch)
    assert code == 2, output[-2000:]
    refusal = output[output.index("kilonode: "):] if "kilonode: " in output else output
    assert len(refusal.encode()) < MAX_OUTPUT, refusal[:2000]
    lines = [line for line in refusal.splitlines() if not line.startswith(("kilonode: ", "  "))]
    assert all(line.startswith("stacks/Pulumi.local.yaml:") for line in lines), lines
    assert _where(lines) == _where([line for line in expected.splitlines() if not line.startswith("kilonode: ")])
    assert not report.exists()
