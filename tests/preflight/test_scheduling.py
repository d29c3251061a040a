"""scheduling: every workload placed on the nodes that exist at bootstrap; seeded breaks."""

from __future__ import annotations

from typing import Any

import yaml

from kilonode.preflight import Finding, run
from kilonode.preflight.checks.scheduling import requests_of
from tests.preflight.conftest import artefacts, inputs_of, resource

KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"


def findings(stack: str, **planted: object) -> list[Finding]:
    return run(inputs_of(stack, **planted), ["scheduling"])  # type: ignore[arg-type]


def by_where(found: list[Finding], level: str = "break") -> dict[str, str]:
    return {f.where: f.what for f in found if f.level == level}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["inputs"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def without_pool(files: dict[str, str], pool: str) -> None:
    """Drop a pool's render role, as if the stack had no such pool."""
    for key in [k for k in files if k.startswith(f"pool-{pool}/")]:
        del files[key]


def test_the_shipped_stacks_place_every_workload(shipped: str) -> None:
    assert by_where(findings(shipped)) == {}


def test_coredns_without_tolerations_on_gpu_only_pools_depends_on_the_gpu_driver_path() -> None:
    files, graph = artefacts("research-7500")
    without_pool(files, "system")
    pod_spec(resource(graph, "Deployment", "coredns"))["tolerations"] = []
    found = by_where(findings("research-7500", files=files, graph=graph))
    assert "DNS/node initialisation depend on the GPU driver path" in found["Deployment kube-system/coredns"]
    assert "kilonode.io/gpu-health=pending:NoSchedule" in found["Deployment kube-system/coredns"]
    # the cloud controller runs only on the controller pools (the system pool: its identity is
    # there alone), so without that pool no node of the cluster takes it: nodes are never initialised
    assert "no node admits them" in found["Deployment kube-system/cloud-controller-manager"]
    assert "required node affinity matches no label" in found["Deployment kube-system/cloud-controller-manager"]


def test_a_node_selector_no_node_has_leaves_the_pods_pending() -> None:
    files, graph = artefacts("local")
    pod_spec(resource(graph, "Deployment", "kubelet-csr-approver"))["nodeSelector"] = {"example.com/rack": "r1"}
    found = by_where(findings("local", files=files, graph=graph))
    assert "no node admits them" in found["Deployment kube-system/kubelet-csr-approver"]
    assert "nodeSelector example.com/rack=r1" in found["Deployment kube-system/kubelet-csr-approver"]


def test_anti_affinity_replicas_beyond_the_nodes_stay_pending() -> None:
    files, graph = artefacts("local")
    resource(graph, "Deployment", "coredns")["inputs"]["spec"]["replicas"] = 3  # local has 2 nodes
    found = by_where(findings("local", files=files, graph=graph))
    assert "3 replicas with required pod anti-affinity on kubernetes.io/hostname need 3 nodes; only 2" in \
        found["Deployment kube-system/coredns"]


def test_a_daemonset_kept_off_a_pool_it_must_run_on() -> None:
    files, graph = artefacts("local")
    config = yaml.safe_load(files[f"pool-cpu/{KUBELET_CONFIG}"])
    config["registerWithTaints"] = [{"key": "example.com/dedicated", "value": "x", "effect": "NoSchedule"}]
    files[f"pool-cpu/{KUBELET_CONFIG}"] = yaml.safe_dump(config)
    pod_spec(resource(graph, "DaemonSet", "kube-proxy"))["tolerations"] = []
    found = by_where(findings("local", files=files, graph=graph))
    assert "example.com/dedicated=x:NoSchedule not tolerated" in found["DaemonSet kube-system/kube-proxy on pool-cpu"]


def test_requests_beyond_a_node_and_no_pod_ip_refuse_the_pool() -> None:
    files, graph = artefacts("local")
    approver = pod_spec(resource(graph, "Deployment", "kubelet-csr-approver"))
    approver["containers"][0].setdefault("resources", {})["requests"] = {"cpu": "5", "memory": "1Gi"}
    found = by_where(findings("local", files=files, graph=graph))
    assert "requests cpu exceed a Standard_D4ds_v5 node's allocatable" in \
        found["Deployment kube-system/kubelet-csr-approver"]


def test_the_device_plugin_reaches_team_nodes_and_off_them_is_a_break() -> None:
    assert not [w for w in by_where(findings("research-7500"), "warn") if "device-plugin" in w]
    files, graph = artefacts("research-7500")
    spec = pod_spec(resource(graph, "DaemonSet", "nvidia-device-plugin-daemonset"))
    spec["tolerations"] = [t for t in spec["tolerations"] if t["key"] != "kilonode.io/team"]
    found = by_where(findings("research-7500", files=files, graph=graph))
    for team, nodes in (("language", "3,000"), ("vision", "1,000")):
        what = found[f"DaemonSet kube-system/nvidia-device-plugin-daemonset on pool-a100-ib.team-{team}"]
        assert f"the team's {nodes} nodes" in what and "0 nvidia.com/gpu" in what


def test_requests_are_summed_as_the_scheduler_does() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "100m", "memory": "70Mi"}}},
                           {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "8"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}
    assert requests_of(spec) == {"cpu": 2000, "memory": 70 * 2**20, "nvidia.com/gpu": 8}


