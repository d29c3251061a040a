"""The kubelet's validation of its KubeletConfiguration (kubelet_validation.yaml): the rules of
upstream ValidateKubeletConfiguration (and the log manager's containerLogMaxSize parse) a stack's
rendered kubelet-config.yaml could break, each with its message and source, and the defaults the
cross-field rules read, and the NUMA nodes of the GPU sizes' topology families. Read by
preflight's `kubelet-config` check."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load

Kind = Literal["atLeast", "greaterThan", "range", "oneOf", "lessThanField", "notWith", "quantity", "absolutePath",
               "requiresAny"]


class KubeletRule(Row):
    field: str
    kind: Kind
    message: str  # the kubelet's own words (validation.go), without "invalid configuration: "
    bound: float | None = None
    min: float | None = None
    max: float | None = None
    values: list[str | bool] = Field(default_factory=list)
    other: str | None = None  # lessThanField, notWith: the other field
    others: list[str] = Field(default_factory=list)  # requiresAny: dotted paths, one of which must be set
    # "validation": ValidateKubeletConfiguration's; "start": the kubelet's start after it (source says where)
    stage: Literal["validation", "start"] = "validation"
    or_equal: bool = False  # lessThanField: <= instead of <
    duration: bool = False  # a Go duration string, compared in seconds
    zero_defaults: bool = False  # a zero is defaulted away (defaults.go), never judged
    why: str = ""
    source: list[str] = Field(default_factory=list)  # beyond validationSource, where the rule lives elsewhere


class NumaNodes(Row):
    count: int = Field(ge=1)
    gpus_each: int = Field(ge=1)
    source: str


class KubeletValidation(Row):
    kubernetes_version: str
    validation_source: str
    defaults_source: str
    rules: list[KubeletRule] = Field(min_length=1)
    defaults: dict[str, int | float | str | bool]
    numa_nodes: dict[str, NumaNodes] = Field(default_factory=dict)  # by NCCL topology family


@cache
def catalogue() -> KubeletValidation:
    return load(KubeletValidation, CATALOG_DIR / "kubelet_validation.yaml")
