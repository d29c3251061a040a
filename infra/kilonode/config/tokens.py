"""How long the pools' join tokens may live: the one rule, read by the stack loader (a
`joinTokens.*.expires` too far ahead is refused at load time, on every command and in the Pulumi
program) and by preflight's node-join check (which judges the same rule as of `--at`).

A join token is in every scale set's custom data: whoever copies it (a disk snapshot, a support
bundle, a pod on a node without the metadata block) can register nodes into that pool until it
expires (docs/azure.md, "Node join credentials"). A date years ahead is a token that never
expires, which preflight has always called a break; so the lifetime is bounded where the stack
is read. Rotation takes one stack edit and one `pulumi up` (docs/azure.md), so a year is room
for a yearly rotation with preflight's 30-day warning ahead of it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

# The longest a join token may be valid, counted from now (NOW_ENV when set).
JOIN_TOKEN_MAX_DAYS = 365
# When expiries are judged: now, unless this names another time (RFC 3339 with a zone):
# `kilonode preflight --at` sets it, to check a stack as of a planned bring-up date, and the tests
# pin it so that no test's outcome depends on the day it runs. The loader and preflight read it.
NOW_ENV = "KILONODE_NOW"


def now() -> datetime:
    """NOW_ENV when set and readable as a time with a zone (preflight refuses it otherwise,
    naming it), else the wall clock; in UTC."""
    pinned = os.environ.get(NOW_ENV)
    if pinned:
        try:
            at = datetime.fromisoformat(pinned.replace("Z", "+00:00"))
        except ValueError:
            at = None
        if at is not None and at.tzinfo is not None:
            return at.astimezone(UTC)
    return datetime.now(UTC)


def latest_expiry(at: datetime) -> datetime:
    """The latest `expires` a join token may have, judged at `at`."""
    return at + timedelta(days=JOIN_TOKEN_MAX_DAYS)


def lifetime_problem(expires: datetime | None, at: datetime) -> str | None:
    """Why a token with this expiry (None: none) may not be used, judged at `at`; None when it may.
    Only the upper bound: a past expiry is preflight's (the previous generation's may have passed)."""
    if expires is None:
        return ("the pools' join tokens never expire: whoever reads a VM's custom data (a disk snapshot, a support "
                "bundle, a pod on a node without the metadata block) can join nodes to the cluster forever")
    if expires > latest_expiry(at):
        return (f"{expires:%Y-%m-%dT%H:%M:%SZ} is more than {JOIN_TOKEN_MAX_DAYS} days after "
                f"{at:%Y-%m-%dT%H:%M:%SZ}: a join token in every scale set's custom data that outlives a yearly "
                f"rotation is as good as one that never expires; set an expiry before "
                f"{latest_expiry(at):%Y-%m-%d} and rotate before it (docs/azure.md, \"Node join credentials\")")
    return None
