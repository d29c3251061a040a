"""`kilonode diff` in a user's project (what `kilonode new` makes, in a repository of its own):
both sides render with the installed kilonode, and a changed pin is said plainly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.review import ReviewError, review

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

runner = CliRunner()
GIT = ["git", "-c", "user.email=test@example.invalid", "-c", "user.name=test", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, timeout=60)


def scaffold(folder: Path) -> Path:
    made = runner.invoke(app, ["new", str(folder), "--pin", "path", "--stack", "dev"])
    assert made.exit_code == 0, made.output
    return folder


@pytest.mark.slow  # renders and records the stack at both refs (~6 s each, in parallel)
def test_a_stack_change_and_a_pin_change_are_reviewed(tmp_path: Path) -> None:
    project = scaffold(tmp_path / "clusters")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "scaffold")
    stack = project / "stacks" / "Pulumi.dev.yaml"
    stack.write_text(stack.read_text().replace("vmSize: Standard_D4ds_v5\n", "vmSize: Standard_D8ds_v5\n"))
    requirements = project / "requirements.txt"
    requirements.write_text(requirements.read_text() + "# raised\n")
    lines: list[str] = []
    result = review(project / "stacks", "HEAD", None, (), progress=lines.append, cache=False)
    assert result.stacks == ["dev"] and "requirements.txt" in result.why
    [diff] = result.diffs
    assert diff.changed
    assert any(r.rule == "pool-resized" for r in result.risks)
    [note] = [n for n in result.notes if n.startswith("requirements.txt changed between the refs")]
    assert "both sides were rendered with the installed kilonode" in note and note in lines


def test_a_project_in_a_subfolder_is_refused_saying_why(tmp_path: Path) -> None:
    project = scaffold(tmp_path / "repo" / "clusters")
    git(tmp_path / "repo", "init", "-q")
    git(tmp_path / "repo", "add", "-A")
    git(tmp_path / "repo", "commit", "-q", "-m", "scaffold")
    with pytest.raises(ReviewError, match="is a kilonode project in a subfolder of the repository"):
        review(project, "HEAD")


def test_a_base_before_the_project_is_refused_saying_why(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README.md").write_text("clusters\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "readme")
    scaffold(tmp_path / "scaffold")
    for entry in (tmp_path / "scaffold").iterdir():
        entry.rename(repo / entry.name)
    with pytest.raises(ReviewError, match=r"the base side holds neither kilonode's source .* nor a kilonode project"):
        review(repo, "HEAD", cache=False)
