"""`--help` reads as prose: the docstrings' source line breaks are joined (kilonode.cli.common.reflow)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kilonode.cli.common import reflow
from kilonode.paths import REPO_ROOT

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


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


def _modules_after(argv: list[str]) -> set[str]:
    """The kilonode and pulumi modules a fresh interpreter holds after `kilonode ARGV`."""
    script = (
        "import sys\n"
        "from kilonode.cli import main\n"
        f"sys.argv = ['kilonode', *{argv!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('kilonode', 'pulumi')), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=60, check=False)
    return set(result.stderr.strip().splitlines()[-1].split())


def test_help_and_validate_load_only_what_they_use() -> None:
    """The registry imports a command's module when the command runs or lists its help, and the
    command modules import the model, the review, the image build and Pulumi only inside the
    commands that use them."""
    heavy = ("pulumi", "kilonode.review", "kilonode.image", "kilonode.azure", "kilonode.k8s", "kilonode.render")
    shown = _modules_after(["--help"])
    assert "kilonode.cli.stack" in shown  # listed: its help is read
    assert not {m for m in shown if m.startswith((*heavy, "kilonode.config", "kilonode.plan"))}
    validated = _modules_after(["validate", "local"])
    assert {"kilonode.config", "kilonode.plan"} <= validated
    # validate renders and composes each role's custom data to measure it, as the program would
    # (kilonode.azure.custom_data_size.oversized): the render, the Azure custom data code and the
    # preflight checks' package (which imports the image modules), not the review
    assert {"kilonode.render", "kilonode.azure.custom_data"} <= validated
    assert not {m for m in validated if m.startswith(("kilonode.review", "kilonode.cli.diff", "kilonode.cli.image"))}


def test_every_registry_entry_loads_under_its_name() -> None:
    from typer.main import get_command

    from kilonode.cli import COMMANDS, app

    root = get_command(app)
    context = root.make_context("kilonode", ["validate", "local"])
    assert root.list_commands(context) == list(COMMANDS)
    for name in COMMANDS:
        command = root.get_command(context, name)
        assert command is not None and command.name == name
