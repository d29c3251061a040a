"""What a change to an input does, per resource type (effects.toml), each row with its source:
read by kilonode.review (kilonode diff)."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load


class Effect(Row):
    type: str
    path: str  # dotted input path, list elements as []
    effect: Literal["replace", "restart", "rollout", "refused", "in-place"]
    why: str = ""
    source: str = Field(min_length=1)
    unverified: bool = False


class _File(Row):
    effect: tuple[Effect, ...]


@cache
def effects() -> dict[str, tuple[Effect, ...]]:
    """effects.toml by resource type."""
    found: dict[str, list[Effect]] = {}
    for row in load(_File, CATALOG_DIR / "effects.toml").effect:
        found.setdefault(row.type, []).append(row)
    return {t: tuple(rows) for t, rows in found.items()}
