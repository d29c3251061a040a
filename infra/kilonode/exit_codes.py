"""The `kilonode` command's exit statuses, in one place (the CLI and its console entry).
Standard library only: the console entry needs it before, and whether or not, the CLI's
modules finish importing."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # checks ran and found something (a failed image check, an unhealthy GPU, a rehearsal
    # that did not come up); the command itself reports what
    FAILED = 1
    # the command could not do its job: a stack with problems, bad input, an unusable path,
    # a tool that failed
    STOPPED = 2
    # `kilonode diff --fail-on LEVEL` found a risk at that level: apart from 1 and 2 so CI can
    # tell a risky change from a broken review
    RISK = 3
    # Ctrl-C: 128 + SIGINT, as a shell reports it
    INTERRUPTED = 130
