"""Calico in policy-only mode (kilonode.k8s.calico): every object valid for Kubernetes 1.34, Typha
sized by the operator's rule, Felix and Typha naming pods' interfaces as azure-vnet does, the two
sides of Typha's TLS agreeing, Felix on every node."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.k8s import calico
from kilonode.plan import defaults
from kilonode.plan.resolve.components import typha_replicas
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)


def objects(graph: Graph) -> list[dict[str, Any]]:
    parents = {r.name for r in graph.resources if r.type == "kilonode:k8s:Calico"}
    return [r.plain() for r in graph.resources if r.parent in parents and r.type.startswith("kubernetes:")]


def one(found: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in found if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("stack", STACKS)
def test_every_calico_object_is_valid_for_kubernetes(graphs: dict[str, Graph], stack: str) -> None:
    found = objects(graphs[stack])
    assert {o["kind"] for o in found} >= {"CustomResourceDefinition", "ServiceAccount", "ClusterRole",
                                          "ClusterRoleBinding", "Secret", "Service", "Deployment",
                                          "PodDisruptionBudget", "DaemonSet"}
    for obj in found:
        shared.validate_object(obj, "1.34.0")


@pytest.mark.parametrize(("nodes", "replicas"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (399, 3), (400, 4),
                                                 (599, 4), (600, 5), (2504, 14), (7504, 39)])
def test_typha_replicas_follow_the_operators_rule(nodes: int, replicas: int) -> None:
    """Hand-computed from tigera/operator@v1.40.15 pkg/common/autoscale.go GetExpectedTyphaScale."""
    assert typha_replicas(nodes) == replicas


@pytest.mark.parametrize("stack", STACKS)
def test_typha_runs_the_plans_replicas_one_per_node_behind_a_pdb(graphs: dict[str, Graph], stack: str) -> None:
    found = objects(graphs[stack])
    typha = one(found, "Deployment", calico.TYPHA)
    assert typha["spec"]["replicas"] == shared.plan(stack).components.network_policy.typha_replicas
    spec = typha["spec"]["template"]["spec"]
    assert spec["hostNetwork"] and spec["priorityClassName"] == "system-cluster-critical"
    [term] = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert one(found, "PodDisruptionBudget", calico.TYPHA)["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("stack", STACKS)
def test_felix_and_typha_name_pod_interfaces_as_azure_vnet_does(graphs: dict[str, Graph], stack: str) -> None:
    """azure-vnet's host-side prefix (Azure/azure-container-networking@v1.6.21 network/endpoint_linux.go:
    hostVEthInterfacePrefix = "az" + "v"), the one kube-proxy's detectLocal names too."""
    found = objects(graphs[stack])
    for kind, name in (("DaemonSet", calico.NODE), ("Deployment", calico.TYPHA)):
        assert env_of(one(found, kind, name))["FELIX_INTERFACEPREFIX"] == "azv"
    assert defaults.KUBE_PROXY_POD_INTERFACE_PREFIX == "azv"


@pytest.mark.parametrize("stack", STACKS)
def test_the_two_sides_of_typhas_tls_agree(graphs: dict[str, Graph], stack: str) -> None:
    found = objects(graphs[stack])
    felix, typha = env_of(one(found, "DaemonSet", calico.NODE)), env_of(one(found, "Deployment", calico.TYPHA))
    assert felix["FELIX_TYPHACN"] == calico.TYPHA_CN and typha["TYPHA_CLIENTCN"] == calico.NODE_CN
    for workload, keys in ((one(found, "DaemonSet", calico.NODE), ("FELIX_TYPHACAFILE", "FELIX_TYPHACERTFILE",
                                                                    "FELIX_TYPHAKEYFILE")),
                           (one(found, "Deployment", calico.TYPHA), ("TYPHA_CAFILE", "TYPHA_SERVERCERTFILE",
                                                                      "TYPHA_SERVERKEYFILE"))):
        spec = workload["spec"]["template"]["spec"]
        [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "typha-tls"]
        [volume] = [v for v in spec["volumes"] if v["name"] == "typha-tls"]
        secret = one(found, "Secret", volume["secret"]["secretName"])
        for key in keys:
            path = env_of(workload)[key]
            assert path.startswith(mount["mountPath"] + "/") and path.rpartition("/")[2] in secret["stringData"]
    # the CNs the certificates carry
    requests = {r.name: r.plain() for r in graphs[stack].resources if r.type == "tls:index/certRequest:CertRequest"
                and "calico" in r.name}
    assert {r["subject"]["commonName"] for r in requests.values()} == {calico.TYPHA_CN, calico.NODE_CN}


@pytest.mark.parametrize("stack", STACKS)
def test_felix_runs_on_every_node_at_node_priority(graphs: dict[str, Graph], stack: str) -> None:
    spec = one(objects(graphs[stack]), "DaemonSet", calico.NODE)["spec"]["template"]["spec"]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["priorityClassName"] == "system-node-critical" and spec["hostNetwork"]
    assert "initContainers" not in spec  # no Calico CNI plugin to install, no eBPF bootstrap


def test_the_crds_are_calicos_kinds_with_open_schemas(graphs: dict[str, Graph]) -> None:
    crds = [o for o in objects(graphs["research-7500"]) if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 24 and len({c["metadata"]["name"] for c in crds}) == 24
    anp = one(crds, "CustomResourceDefinition", "adminnetworkpolicies.policy.networking.k8s.io")
    assert anp["metadata"]["annotations"]["api-approved.kubernetes.io"] == calico.NETWORK_POLICY_API
    namespaced = {c["spec"]["names"]["kind"] for c in crds if c["spec"]["scope"] == "Namespaced"}
    assert namespaced == {"NetworkPolicy", "NetworkSet", "StagedKubernetesNetworkPolicy", "StagedNetworkPolicy"}
