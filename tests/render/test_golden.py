"""tests/golden/<stack>/ is exactly what `kilonode render <stack>` writes."""

from __future__ import annotations

import difflib

import pytest

from kilonode.render.golden import GOLDEN_DIR, rendered
from tests.conftest import SHIPPED_STACKS


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_rendered_tree_matches_golden_files(stack: str) -> None:
    expected_dir = GOLDEN_DIR / stack
    tree = rendered(stack)
    on_disk = {str(p.relative_to(expected_dir)) for p in expected_dir.rglob("*") if p.is_file()}
    problems: list[str] = []
    for path in sorted(on_disk - tree.keys()):
        problems.append(f"stale golden file (render no longer writes it): {path}")
    for path, file in tree.items():
        golden = expected_dir / path
        if not golden.is_file():
            problems.append(f"missing golden file: {path}")
            continue
        old = golden.read_text()
        if old != file.content:
            problems.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), file.content.splitlines(keepends=True),
                f"golden/{stack}/{path}", f"rendered/{stack}/{path}",
            )))
        elif golden.stat().st_mode & 0o777 != file.mode:
            problems.append(f"mode of {path}: golden {golden.stat().st_mode & 0o777:o}, rendered {file.mode:o}")
    assert not problems, "\n".join(problems) + "\n\nIf the change is intended, run `make golden` and commit."


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_golden_files_are_readable_text_without_base64_blobs(stack: str) -> None:
    for path in (GOLDEN_DIR / stack).rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "base64" not in text.lower(), path
            assert all(len(line) < 400 for line in text.splitlines()), path
