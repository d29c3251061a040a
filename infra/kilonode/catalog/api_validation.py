"""The apiserver's validation rules beyond the OpenAPI schema that a kilonode object could hit
(api_validation.yaml, each with its upstream source): PriorityClass value bounds, the reserved
system- names, preemptionPolicy's values and the one global default. Read by preflight's
`api-validation` check."""

from __future__ import annotations

from functools import cache

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load


class SystemClass(Row):
    name: str
    value: int
    global_default: bool


class PriorityClassRules(Row):
    highest_user_definable: int
    highest_user_definable_source: list[str] = Field(min_length=1)
    system_prefix: str
    system_classes: list[SystemClass] = Field(min_length=1)
    system_source: list[str] = Field(min_length=1)
    preemption_policies: list[str] = Field(min_length=1)
    preemption_policy_source: list[str] = Field(min_length=1)
    global_default_source: list[str] = Field(min_length=1)


class ApiValidation(Row):
    kubernetes_version: str
    priority_class: PriorityClassRules


@cache
def catalogue() -> ApiValidation:
    return load(ApiValidation, CATALOG_DIR / "api_validation.yaml")
