"""Where a stack's pause and preloaded images may come from (kilonode.config.checks._image_sources):
a publisher of the cluster's own components or one trustedImagePrefixes names, by digest where the
image build pulls, and never under a component's name. The refusals are hostile files
(tests/config/hostile/trace4-*, trace5-*); here, what must pass, and the archive case."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilonode.catalog.components import components, publisher_of, repository_of
from kilonode.config import load_stack
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

DIGEST = "@sha256:" + "c" * 64


def _load(write_stack: StackWriter, **cluster: Any) -> Any:
    value = shipped_cluster_value("local")
    for key, item in cluster.items():
        if key == "preload":
            value["nodePools"][0]["preloadImages"] = item
        else:
            value[key] = item
    return load_stack(str(write_stack(value))).config


def test_publishers_are_accounts_on_shared_registries_and_curated_registries_whole() -> None:
    assert components().publishers() == {"registry.k8s.io", "mcr.microsoft.com", "quay.io/calico",
                                         "quay.io/prometheus", "ghcr.io/postfinance", "ghcr.io/mellanox",
                                         "nvcr.io/nvidia", "docker.io/grafana"}
    assert repository_of("busybox:1.36") == "docker.io/library/busybox"
    assert publisher_of(repository_of("quay.io/anyone/x:1" + DIGEST)) == "quay.io/anyone"


@pytest.mark.parametrize(("trusted", "image"), [
    ([], "quay.io/calico/some-tool:1.0" + DIGEST),  # a component's publisher
    ([], "registry.k8s.io/e2e-test-images/agnhost:2.52" + DIGEST),  # a curated registry, whole
    (["myregistry.azurecr.io"], "myregistry.azurecr.io/team/tool:1" + DIGEST),
    (["ghcr.io/my-org"], "ghcr.io/my-org/tool:1" + DIGEST),
    (["docker.io/library"], "busybox:1.36" + DIGEST),
])
def test_a_preload_from_a_trusted_publisher_by_digest_passes(write_stack: StackWriter, trusted: list[str],
                                                             image: str) -> None:
    config = _load(write_stack, trustedImagePrefixes=trusted, preload=[{"image": image}])
    assert config.node_pools[0].preload_images[0].image == image


def test_a_prefix_is_an_account_not_a_string_start(write_stack: StackWriter) -> None:
    """ghcr.io/my-org trusts ghcr.io/my-org/..., not ghcr.io/my-org-evil/..."""
    with pytest.raises(StackError) as refused:
        _load(write_stack, trustedImagePrefixes=["ghcr.io/my-org"],
              preload=[{"image": "ghcr.io/my-org-evil/x:1" + DIGEST}])
    assert "published by ghcr.io/my-org-evil" in refused.value.problems[0].message


def test_an_archive_may_not_take_a_components_name(write_stack: StackWriter, tmp_path: Path) -> None:
    """Issue 37, independent trace round 3, finding 3: an archive named quay.io/calico/node:v3.31.7
    was preloaded, exempt from every check, and would be what calico-node runs."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "node.tar").write_bytes(b"")  # validate wants it there; the image build reads it
    with pytest.raises(StackError) as refused:
        _load(write_stack, preload=[{"image": "quay.io/calico/node:v3.31.7", "archive": "images/node.tar"},
                                    {"image": "registry.k8s.io/kube-proxy:v1.34.2", "archive": "images/node.tar"}])
    assert [p.loc for p in refused.value.problems] == [("nodePools", 0, "preloadImages", 0, "image"),
                                                       ("nodePools", 0, "preloadImages", 1, "image")]
    assert all("in-cluster component" in p.message for p in refused.value.problems)
    # an archive under a name of its own passes: it pulls nothing, so no publisher or digest is asked
    config = _load(write_stack, preload=[{"image": "example.com/tools/x:1", "archive": "images/node.tar"}])
    assert config.node_pools[0].preload_images[0].archive == "images/node.tar"
