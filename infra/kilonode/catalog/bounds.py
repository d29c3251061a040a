"""The programs that read a stack file's numbers, and the type each reads them as (bounds.yaml)."""

from __future__ import annotations

from functools import cache

from pydantic import model_validator

from kilonode.catalog import CATALOG_DIR, Row, load


class NumberType(Row):
    min: int
    max: int
    source: str


class Reader(Row):
    """One program's reading of a number: its type, a tighter range where it does arithmetic."""

    reader: str
    type: str
    min: int | None = None
    max: int | None = None
    why: str | None = None
    source: str


class Bounds(Row):
    types: dict[str, NumberType]
    numbers: dict[str, Reader]

    @model_validator(mode="after")
    def _known_types(self) -> Bounds:
        for key, row in self.numbers.items():
            kind = self.types.get(row.type)
            if kind is None:
                raise ValueError(f"numbers.{key}: type {row.type!r} is not one of {sorted(self.types)}")
            if (row.max is not None and row.max > kind.max) or (row.min is not None and row.min < kind.min):
                raise ValueError(f"numbers.{key}: its range goes beyond its type {row.type}")
            if (row.max is not None or row.min is not None) and row.why is None:
                raise ValueError(f"numbers.{key}: a range tighter than the type says why")
        return self


@cache
def bounds() -> Bounds:
    return load(Bounds, CATALOG_DIR / "bounds.yaml")


def reader(key: str) -> Reader:
    return bounds().numbers[key]


def number_range(key: str) -> tuple[int, int]:
    """The smallest and largest value the reader `key` takes: its own range, else its type's."""
    row = reader(key)
    kind = bounds().types[row.type]
    return (kind.min if row.min is None else row.min), (kind.max if row.max is None else row.max)
