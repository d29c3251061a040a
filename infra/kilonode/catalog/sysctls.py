"""How the nodes' kernel reads each sysctl, and which sysctls harden it (sysctls.yaml)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from functools import cache
from typing import Literal

from pydantic import model_validator

from kilonode.catalog import CATALOG_DIR, Row, load


class KernelType(Row):
    min: int
    max: int
    source: str


class SysctlKey(Row):
    type: str
    min: int | None = None
    max: int | None = None
    count: int = 1  # numbers in one value: "1024 65535" is two
    source: str


class Hardening(Row):
    stronger: Literal["higher", "lower"] | tuple[int, ...]  # a larger number is stronger, or the values weakest first
    least: int  # the weakest value an override may set
    why: str
    source: str

    def weaker(self, value: int) -> bool:
        """Whether `value` is weaker than `least` (a value outside `stronger`'s list is weaker too)."""
        if self.stronger == "higher":
            return value < self.least
        if self.stronger == "lower":
            return value > self.least
        return value not in self.stronger or self.stronger.index(value) < self.stronger.index(self.least)

    def allowed(self) -> str:
        """The values an override may set, in words."""
        if isinstance(self.stronger, tuple):
            return " or ".join(str(v) for v in self.stronger[self.stronger.index(self.least):])
        return f"{self.least} or {'more' if self.stronger == 'higher' else 'less'}"


class Sysctls(Row):
    types: dict[str, KernelType]
    default: str
    keys: dict[str, SysctlKey]
    paths: dict[str, str]  # key -> what the kernel runs or writes there (its page): never a stack's
    hardening: dict[str, Hardening]

    @model_validator(mode="after")
    def _consistent(self) -> Sysctls:
        for name, row in self.keys.items():
            if row.type not in self.types:
                raise ValueError(f"keys.{name}: type {row.type!r} is not one of {sorted(self.types)}")
        for name in self.paths:
            if self.key(name) is not None:
                raise ValueError(f"paths.{name}: a key a stack may not set has no row in `keys`")
        for name, rule in self.hardening.items():
            if name not in self.keys:
                raise ValueError(f"hardening.{name}: the key has no row in `keys` (its type and range)")
            if isinstance(rule.stronger, tuple) and rule.least not in rule.stronger:
                raise ValueError(f"hardening.{name}: least {rule.least} is not among {rule.stronger}")
        return self

    def key(self, name: str) -> SysctlKey | None:
        """The row of sysctl `name`: its own, else the first pattern (`*`: an interface) it matches."""
        return self.keys.get(name) or next((row for pattern, row in self.keys.items()
                                            if "*" in pattern and fnmatchcase(name, pattern)), None)

    def hardening_of(self, name: str) -> tuple[str, Hardening] | None:
        """(the row's key, its rule) where sysctl `name` hardens the kernel."""
        return next(((pattern, rule) for pattern, rule in self.hardening.items()
                     if pattern == name or ("*" in pattern and fnmatchcase(name, pattern))), None)

    def range_of(self, name: str) -> tuple[int, int, str, str]:
        """(least, most, the type's name, source) of the numbers sysctl `name` takes."""
        row = self.key(name)
        kind = row.type if row else self.default
        types = self.types[kind]
        if row is None:
            return types.min, types.max, kind, types.source
        low = types.min if row.min is None else max(row.min, types.min)
        high = types.max if row.max is None else min(row.max, types.max)
        return low, high, kind, row.source


@cache
def sysctls() -> Sysctls:
    return load(Sysctls, CATALOG_DIR / "sysctls.yaml")
