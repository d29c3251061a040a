"""Write a rendered tree all at once: into a sibling temp dir, then swapped into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from infra.render.cluster import CONFIG_FILE, PLAN_FILE
from infra.render.files import RenderedFile


class OutputDirError(Exception):
    pass


def is_render_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and (path / PLAN_FILE).is_file()


def write_tree(tree: dict[str, RenderedFile], out: Path) -> None:
    """Replace `out` with exactly `tree`. Refuses a non-empty directory that is not a
    previous render, so a typo in --out cannot wipe unrelated files. On any failure the
    previous content of `out` is left as it was."""
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not is_render_dir(out):
        raise OutputDirError(
            f"{out} is not empty and holds no previous render ({CONFIG_FILE}, {PLAN_FILE}); "
            "choose an empty or new directory"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for rel, file in tree.items():
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(file.content)
            os.chmod(target, file.mode)
        os.chmod(staging, 0o755)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, retired / "tree")
            os.rename(staging, out)
            shutil.rmtree(retired)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
