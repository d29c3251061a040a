"""Valid values whose effect upstream documents as dangerous at this cluster's scale
(value_effects.yaml): where each is read (an apiserver host program's flag in its rendered
systemd unit, or an in-cluster workload's field, container flag or environment variable), the
value or bound that brings the effect, what it does, what to do, and the upstream source read.
Read by kilonode.review.value_effects (`value-effect`)."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import model_validator

from kilonode.catalog import CATALOG_DIR, Row, load

Program = Literal["kube-apiserver", "kube-controller-manager", "kube-scheduler"]
Kind = Literal["DaemonSet", "Deployment", "StatefulSet", "StorageClass"]
# The recorded resource type of each kind (a workload of apps/v1, or a cluster-scoped object).
KIND_TYPES: dict[str, str] = {"DaemonSet": "kubernetes:apps/v1:DaemonSet",
                              "Deployment": "kubernetes:apps/v1:Deployment",
                              "StatefulSet": "kubernetes:apps/v1:StatefulSet",
                              "StorageClass": "kubernetes:storage.k8s.io/v1:StorageClass"}

# Go's strconv.ParseBool, which pflag's BoolVar and urfave/cli's BoolFlag use (golang/go
# src/strconv/atob.go): anything else is a parse error, which the program refuses at start.
TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class Condition(Row):
    """A second field of the same object the row's effect needs as well (e.g. a disk SKU that only
    fails with a caching mode), or, for an env/arg row, a second environment variable of the same
    container (Grafana's anonymous role beside anonymous access): absent reads as `default`, and an
    absent value with no default does not match."""

    field: str | None = None
    env: str | None = None
    default: str | None = None
    equals: str | None = None
    not_equals: str | None = None
    pattern: str | None = None

    @model_validator(mode="after")
    def _one_predicate(self) -> Condition:
        if (self.field is None) == (self.env is None):
            raise ValueError("when: exactly one of field, env")
        if len([p for p in (self.equals, self.not_equals, self.pattern) if p is not None]) != 1:
            raise ValueError(f"when {self.said}: exactly one of equals, notEquals, pattern")
        return self

    @property
    def said(self) -> str:
        return self.field if self.field is not None else f"env {self.env}"


class ValueEffect(Row):
    id: str
    title: str
    level: Literal["high", "medium"]
    # an apiserver host's program flag (its rendered unit's ExecStart)
    program: Program | None = None
    flag: str | None = None  # without the leading dashes
    # an in-cluster workload of the recorded resources
    kind: Kind | None = None
    names: tuple[str, ...] = ()  # metadata.name; none: every workload of the kind
    images: tuple[str, ...] = ()  # a container whose image contains one; none: every container
    field: str | None = None  # dotted path in the object: spec.updateStrategy.type
    arg: str | None = None  # a container's --<arg>=<value> among its command and args
    env: str | None = None  # a container's environment variable (the flag, where both, wins)
    default: str | None = None  # upstream's value where absent
    boolean: bool = False  # read as strconv.ParseBool reads it
    # read as a Prometheus duration (prometheus/common model.ParseDuration: "30s", "2m", "1h30m"),
    # in seconds: `below` and `above` are seconds then
    duration: bool = False
    equals: str | None = None
    not_equals: str | None = None
    below: float | None = None
    above: float | None = None
    pattern: str | None = None  # a Python regular expression searched in the value, lower-cased (e.g. "xids")
    # other fields of the same object (field rows), or other variables of the same container (env/arg rows),
    # that must match too
    when: tuple[Condition, ...] = ()
    # a container port: the line names who reaches it on the workload's pods (the head's NetworkPolicies)
    reach: int | None = None
    consequence: str
    fix: str
    source: str

    @model_validator(mode="after")
    def _one_place_one_predicate(self) -> ValueEffect:
        program = self.program is not None and self.flag is not None
        workload = self.kind is not None and ((self.field is not None) != (self.arg is not None or
                                                                             self.env is not None))
        if program == workload or (program and (self.kind or self.field or self.arg or self.env)):
            raise ValueError(f"{self.id}: one place: program + flag, or kind + field, or kind + arg/env")
        predicates = [p for p in (self.equals, self.not_equals, self.below, self.above, self.pattern) if p is not None]
        if len(predicates) != 1:
            raise ValueError(f"{self.id}: exactly one of equals, notEquals, below, above, pattern")
        if any((c.field is None) != (self.field is None) for c in self.when):
            raise ValueError(f"{self.id}: `when` reads fields on a field row, a container's env on an env/arg row")
        if self.duration and ((self.below is None and self.above is None) or self.boolean):
            raise ValueError(f"{self.id}: a duration row compares with below or above (seconds)")
        if self.boolean and not {v for v in (self.equals, self.not_equals, self.default) if v is not None} <= (
                TRUE_WORDS | FALSE_WORDS):
            raise ValueError(f"{self.id}: a boolean row's values must read as booleans")
        return self

    def where(self) -> str:
        """Where the value is read, as the review says it: '--watch-cache', 'env FAIL_ON_INIT_ERROR'."""
        if self.flag:
            return f"{self.program} --{self.flag}"
        if self.field:
            return self.field
        said = ([f"--{self.arg}"] if self.arg else []) + ([f"env {self.env}"] if self.env else [])
        return " / ".join(said)


class ValueEffects(Row):
    effects: tuple[ValueEffect, ...]

    @model_validator(mode="after")
    def _unique(self) -> ValueEffects:
        ids = [e.id for e in self.effects]
        if len(ids) != len(set(ids)):
            raise ValueError("value_effects.yaml: an id used twice")
        return self


@cache
def value_effects() -> ValueEffects:
    return load(ValueEffects, CATALOG_DIR / "value_effects.yaml")
