"""The start-time validation of the control plane's and metrics-server's flags
(flag_validation.yaml): per program, where its flags are rendered (a systemd unit on the apiserver
hosts, or a workload's container args), the rules of upstream's options Validate a flag could
break, each with the program's own message and source, and the defaults a cross-flag rule reads.
Read by preflight's `component-flags` check."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load

Kind = Literal["range", "atLeast", "greaterThan", "ratio"]


class FlagRule(Row):
    flag: str  # without the leading --
    kind: Kind
    type: Literal["int", "float", "duration"]  # how pflag parses it; duration: compared in seconds
    message: str  # the program's own words (without the %v of the value)
    source: str  # repository, file and function (the program's `source` says which version was read)
    bound: float | None = None  # atLeast, greaterThan
    min: float | None = None  # range
    max: float | None = None  # range
    factor: float | None = None  # ratio: value * factor >= other's value
    other: str | None = None  # ratio: the other flag
    when: str | None = None  # judged only when this flag is set and not empty
    why: str = ""


class Program(Row):
    version: str  # the version the rules were read for
    source: str
    consequence: str  # what a refused flag does: the program exits at start, and what follows
    fix: str  # which kilonode setting renders the flags
    rules: list[FlagRule] = Field(min_length=1)
    unit: str | None = None  # its systemd unit's path on a host of the render
    workload: str | None = None  # "Kind namespace/name" of the Deployment that runs it
    container: str | None = None  # the workload's container
    defaults: dict[str, str] = Field(default_factory=dict)  # flag -> upstream's default, as a flag value


class FlagValidation(Row):
    programs: dict[str, Program] = Field(min_length=1)


@cache
def catalogue() -> FlagValidation:
    return load(FlagValidation, CATALOG_DIR / "flag_validation.yaml")
