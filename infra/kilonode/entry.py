"""The `kilonode` console script. Deliberately tiny: Ctrl-C while the command's modules are
still importing must end with one line, not a traceback."""

from __future__ import annotations

import gc
import sys

from kilonode.exit_codes import ExitCode

# Commands that build one result, print or write it, and exit. Their process runs without the
# cyclic garbage collector, and the interpreter's last collection at exit is skipped: `plan`
# keeps ~1M objects (the Pulumi SDKs' modules and the graph) to the end, and collecting that heap
# again and again as it grows, then once more at exit, was about 1.1 s of a 3.5 s research-7500
# plan. Reference counting still frees nearly everything; what cycles they leave (~10 MB for a
# plan) the process's end returns. Not for the long-running commands (`local`, `gpu`, `image`).
BATCH_COMMANDS = frozenset({"validate", "render", "explain", "plan"})


def main() -> None:
    batch = sys.argv[1:2] and sys.argv[1] in BATCH_COMMANDS
    if batch:
        gc.disable()
    try:
        from kilonode.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        print("\nkilonode: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
    finally:
        if batch:
            # everything alive now is out of the final collection's reach; atexit handlers
            # (temporary directories) still run, and files are closed where they are written
            gc.freeze()