def test_a_daemonset_awaited_over_a_joining_fleet_is_a_break() -> None:
    from kilonode.preflight import breaks, run
    from tests.preflight.conftest import artefacts, inputs_of, resource

    files, graph = artefacts("research-7500")
    proxy = resource(graph, "DaemonSet", "kube-proxy")
    del proxy["inputs"]["metadata"]["annotations"]["pulumi.com/skipAwait"]
    [finding] = breaks(run(inputs_of("research-7500", files=files, graph=graph), ["scheduling"]))
    assert finding.where == "DaemonSet kube-system/kube-proxy"
    assert "every node's pod is available" in finding.what and "skipAwait" in finding.fix


def test_a_deployment_awaited_for_the_providers_default_is_a_break() -> None:
    from kilonode.preflight import breaks, run
    from tests.preflight.conftest import artefacts, inputs_of, resource

    files, graph = artefacts("research-7500")
    dns = resource(graph, "Deployment", "coredns")
    del dns["customTimeouts"]
    approver = resource(graph, "Deployment", "kubelet-csr-approver")
    approver["customTimeouts"] = {"create": "15m", "update": "15m"}
    found = {f.where: f.what for f in breaks(run(inputs_of("research-7500", files=files, graph=graph),
                                                 ["scheduling"]))}
    assert set(found) == {"Deployment kube-system/coredns", "Deployment kube-system/kubelet-csr-approver"}
    assert "pulumi-kubernetes's default 10 min" in found["Deployment kube-system/coredns"]
    assert "customTimeouts create 15m" in found["Deployment kube-system/kubelet-csr-approver"]


def test_coredns_with_the_plans_full_replicas_waits_on_later_waves_on_a_first_run() -> None:
    """The first-run timeline: 31 replicas, one per node, awaited 40 min; only the first wave's
    nodes run pods by then (3 system nodes), the untainted GPU nodes join in later waves. The
    shipped Deployment names no replicas (its autoscaler's), so this is what the fix removed."""
    files, graph = artefacts("research-7500")
    resource(graph, "Deployment", "coredns")["inputs"]["spec"]["replicas"] = 31
    found = by_where(findings("research-7500", files=files, graph=graph))
    what = found["Deployment kube-system/coredns"]
    assert what.startswith("`pulumi up` waits 40 min for 31 replica(s), one per node (kubernetes.io/hostname "
                           "anti-affinity); a wave's nodes run pods 40 min after it starts, so only waves starting by "
                           "minute 0 count: 3 node(s) that admit it, 3,500 more in later waves"), what


def test_a_deployment_only_later_waves_admit_is_a_break() -> None:
    files, graph = artefacts("research-7500")
    pod_spec(resource(graph, "Deployment", "kubelet-csr-approver"))["nodeSelector"] = {"kilonode.io/pool": "h100-ib"}
    pod_spec(resource(graph, "Deployment", "kubelet-csr-approver"))["tolerations"] = [{"operator": "Exists"}]
    del pod_spec(resource(graph, "Deployment", "kubelet-csr-approver"))["affinity"]  # the system pool's alone
    found = by_where(findings("research-7500", files=files, graph=graph))
    assert "only waves starting by minute 0 count: 0 node(s) that admit it, 2,500 more in later waves" in \
        found["Deployment kube-system/kubelet-csr-approver"]


