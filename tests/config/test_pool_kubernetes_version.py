"""A pool's own Kubernetes version (nodePools[].kubernetesVersion): a minor upgrade moves the
control plane first and each pool after it, within the kubelet's version skew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kilonode.config.load import stack_from_value
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.review.snapshot import _image_contents
from tests.conftest import shipped_cluster_value


def _stack(cluster_version: str, pool_version: str | None) -> Any:
    cluster = shipped_cluster_value("local") | {"kubernetesVersion": cluster_version}
    if pool_version is not None:
        cluster["nodePools"] = [cluster["nodePools"][0] | {"kubernetesVersion": pool_version}]
    return stack_from_value("local", cluster, Path("stacks/Pulumi.local.yaml"))


def test_a_pool_behind_the_control_plane_keeps_its_own_binaries() -> None:
    plan = plan_stack(_stack("1.35.4", "1.34.2"))
    [pool] = plan.node_pools
    assert plan.kubernetes_version == "1.35.4" and pool.kubernetes_version == "1.34.2"
    images = _image_contents(plan)
    assert images["pool-cpu"]["binaries"]["kubelet"] == "1.34.2"
    assert images["control-plane"]["binaries"]["kubernetes-server"] == "1.35.4"


def test_a_pool_without_its_own_follows_the_stack() -> None:
    [pool] = plan_stack(_stack("1.34.2", None)).node_pools
    assert pool.kubernetes_version == "1.34.2"


@pytest.mark.parametrize("cluster,pool,words", [
    ("1.34.2", "1.35.4", "newer than kubernetesVersion 1.34.2: a kubelet must never be newer"),
    ("1.34.2", "1.34.3", "newer than kubernetesVersion 1.34.2"),
])
def test_a_pool_newer_than_the_control_plane_is_refused(cluster: str, pool: str, words: str) -> None:
    with pytest.raises(StackError) as caught:
        _stack(cluster, pool)
    assert any(p.path == "nodePools[0].kubernetesVersion" and words in p.message for p in caught.value.problems)


def test_a_pool_without_pinned_binaries_at_its_version_is_refused() -> None:
    with pytest.raises(StackError) as caught:
        _stack("1.34.2", "1.34.99")
    assert any(p.path == "nodePools[0].kubernetesVersion" and "no pinned" in p.message
               for p in caught.value.problems)


def test_the_kubelet_contract_is_judged_at_each_pools_own_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools pinned at 1.34.2 under a 1.35 control plane run the kubelet whose contract was read:
    only kube-proxy, which follows the control plane, is unread at 1.35. Seeded as the catalogue
    stood before both were read at 1.35.4 (read at 1.34.2 only); as it stands, neither is unread."""
    from kilonode.catalog import contracts as catalogue
    from kilonode.preflight.checks.contracts import unread

    assert unread(plan_stack(_stack("1.35.4", None))) == {}
    read = dict(catalogue.contracts())
    for name in ("kubelet", "kubeProxy"):
        read[name] = read[name].model_copy(update={"also_read_at": []})
    monkeypatch.setattr("kilonode.preflight.checks.contracts.contracts", lambda: read)
    assert set(unread(plan_stack(_stack("1.35.4", "1.34.2")))) == {"kubeProxy"}
    assert set(unread(plan_stack(_stack("1.35.4", None)))) == {"kubeProxy", "kubelet"}
    assert unread(plan_stack(_stack("1.34.2", None))) == {}
