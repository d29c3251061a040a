"""The `kilonode` console script. Deliberately tiny: Ctrl-C while the command's modules are
still importing must end with one line, not a traceback."""

from __future__ import annotations

import sys

from kilonode.exit_codes import ExitCode


def main() -> None:
    try:
        from kilonode.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        print("\nkilonode: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
