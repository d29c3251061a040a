"""The shared system pod spec (kilonode.k8s.pods)."""

from __future__ import annotations

from pulumi_kubernetes import core

from kilonode.k8s.pods import UNINITIALIZED_TAINT, system_pod_spec, tolerate_uninitialized_nodes


def test_unset_fields_stay_unset() -> None:
    spec = system_pod_spec("cluster", containers=[])
    assert spec.priority_class_name == "system-cluster-critical"
    assert spec.host_network is None and spec.service_account_name is None and spec.tolerations is None
    assert spec.containers == []


def test_a_node_critical_pod_on_the_host_network() -> None:
    tolerations = tolerate_uninitialized_nodes()
    spec = system_pod_spec("node", host_network=True, tolerations=tolerations, dns_policy="Default", containers=[])
    assert (spec.priority_class_name, spec.host_network, spec.dns_policy) == ("system-node-critical", True, "Default")
    assert [t.key for t in tolerations] == [UNINITIALIZED_TAINT, "node.kubernetes.io/not-ready", "CriticalAddonsOnly"]
    assert all(isinstance(t, core.v1.TolerationArgs) for t in tolerations)
