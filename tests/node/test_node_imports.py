"""What a node program may import: it runs under the image's Debian python3, without the
project's venv and without the rest of kilonode, and under the names kilonode.node.ship gives
it on the machine (node/gpu/ is kilonode.gpu there). So: the standard library, the libraries
the images carry (ship.NODE_LIBRARIES, each brought by a line of node-image/packages/), and
relative imports inside its own shipped program; no absolute kilonode import at all (none
would resolve on the machine), hence nothing of kilonode outside node/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from kilonode.image.recipe import read_list
from kilonode.node import ship
from kilonode.paths import NODE_IMAGE_DIR


def import_problems(source: str, where: str, depth: int) -> list[str]:
    """Imports in `source` a node program may not make. `depth`: how many package levels its
    relative imports may climb and stay inside its shipped program (0: a lone file, none)."""
    problems = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.level > depth:
                problems.append(f"{where}:{node.lineno}: `from {'.' * node.level}{node.module or ''}` "
                                "leaves what is shipped with it")
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top == "kilonode":
                problems.append(f"{where}:{node.lineno}: imports {name}: the machine has no such name "
                                "(import the program's own modules relatively)")
            elif top not in sys.stdlib_module_names and top not in ship.NODE_LIBRARIES and top != "__future__":
                problems.append(f"{where}:{node.lineno}: imports {name}: neither the standard library nor a "
                                "library the node images carry (kilonode.node.ship.NODE_LIBRARIES)")
    return problems


def shipped_depth(path: Path) -> int:
    """A package program's modules may import inside the package (one level up from a module
    in it); a lone file, ship.py and node/__init__.py (which stay here) may not climb at all."""
    return 1 if path.parent != ship.NODE_DIR else 0


def node_sources() -> list[Path]:
    return sorted(p for p in ship.NODE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_node_program_imports_only_what_its_machine_has() -> None:
    sources = node_sources()
    assert {"gpu/agent.py", "etcd_snapshot.py", "local_disk_setup.py", "arp_guest.py"} <= {
        p.relative_to(ship.NODE_DIR).as_posix() for p in sources}
    problems = [problem for path in sources
                for problem in import_problems(path.read_text(), str(path), shipped_depth(path))]
    assert problems == []


def test_every_program_ship_names_is_a_node_source() -> None:
    shipped = {program.path for program in ship.PROGRAMS}
    assert all(path.exists() for path in shipped)
    # each source under node/ is shipped, or is in a shipped package, or is the table itself
    stays = {ship.NODE_DIR / "__init__.py", ship.NODE_DIR / "ship.py"}
    unshipped = [p for p in node_sources() if p not in shipped | stays and p.parent not in shipped]
    assert unshipped == []


@pytest.mark.parametrize(("source", "depth", "found"), [
    ("import requests\n", 0, "imports requests: neither the standard library"),
    ("from kilonode.plan import defaults\n", 1, "imports kilonode.plan: the machine has no such name"),
    ("def f():\n    import kilonode.node.gpu.rules\n", 1, "imports kilonode.node.gpu.rules"),
    ("from ..ship import GPU_HEALTH\n", 1, "`from ..ship` leaves what is shipped with it"),
    ("from .readings import read_dir\n", 0, "`from .readings` leaves what is shipped with it"),
])
def test_the_checker_finds_a_planted_bad_import(source: str, depth: int, found: str) -> None:
    [problem] = import_problems(source, "planted.py", depth)
    assert found in problem


def test_the_checker_lets_the_allowed_ones_through() -> None:
    allowed = "import json\nimport yaml\nfrom . import protocol\nfrom .rules import evaluate\n"
    assert import_problems(allowed, "fine.py", 1) == []


def test_each_node_library_is_brought_by_the_image_package_lists() -> None:
    """ship.NODE_LIBRARIES names the line of node-image/packages/ that brings each library in:
    python3-numpy is listed for GPU images; python3-yaml is a Depends of cloud-init, which
    base.txt lists for every image."""
    listed = {name for path in (NODE_IMAGE_DIR / "packages").glob("*.txt") for name in read_list(path)}
    assert {line for _package, line in ship.NODE_LIBRARIES.values()} <= listed
    assert "cloud-init" in read_list(NODE_IMAGE_DIR / "packages" / "base.txt")
