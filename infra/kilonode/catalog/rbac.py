"""The RBAC objects every apiserver creates for itself (rbac.yaml, with its source): the
built-in ClusterRoles, Roles and ClusterRoleBindings a stack's own bindings may name or fall under,
kept in the objects' own shape so they are read like the graph's."""

from __future__ import annotations

from functools import cache
from typing import Any

from kilonode.catalog import CATALOG_DIR, Row, load


class BuiltinRbac(Row):
    source: str
    note: str
    cluster_roles: tuple[dict[str, Any], ...]
    roles: tuple[dict[str, Any], ...] = ()  # namespaced, each with metadata.namespace
    cluster_role_bindings: tuple[dict[str, Any], ...]
    controller_service_accounts: tuple[str, ...]


@cache
def builtin_rbac() -> BuiltinRbac:
    return load(BuiltinRbac, CATALOG_DIR / "rbac.yaml")
