"""The in-cluster components' releases and images (components.yaml), per Kubernetes minor
where a project pairs its releases with Kubernetes minors, each with its source."""

from __future__ import annotations

import re
from functools import cache
from typing import Annotated

from pydantic import Field, model_validator

from kilonode.catalog import CATALOG_DIR, Row, load
from kilonode.imageref import registry_of

DIGEST = r"^sha256:[0-9a-f]{64}$"
_KUBERNETES_RELEASE = re.compile(r"v1\.\d+\.\d+")


class Component(Row):
    # One of: a release for every supported minor, one per minor, or the cluster's own version.
    version: str | None = None
    versions: dict[int, str] = Field(default_factory=dict)
    follows_kubernetes: bool = False
    # minors served by another minor's release, and why (shown by `kilonode explain`)
    skew: dict[int, str] = Field(default_factory=dict)
    # one release everywhere: its image's digest, filled in for {digest}
    digest: str | None = Field(default=None, pattern=DIGEST)
    # a release per minor (or the cluster's own): release -> role -> digest, for the releases whose
    # digest was read; the image is then `<template>@<digest>`, and by tag for any other release
    digests: dict[str, dict[str, Annotated[str, Field(pattern=DIGEST)]]] = Field(default_factory=dict)
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
        if self.digests and self.version is not None:
            raise ValueError("one release: give its image's `digest`, not `digests`")
        pinned = set(self.versions.values())
        for release, roles in self.digests.items():
            if self.versions and release not in pinned:
                raise ValueError(f"digests names {release}, which is no pinned release ({', '.join(sorted(pinned))})")
            if self.follows_kubernetes and not _KUBERNETES_RELEASE.fullmatch(release):
                raise ValueError(f"digests names {release}, which is no Kubernetes release (v1.N.P)")
            if unknown := set(roles) - set(self.images):
                raise ValueError(f"digests of {release} name {', '.join(sorted(unknown))}, which no image is")
            if any("{digest}" in self.images[role] for role in roles):
                raise ValueError(f"digests of {release}: a per-release digest is appended, not a {{digest}} field")
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
        """The reference for `role` at release `version`: by digest where the catalogue has it
        (the one release's `digest`, or `digests` for this release), by tag otherwise."""
        reference = self.images[role].format(version=version, digest=self.digest)
        digest = self.digests.get(version, {}).get(role)
        return f"{reference}@{digest}" if digest else reference

    def by_tag(self) -> dict[str, list[str]]:
        """role -> the releases whose image is pinned by tag only (no digest read); for a
        component following the cluster's Kubernetes version, "any other" stands for every
        release the catalogue has no digest for."""
        if self.version is not None:
            return {role: [self.version] for role, image in self.images.items() if "{digest}" not in image}
        releases = sorted(set(self.versions.values()))
        missing = {role: [r for r in releases if role not in self.digests.get(r, {})] for role in self.images}
        if self.follows_kubernetes:
            missing = {role: [*found, "any other"] for role, found in missing.items()}
        return {role: found for role, found in missing.items() if found}


class Components(Row):
    cloud_provider_azure: Component
    scheduler_plugins: Component
    cluster_autoscaler: Component
    coredns: Component
    dns_autoscaler: Component
    metrics_server: Component
    prometheus: Component
    grafana: Component
    alertmanager: Component
    dcgm_exporter: Component
    node_exporter: Component
    kube_state_metrics: Component
    kube_proxy: Component
    kubelet_csr_approver: Component
    device_plugin: Component
    rdma_shared_device_plugin: Component
    nccl_benchmark: Component
    azure_cni: Component
    calico: Component
    azure_disk_csi: Component


    def repositories(self) -> frozenset[str]:
        """Every component image's repository (the reference without tag or digest)."""
        rows = (getattr(self, name) for name in type(self).model_fields)
        return frozenset(repository_of(image) for row in rows for image in row.images.values())

    def publishers(self) -> frozenset[str]:
        """Where the cluster's own components are published, as image-name prefixes: a registry
        one publisher curates, whole (CURATED_REGISTRIES), else the account or organisation path
        on a registry anyone may publish to (quay.io/calico, not quay.io). What a stack's pause and
        preload images may name without trustedImagePrefixes."""
        return frozenset(publisher_of(repository) for repository in self.repositories())


# Registries whose every image one publisher promotes: registry.k8s.io serves only what the
# Kubernetes project promotes (kubernetes/k8s.io registry.k8s.io/images/*: each image by a
# promotion pull request), mcr.microsoft.com only Microsoft's. On the others (quay.io, ghcr.io,
# nvcr.io, Docker Hub) any account publishes, so a host names no publisher.
CURATED_REGISTRIES = frozenset({"registry.k8s.io", "mcr.microsoft.com"})
# Registries where anyone may open an account and publish: a prefix there names a publisher only
# with its account (quay.io/calico), never the host alone (the independent trace of issue 37,
# round 5, finding 4: trustedImagePrefixes took `docker.io` whole). Docker Hub under its aliases.
SHARED_REGISTRIES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com",
                               "quay.io", "ghcr.io", "docker.pkg.github.com", "nvcr.io", "gcr.io", "mirror.gcr.io",
                               "public.ecr.aws", "registry.gitlab.com", "ttl.sh"})
# ... and every Artifact Registry host (<region>-docker.pkg.dev): anyone's project publishes there.
SHARED_REGISTRY_SUFFIXES = ("-docker.pkg.dev",)


def shared_registry(host: str) -> bool:
    """A registry host anyone may publish to, its port aside (quay.io:443 is quay.io: the
    runtimes keep the port in the name, distribution/reference splitDockerDomain, but it reaches the
    same registry; the independent trace of issue 37, round 6)."""
    name = host.rsplit(":", 1)[0] if ":" in host else host
    return name in SHARED_REGISTRIES or name.endswith(SHARED_REGISTRY_SUFFIXES)


def repository_of(image: str) -> str:
    """An image reference without its digest and tag (a port in the host stays), with Docker Hub's
    host and `library/` written out as the runtimes resolve them (busybox: docker.io/library/busybox)."""
    name = image.partition("@")[0]
    head, _, last = name.rpartition("/")
    repository = f"{head}/{last.partition(':')[0]}" if head else last.partition(":")[0]
    if registry_of(repository) == "docker.io" and not repository.startswith("docker.io/"):
        repository = f"docker.io/{repository if '/' in repository else 'library/' + repository}"
    return repository


def publisher_of(repository: str) -> str:
    """The prefix that names a repository's publisher (CURATED_REGISTRIES)."""
    registry = registry_of(repository)
    rest = repository.removeprefix(registry + "/")
    if registry in CURATED_REGISTRIES or "/" not in rest:
        return registry
    return f"{registry}/{rest.partition('/')[0]}"


class _File(Row):
    components: Components


@cache
def components() -> Components:
    return load(_File, CATALOG_DIR / "components.yaml").components