def test_the_dns_autoscaler_asks_only_for_nodes_coredns_may_use() -> None:
    """CoreDNS's replicas are its autoscaler's: the selector names the pools without taints but
    the GPU startup one, team nodes excluded, and at the ceiling it asks for the plan's count."""
    import math

    from tests import shared

    dns = shared.plan("research-7500").components.dns_autoscale
    assert dns.node_selector == "kilonode.io/pool in (a100-ib,h100-ib,system),!kilonode.io/team"
    assert math.ceil(dns.eligible_nodes / dns.nodes_per_replica) >= dns.max_replicas == 31
    assert dns.eligible_nodes == 3 + 1000 + 2500  # the system pool, a100-ib's untaken nodes, h100-ib
    _, graph = artefacts("research-7500")
    assert "replicas" not in resource(graph, "Deployment", "coredns")["inputs"]["spec"]
    args = resource(graph, "Deployment", "coredns-autoscaler")["inputs"]["spec"]["template"]["spec"]["containers"][0]
    assert f"--nodelabels={dns.node_selector}" in args["args"] and "--target=deployment/coredns" in args["args"]


def test_a_gpu_pool_admitting_more_pods_than_it_has_pod_ips_is_a_break() -> None:
    """The issue's case: maxPods 11 (3 pod IPs + 8 assumed hostNetwork pods) while 7 DaemonSets
    run there: the scheduler places 4 pod-network pods on a node with 3 addresses."""
    files, graph = artefacts("research-7500")
    config = yaml.safe_load(files[f"pool-h100-ib/{KUBELET_CONFIG}"])
    config["maxPods"] = 11
    files[f"pool-h100-ib/{KUBELET_CONFIG}"] = yaml.safe_dump(config)
    found = by_where(findings("research-7500", files=files, graph=graph))
    assert found["pool-h100-ib"].startswith(
        "the kubelet admits 11 pods (maxPods): 7 DaemonSet pods and 0 of the stack's own hostNetwork pods leave room "
        "for 4 more, but a node has 3 pod IP(s) for them"), found["pool-h100-ib"]
    assert "pool-a100-ib" not in found


def test_a_daemonset_off_the_host_network_takes_a_pod_ip_the_max_pods_did_not_count() -> None:
    files, graph = artefacts("research-7500")
    pod_spec(resource(graph, "DaemonSet", "nvidia-device-plugin-daemonset"))["hostNetwork"] = False
    found = by_where(findings("research-7500", files=files, graph=graph))
    assert "leave room for 3 more, but a node has 2 pod IP(s) for them (podsPerNode 3 less 1 for non-hostNetwork " \
           "DaemonSet pods)" in found["pool-h100-ib"]


def test_a_user_pod_without_the_critical_addons_toleration_stays_off_the_system_pool() -> None:
    """Seeded break: the system pool is tainted CriticalAddonsOnly (kilonode.plan.wellknown.SYSTEM_TAINT);
    a pod of a user's namespace that asks for it without tolerating the taint is placed nowhere,
    and the cluster's own workloads that prefer it tolerate it (the shipped stacks place them)."""
    files, graph = artefacts("research-2500")
    approver = resource(graph, "Deployment", "kubelet-csr-approver")
    approver["inputs"]["metadata"]["namespace"] = "team-a"
    pod_spec(approver)["nodeSelector"] = {"kilonode.io/pool": "system"}
    pod_spec(approver)["tolerations"] = []
    found = by_where(findings("research-2500", files=files, graph=graph))
    assert "CriticalAddonsOnly=true:NoSchedule not tolerated" in found["Deployment team-a/kubelet-csr-approver"]
    # the same pod tolerating it lands there
    files, graph = artefacts("research-2500")
    approver = resource(graph, "Deployment", "kubelet-csr-approver")
    approver["inputs"]["metadata"]["namespace"] = "team-a"
    pod_spec(approver)["nodeSelector"] = {"kilonode.io/pool": "system"}
    pod_spec(approver)["tolerations"] = [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert "Deployment team-a/kubelet-csr-approver" not in by_where(findings("research-2500", files=files, graph=graph))


def test_every_workload_that_prefers_the_system_pool_tolerates_its_taint(shipped: str) -> None:
    _, graph = artefacts(shipped)
    for record in graph["resources"]:
        if record["type"].rsplit(":", 1)[-1] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        spec = pod_spec(record)
        preferred = (spec.get("affinity") or {}).get("nodeAffinity", {}).get(
            "preferredDuringSchedulingIgnoredDuringExecution", [])
        if any(e["key"] == "kilonode.io/system" for term in preferred for e in term["preference"]["matchExpressions"]):
            assert any(t.get("key") in ("CriticalAddonsOnly", None) and t.get("operator") == "Exists"
                       for t in spec.get("tolerations") or []), record["inputs"]["metadata"]["name"]
