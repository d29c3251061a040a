"""The RBAC permissions upstream names as privilege-escalation paths (escalations.yaml, each
with its source): what each lets a compromised pod do and the narrower permission to grant
instead. Read by kilonode.review.security (`rbac-escalation`)."""

from __future__ import annotations

from functools import cache
from typing import Literal

from kilonode.catalog import CATALOG_DIR, Row, load


class Permission(Row):
    """Requests the RBAC authorizer is asked: every (group, resource, verb, name) combination;
    no resourceNames asks for any object (a rule restricted to names does not allow that)."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()


class Escalation(Row):
    id: str
    title: str
    level: Literal["high", "medium"]
    # where a grant counts: "cluster" (a ClusterRoleBinding), a namespace (a RoleBinding there), "*"
    scopes: tuple[str, ...]
    needs: tuple[Permission, ...]
    any: bool = False  # one of `needs` is enough; otherwise all of them
    wildcard: bool = False  # any rule with "*" among its verbs or resources
    does: str
    fix: str
    source: str


class Escalations(Row):
    page: str
    escalations: tuple[Escalation, ...]


@cache
def escalations() -> Escalations:
    return load(Escalations, CATALOG_DIR / "escalations.yaml")
