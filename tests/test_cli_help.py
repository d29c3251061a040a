"""`--help` reads as prose: the docstrings' source line breaks are joined (kilonode.cli.common.reflow)."""

from __future__ import annotations

import os
import subprocess
import sys

from kilonode.cli.common import reflow
from kilonode.paths import REPO_ROOT


def test_reflow_joins_wrapped_lines_and_keeps_lists() -> None:
    text = """First line.

    A paragraph wrapped
    in the source.

    - a list item
    - another
    """
    assert reflow(text) == "First line.\n\nA paragraph wrapped in the source.\n\n- a list item\n- another"


def test_the_installed_command_prints_paragraphs_the_terminal_wraps() -> None:
    result = subprocess.run([sys.executable, "-m", "kilonode.cli", "image", "verify", "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "COLUMNS": "240", "NO_COLOR": "1"})
    assert result.returncode == 0, result.stderr
    # one source paragraph, several source lines: one line at this width
    assert "with a blank second disk as the local SSD and the pool's user-data as a NoCloud seed" in result.stdout
