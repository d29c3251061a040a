"""A risk as the rule modules find it, before the stack is attached (kilonode.review.risks.Risk)."""

from __future__ import annotations

from dataclasses import dataclass

HIGH, MEDIUM = "high", "medium"


@dataclass(frozen=True)
class Finding:
    level: str
    rule: str  # a stable name: version-skew, world-open, ...
    summary: str  # what, why, and what to do
    subjects: tuple[str, ...] = ()
    cause: str = ""  # the decision it follows from, shared with the other rules it fans out to (Risk.cause)
