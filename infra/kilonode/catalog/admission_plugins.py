"""kube-apiserver's in-tree admission plugins (admission_plugins.yaml): the names it knows at the
pinned Kubernetes version, and the plugins that cannot start without their entry in the file
--admission-control-config-file names, each with the entry upstream wants and its source. Read by
preflight's `admission-config` check."""

from __future__ import annotations

from functools import cache

from pydantic import Field

from kilonode.catalog import CATALOG_DIR, Row, load


class RequiresConfig(Row):
    name: str
    api_version: str | None  # the Configuration's apiVersion; None: an unversioned document
    kind: str | None
    example: str  # the nested configuration, one line of YAML
    why: str  # what kube-apiserver does without the entry
    limit_types: list[str] = Field(default_factory=list)  # EventRateLimit's accepted limit types
    source: list[str] = Field(min_length=1)


class AdmissionPlugins(Row):
    kubernetes_version: str
    requires_config: list[RequiresConfig]
    plugins: list[str] = Field(min_length=1)
    plugins_source: list[str] = Field(min_length=1)
    unconfirmed: list[str]
    unconfirmed_source: list[str] = Field(min_length=1)

    def required(self, name: str) -> RequiresConfig | None:
        return next((r for r in self.requires_config if r.name == name), None)


@cache
def catalogue() -> AdmissionPlugins:
    return load(AdmissionPlugins, CATALOG_DIR / "admission_plugins.yaml")
