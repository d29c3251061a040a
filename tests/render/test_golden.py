"""tests/golden/<stack>/ is exactly what `kilonode render <stack>` writes, and under in-cluster/
the Kubernetes objects the program creates (tests/golden/update.py, `make golden`)."""

from __future__ import annotations

import difflib
import re

import pytest
import yaml

from kilonode.azure.graph import Graph
from kilonode.render import USER_DATA
from tests.conftest import SHIPPED_STACKS
from tests.golden.update import GOLDEN_DIR, VARIANTS, VARIANTS_DIR, expected, variant_expected

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_rendered_tree_matches_golden_files(graphs: dict[str, Graph], stack: str) -> None:
    expected_dir = GOLDEN_DIR / stack
    tree = expected(stack, graphs[stack])
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
        # git keeps only the executable bit of a file (a 0600 golden checks out 0644); the whole
        # mode is in the role's user-data write_files, which is compared as content above
        elif golden.stat().st_mode & 0o111 != file.mode & 0o111:
            problems.append(f"mode of {path}: golden {golden.stat().st_mode & 0o777:o}, rendered {file.mode:o}")
    assert not problems, "\n".join(problems) + "\n\nIf the change is intended, run `make golden` and commit."


# A line of nothing but the base64 alphabet, 60 characters or more: an encoded blob folded
# into lines (PEM's 64, MIME's and `base64`'s 76, a YAML !!binary block's).
BASE64_LINE = re.compile(r"^\s*[A-Za-z0-9+/]{60,}={0,2}\s*$", re.M)


NAME_ALTERNATION = re.compile(r"\s*regex: [A-Za-z_:][A-Za-z0-9_:]*(\|[A-Za-z_:][A-Za-z0-9_:]*)+")


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_golden_files_are_readable_text_without_base64_blobs(stack: str) -> None:
    files = [path for path in (GOLDEN_DIR / stack).rglob("*") if path.is_file()]
    assert len(files) > 20, f"{GOLDEN_DIR / stack}: {len(files)} files"
    for path in files:
        text = path.read_bytes().decode("utf-8")  # not text: UnicodeDecodeError
        # a long line is unreadable, except a relabelling regex that is an alternation of metric names (the
        # exporters' keep lists: each name readable, the list one value Prometheus reads whole)
        assert all(len(line) < 400 or NAME_ALTERNATION.fullmatch(line) for line in text.splitlines()), path
        assert BASE64_LINE.findall(text) == [], path
        if path.name == USER_DATA:
            # cloud-init would decode it (encoding: b64, gz+b64, ...), or YAML (!!binary): not readable here
            written = yaml.safe_load(text)["write_files"]
            assert [f["path"] for f in written if "encoding" in f or not isinstance(f["content"], str)] == [], path


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_variants_files_that_differ_from_its_stack_match_golden_files(graphs: dict[str, Graph],
                                                                         variant: str) -> None:
    """tests/golden/variants/<variant>/: what the variant changes against its shipped stack
    (`make golden` writes it too)."""
    expected_dir = VARIANTS_DIR / variant
    tree = variant_expected(variant, shipped_graph=graphs[VARIANTS[variant][0]])
    on_disk = {str(p.relative_to(expected_dir)) for p in expected_dir.rglob("*") if p.is_file()}
    problems = [f"stale golden file: {path}" for path in sorted(on_disk - tree.keys())]
    for path, file in tree.items():
        golden = expected_dir / path
        if not golden.is_file():
            problems.append(f"missing golden file: {path}")
        elif golden.read_text() != file.content:
            problems.append("".join(difflib.unified_diff(
                golden.read_text().splitlines(keepends=True), file.content.splitlines(keepends=True),
                f"golden/variants/{variant}/{path}", f"rendered/{variant}/{path}")))
    assert not problems, "\n".join(problems) + "\n\nIf the change is intended, run `make golden` and commit."
