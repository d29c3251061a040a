"""Regenerate tests/golden/<stack>/ for every shipped stack: `make golden`.

The golden trees are exactly what `kilonode render <stack>` writes, so a pull request
that changes a flag shows that one line changing.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from kilonode.config import available_stacks, load_stack
from kilonode.config.reference import REFERENCE_DOC, reference_markdown
from kilonode.paths import REPO_ROOT
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.render.cluster import render_tree
from kilonode.render.files import RenderedFile
from kilonode.render.write import with_marker, write_tree

GOLDEN_DIR = (REPO_ROOT or Path.cwd()) / "tests" / "golden"  # a checkout-only command


def rendered(stack_name: str) -> dict[str, RenderedFile]:
    """What `kilonode render <stack>` writes, its marker included."""
    stack = load_stack(stack_name)
    return with_marker(render_tree(stack.config, plan_stack(stack)), stack_name)


def regenerate(golden_dir: Path = GOLDEN_DIR) -> list[str]:
    names = available_stacks()
    for name in names:
        stack = load_stack(name)
        # the goldens live in git: replace them whole (a hand edit there is what this undoes)
        shutil.rmtree(golden_dir / name, ignore_errors=True)
        write_tree(render_tree(stack.config, plan_stack(stack)), golden_dir / name, stack=name)
    for stale in sorted(p for p in golden_dir.iterdir() if p.is_dir() and p.name not in names):
        print(f"note: {stale} belongs to no shipped stack; delete it if the stack is gone", file=sys.stderr)
    return names


def regenerate_reference() -> Path:
    """docs/stack-reference.md, from the model (kilonode.config.reference)."""
    target = (REPO_ROOT or Path.cwd()) / REFERENCE_DOC
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(reference_markdown(), encoding="utf-8")
    return target


if __name__ == "__main__":
    try:
        for written in regenerate():
            print(f"regenerated {GOLDEN_DIR}/{written}")
        print(f"regenerated {regenerate_reference()}")
    except StackError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
