"""The in-cluster components' releases and images (components.yaml), per Kubernetes minor
where a project pairs its releases with Kubernetes minors, each with its source."""

from __future__ import annotations

from functools import cache

from pydantic import Field, model_validator

from kilonode.catalog import CATALOG_DIR, Row, load


class Component(Row):
    # One of: a release for every supported minor, one per minor, or the cluster's own version.
    version: str | None = None
    versions: dict[int, str] = Field(default_factory=dict)
    follows_kubernetes: bool = False
    # minors served by another minor's release, and why (shown by `kilonode explain`)
    skew: dict[int, str] = Field(default_factory=dict)
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    # image references by role; {version} and {digest} are filled in
    images: dict[str, str] = Field(default_factory=dict)
    source: str
    note: str = ""
    # libraries an image carries whose versions a contract judges (catalog/contracts.yaml), with
    # the release notes that say so in `source`: {"nccl": "2.18.3"}
    provides: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_version_rule(self) -> Component:
        if sum((self.version is not None, bool(self.versions), self.follows_kubernetes)) != 1:
            raise ValueError("give exactly one of version, versions and followsKubernetes")
        return self

    def release(self, name: str, kubernetes_version: str) -> str:
        """The release for a Kubernetes version (`name` names the component in the message)."""
        if self.follows_kubernetes:
            return f"v{kubernetes_version}"
        if self.version is not None:
            return self.version
        minor = int(kubernetes_version.split(".")[1])
        if minor not in self.versions:
            known = ", ".join(f"1.{m}" for m in sorted(self.versions))
            raise ValueError(f"no {name} release is pinned for Kubernetes {kubernetes_version} "
                             f"(pinned: {known}); add one to {CATALOG_DIR.name}/components.yaml")
        return self.versions[minor]

    def image(self, role: str, version: str) -> str:
        return self.images[role].format(version=version, digest=self.digest)


class Components(Row):
    cloud_provider_azure: Component
    scheduler_plugins: Component
    cluster_autoscaler: Component
    coredns: Component
    dns_autoscaler: Component
    metrics_server: Component
    prometheus: Component
    kube_proxy: Component
    kubelet_csr_approver: Component
    device_plugin: Component
    rdma_shared_device_plugin: Component
    nccl_benchmark: Component
    azure_cni: Component


class _File(Row):
    components: Components


@cache
def components() -> Components:
    return load(_File, CATALOG_DIR / "components.yaml").components
