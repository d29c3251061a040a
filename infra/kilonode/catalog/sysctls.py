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


class Netns(Row):
    """A sysctl the kernel keeps per network namespace: what a new namespace (a pod's, under Azure CNI)
    starts with, and whether a pod may set its own."""

    # "default": the kernel's value, whatever the host set (the key's pernet init writes a constant);
    # "host": the host's (init_net's) value at the namespace's creation (the pernet init copies it)
    start: Literal["default", "host"]
    default: str | None = None  # the kernel's value a new namespace starts at, where `start` is default
    # in the kubelet's safe sysctl list (a pod may set it in securityContext.sysctls unflagged); None: not read
    safe: bool | None = None
    source: str


class SysctlKey(Row):
    type: str
    min: int | None = None
    max: int | None = None
    count: int = 1  # numbers in one value: "1024 65535" is two
    source: str
    netns: Netns | None = None  # None: not recorded (global, or not read), never "not namespaced"


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
        for name, row in self.keys.items():
            if row.netns is not None and (row.netns.start == "default") != (row.netns.default is not None):
                raise ValueError(f"keys.{name}.netns: a kernel default is given exactly where start is default")
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
