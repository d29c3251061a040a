"""The host-file half of tests/golden/<stack>/: exactly what `kilonode render <stack>` writes.
`make golden` (kilonode.golden) regenerates both halves."""

from __future__ import annotations

from pathlib import Path

from kilonode.config import load_stack
from kilonode.config.reference import REFERENCE_DOC, reference_markdown
from kilonode.paths import REPO_ROOT
from kilonode.plan import plan_stack
from kilonode.render.cluster import render_tree
from kilonode.render.files import RenderedFile
from kilonode.render.write import with_marker

GOLDEN_DIR = (REPO_ROOT or Path.cwd()) / "tests" / "golden"  # a checkout-only command


def rendered(stack_name: str) -> dict[str, RenderedFile]:
    """What `kilonode render <stack>` writes, its marker included."""
    stack = load_stack(stack_name)
    return with_marker(render_tree(stack.config, plan_stack(stack)), stack_name)


def regenerate_reference() -> Path:
    """docs/stack-reference.md, from the model (kilonode.config.reference)."""
    target = (REPO_ROOT or Path.cwd()) / REFERENCE_DOC
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(reference_markdown(), encoding="utf-8")
    return target
