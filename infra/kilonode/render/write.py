"""Write a rendered tree all at once: into a sibling temp dir, then swapped into place.

A render directory is marked by MARKER, naming the tool, the stack and every file the
render wrote with its sha256. Only such a directory is ever replaced, and only when it
holds nothing the last render did not write and no file changed since (else the writer
names them and needs `force`), so neither a typo in --out nor a later render can take a
user's files with it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from kilonode.digest import sha256_file, sha256_text
from kilonode.render.files import RenderedFile

MARKER = ".kilonode-render.json"
TOOL = "kilonode render"
SHOWN = 10  # paths named in one message; the rest are counted


class OutputDirError(Exception):
    pass


def with_marker(tree: dict[str, RenderedFile], stack: str) -> dict[str, RenderedFile]:
    """The tree plus its marker: what `write_tree` writes, and what the goldens hold."""
    marker = {
        "tool": TOOL,
        "stack": stack,
        "note": "written by `kilonode render`; the next render replaces this directory only if it holds "
                "exactly these files, unchanged (or with --force)",
        "files": {path: sha256_text(file.content) for path, file in sorted(tree.items())},
    }
    return {**tree, MARKER: RenderedFile(json.dumps(marker, indent=2) + "\n")}


def read_marker(out: Path) -> dict[str, object] | None:
    """The marker of a previous render in `out`, or None when `out` is not one."""
    try:
        data = json.loads((out / MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("tool") != TOOL or not isinstance(data.get("files"), dict):
        return None
    return data


def _named(paths: list[str]) -> str:
    shown = ", ".join(paths[:SHOWN])
    return shown + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def _check_replaceable(out: Path, stack: str, force: bool) -> None:
    marker = read_marker(out)
    if marker is None:
        raise OutputDirError(
            f"{out} is not empty and is not a kilonode render (no {MARKER}): refusing to replace it; "
            "choose an empty or new directory"
        )
    problems: list[str] = []
    if marker.get("stack") != stack:
        problems.append(f"it holds the render of stack '{marker.get('stack')}', not '{stack}'")
    written: dict[str, str] = marker["files"]  # type: ignore[assignment]
    extra: list[str] = []
    changed: list[str] = []
    parents = {str(Path(p).parent) for p in written} | {"."}
    for root, dirs, files in os.walk(out):
        rel_root = Path(root).relative_to(out)
        for name in sorted(dirs):
            rel = str(rel_root / name)
            if not any(p == rel or p.startswith(rel + "/") for p in parents):
                extra.append(rel + "/")
        for name in sorted(files):
            rel = str(rel_root / name)
            if rel == MARKER:
                continue
            if rel not in written:
                extra.append(rel)
            elif sha256_file(out / rel) != written[rel]:
                changed.append(rel)
    if extra:
        problems.append(f"it holds {len(extra)} file(s) the last render did not write: {_named(sorted(extra))}")
    if changed:
        problems.append(f"{len(changed)} rendered file(s) changed since the last render: {_named(sorted(changed))}")
    if problems and not force:
        raise OutputDirError(
            f"{out}: " + "; ".join(problems) + ". Rendering replaces the whole directory: move those files "
            "out, or pass --force to replace it anyway"
        )


def write_tree(tree: dict[str, RenderedFile], out: Path, *, stack: str, force: bool = False) -> None:
    """Replace `out` with exactly `tree` and its marker (see the module docstring).

    On any failure the previous content of `out` is left as it was.
    """
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out} exists and is not a directory; choose a directory path for --out")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise OutputDirError(f"cannot create {out}: {blocking} is a file, not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        _check_replaceable(out, stack, force)
    tree = with_marker(tree, stack)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise OutputDirError(f"cannot create {out}: {error.strerror or error}; choose a writable --out") from None
    try:
        made = {staging}  # each folder made once (research-7500: 330 files in 213 folders)
        for rel, file in tree.items():
            target = staging / rel
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            target.write_text(file.content, encoding="utf-8")
            os.chmod(target, file.mode)
        os.chmod(staging, 0o755)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, retired / "tree")
            os.rename(staging, out)
            shutil.rmtree(retired)
        else:
            os.rename(staging, out)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputDirError(f"cannot write {out}: {error.strerror or error}; nothing was changed") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
