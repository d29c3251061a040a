"""Preflight's reports: text for a person, JSON for tools (a list of findings)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from kilonode.preflight.model import Finding
from kilonode.preflight.run import CHECKS


def format_json(findings: Sequence[Finding]) -> str:
    return json.dumps([f.to_json() for f in findings], indent=2) + "\n"


def format_text(findings: Sequence[Finding], source: str, only: Sequence[str] = ()) -> str:
    """Per check, in bring-up order: its findings (breaks first) or that it passed; a summary."""
    lines = [f"preflight of {source}" if source else "preflight"]
    for check in CHECKS:
        if only and check.name not in only:
            continue
        mine = [f for f in findings if f.check == check.name]
        state = "ok" if not mine else ", ".join(
            f"{sum(f.level == level for f in mine)} {level}{'s' if sum(f.level == level for f in mine) > 1 else ''}"
            for level in ("break", "warn") if any(f.level == level for f in mine))
        lines.append(f"\n{check.name}: {state}  ({check.title})")
        for f in mine:
            lines += [f"  {f.level.upper()} {f.where}", f"    what: {f.what}", f"    fix:  {f.fix}"]
    count = sum(f.level == "break" for f in findings)
    warns = len(findings) - count
    lines.append(f"\n{count} break{'s' if count != 1 else ''}, {warns} warning{'s' if warns != 1 else ''}")
    return "\n".join(lines) + "\n"
