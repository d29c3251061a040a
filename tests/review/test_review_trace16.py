"""The sixteenth independent trace of `kilonode diff` on research-7500: what each finding of five
PRs said only in part, each boundary on the shipped stack changed in memory (tests.review.snapshots),
with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import preflight_break
from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _resource(entry: dict[str, Any], type_: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == type_ and r["name"] == name]
    return found


def _coredns_policy(entry: dict[str, Any]) -> dict[str, Any]:
    return _resource(entry, "kubernetes:networking.k8s.io/v1:NetworkPolicy",
                     f"{STACK}-k8s-kube-system-policies-coredns")


def _dns_breaks(head: dict[str, Any]) -> list[str]:
    return [b.summary for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
            if "served-to-every-pod" in b.summary]


# --- PR 4: CoreDNS's policy narrowed to every namespace's pods -----------------------------------


def test_dns_refusing_node_addresses_alone_says_host_network_pods_lose_dns() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}]
    [summary] = _dns_breaks(head)
    assert "hostNetwork pods (dnsPolicy ClusterFirstWithHostNet) and processes on the nodes lose DNS" in summary
    assert "pod-network pods keep resolving" in summary
    assert "no Service name resolves anywhere" not in summary


def test_dns_refusing_pods_keeps_the_cluster_wide_sentence() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    [summary] = _dns_breaks(head)
    assert "no Service name resolves anywhere in the cluster" in summary
    assert "pod-network pods keep resolving" not in summary


def test_dns_host_only_sentence_needs_kube_proxy_keeping_pod_addresses() -> None:
    import yaml
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}]
    [proxy] = [r["inputs"] for r in head["resources"] if r["type"] == "kubernetes:core/v1:ConfigMap"
               and r["inputs"]["metadata"]["name"] == "kube-proxy"]
    config = yaml.safe_load(proxy["data"]["config.conf"])
    config["masqueradeAll"] = True  # every packet to a ClusterIP leaves with the node's address
    proxy["data"]["config.conf"] = yaml.safe_dump(config)
    assert any("no Service name resolves anywhere in the cluster" in s for s in _dns_breaks(head))


def test_dns_policy_admitting_every_source_says_nothing() -> None:
    head = snapshot(STACK)
    rule = _coredns_policy(head)["spec"]["ingress"][0]  # 53 over UDP and TCP
    rule["from"] = [{"namespaceSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert _dns_breaks(head) == []


# --- PR 5: metrics-server off the port the apiservers call --------------------------------------


def _metrics_server_port(head: dict[str, Any], port: int) -> None:
    from tests.review.snapshots import pod_spec
    [container] = [c for c in pod_spec(head, "Deployment", "metrics-server")["containers"]
                   if c["name"] == "metrics-server"]
    container["args"] = [f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in container["args"]]
    for declared in container["ports"]:
        declared["containerPort"] = port


def test_metrics_server_unreachable_says_namespace_deletion_stalls() -> None:
    head = snapshot(STACK)
    _metrics_server_port(head, 4443)
    [summary] = [b.summary for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
                 if "metricsServer/apiserver-reach" in b.summary]
    assert "namespace deletion stalls cluster-wide" in summary
    assert "NamespaceDeletionDiscoveryFailure" in summary


def test_metrics_server_on_its_own_port_says_nothing() -> None:
    head = snapshot(STACK)
    _metrics_server_port(head, 10250)
    assert [b for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
            if "apiserver-reach" in b.summary] == []


# --- PR 12: Prometheus --query.timeout 30s -> 2m ------------------------------------------------


def _query_timeout(head: dict[str, Any], timeout: str) -> None:
    from tests.review.snapshots import pod_spec
    [container] = [c for c in pod_spec(head, "StatefulSet", "prometheus")["containers"] if c["name"] == "prometheus"]
    container["args"] = [f"--query.timeout={timeout}" if a.startswith("--query.timeout=") else a
                         for a in container["args"]]
    head["files"]["plan.yaml"] = head["files"]["plan.yaml"].replace("queryTimeout: 30s", f"queryTimeout: {timeout}")


def test_query_timeout_past_the_evaluation_interval_says_rules_queue_behind_dashboards() -> None:
    from kilonode.review import value_effects
    from kilonode.review.finding import MEDIUM
    head = snapshot(STACK)
    _query_timeout(head, "2m")
    [line] = [f for f in value_effects.assess(compare_stack(STACK, snapshot(STACK), head))
              if "prometheus-query-timeout-past-evaluation" in f.summary]
    assert line.level == MEDIUM
    assert "--query.timeout 30s -> 2m" in line.summary
    assert "--query.max-concurrency" in line.summary and "rules.EngineQueryFunc" in line.summary


def test_query_timeout_within_the_evaluation_interval_says_nothing() -> None:
    from kilonode.review import value_effects
    head = snapshot(STACK)
    _query_timeout(head, "20s")
    assert [f for f in value_effects.assess(compare_stack(STACK, snapshot(STACK), head))
            if "prometheus-query-timeout" in f.summary] == []


def test_prometheus_restart_names_a_behaviour_flag_as_behaviour_not_sizing() -> None:
    from kilonode.review import incluster
    head = snapshot(STACK)
    _query_timeout(head, "2m")
    [line] = [f for f in incluster.assess(compare_stack(STACK, snapshot(STACK), head))
              if f.rule == "prometheus-restarted"]
    assert "its sizing only" not in line.summary
    assert "a change of behaviour, not of sizing" in line.summary
    assert "prometheus.queryTimeout 30s -> 2m" in line.summary


def test_duration_predicate_reads_prometheus_durations() -> None:
    from kilonode.review.value_effects import prometheus_seconds
    assert prometheus_seconds("1h30m") == 5400 and prometheus_seconds("2m") == 120 and prometheus_seconds("0") == 0
    assert prometheus_seconds("30") is None and prometheus_seconds("m") is None and prometheus_seconds("1m1h") is None


# --- PR 7: a NoSchedule taint on the autoscaled GPU pool -----------------------------------------

GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"


def _taint_pool(head: dict[str, Any], pool: str, taint: str, balloon_tolerates: bool = True) -> None:
    import yaml
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    [found] = [p for p in plan["nodePools"] if p["name"] == pool]
    found["taints"] = [*found.get("taints", []), taint]
    head["files"]["plan.yaml"] = yaml.safe_dump(plan, sort_keys=False)
    if balloon_tolerates:  # kilonode.k8s.capacity balloon_tolerations: the pool's own taints
        from tests.review.snapshots import pod_spec
        key, _, rest = taint.partition("=")
        value, _, effect = rest.partition(":")
        spec = pod_spec(head, "Deployment", f"balloon-{pool}")
        spec["tolerations"] = [*spec.get("tolerations", []),
                               {"key": key, "operator": "Equal", "value": value, "effect": effect}]


def _loops(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import lifecycle
    return [f for f in lifecycle.registration(compare_stack(STACK, snapshot(STACK), head))
            if f.rule == "autoscaler-template-untainted"]


def test_taint_on_an_autoscaled_pool_says_scale_ups_loop_up_to_its_max() -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    _taint_pool(head, "h100-ib", GPU_TAINT)
    [line] = _loops(head)
    assert line.level == HIGH and line.subjects == ("h100-ib",)
    assert "up to the pool's max, 2,500 nodes" in line.summary
    assert "mixed_nodeinfos_processor.go" in line.summary and "run without ExtendedResourceToleration" in line.summary
    assert "Deployment" not in line.summary  # the balloons tolerate the pool's own taints


def test_taint_the_stack_own_workload_does_not_tolerate_is_named() -> None:
    head = snapshot(STACK)
    _taint_pool(head, "h100-ib", GPU_TAINT, balloon_tolerates=False)
    [line] = _loops(head)
    assert "balloon-h100-ib" in line.summary


def test_taint_every_gpu_pod_tolerates_through_the_admission_plugin_says_nothing() -> None:
    head = snapshot(STACK)
    _taint_pool(head, "h100-ib", GPU_TAINT)
    for path in [p for p in head["files"] if p.endswith("/kube-apiserver.service")]:
        head["files"][path] = head["files"][path].replace(
            "--enable-admission-plugins=NodeRestriction,", "--enable-admission-plugins=ExtendedResourceToleration,"
            "NodeRestriction,")
    assert _loops(head) == []


def test_prefer_no_schedule_or_a_fixed_pool_says_nothing() -> None:
    head = snapshot(STACK)
    _taint_pool(head, "h100-ib", "example.com/soft=yes:PreferNoSchedule")
    assert _loops(head) == []
    head = snapshot(STACK)
    _taint_pool(head, "a100-ib", GPU_TAINT, balloon_tolerates=False)  # not autoscaled: no template to go stale
    assert _loops(head) == []


# --- PR 16: Felix's endpoint-to-host action ACCEPT -> DROP ---------------------------------------


def _endpoint_to_host(head: dict[str, Any], action: str) -> None:
    from tests.review.snapshots import pod_spec
    [container] = [c for c in pod_spec(head, "DaemonSet", "calico-node")["containers"] if c["name"] == "calico-node"]
    [env] = [e for e in container["env"] if e["name"] == "FELIX_DEFAULTENDPOINTTOHOSTACTION"]
    env["value"] = action


def _felix_lines(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import value_effects
    return [f for f in value_effects.assess(compare_stack(STACK, snapshot(STACK), head))
            if "felix-endpoint-to-host-drop" in f.summary]


def test_felix_dropping_pod_to_own_host_names_kilonode_own_flows() -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    _endpoint_to_host(head, "DROP")
    [line] = _felix_lines(head)
    assert line.level == HIGH and "ACCEPT -> DROP" in line.summary
    assert "kilonode-node-exporter" in line.summary and "metrics-server" in line.summary
    assert "config_params.go:330" in line.summary


def test_felix_return_or_accept_says_nothing() -> None:
    head = snapshot(STACK)
    _endpoint_to_host(head, "RETURN")
    assert _felix_lines(head) == []


# --- PR 15: deployer.cidrs 198.51.100.0/24 -> 20.0.0.0/8 -----------------------------------------


def _deployer_cidr(head: dict[str, Any], old: str, new: str) -> None:
    for r in head["resources"]:
        inputs = r["inputs"]
        for rule in inputs.get("securityRules") or []:
            rule["sourceAddressPrefixes"] = [new if p == old else p for p in rule.get("sourceAddressPrefixes") or []]
        for ip in (inputs.get("networkRuleSet") or {}).get("ipRules") or []:
            if ip["iPAddressOrRange"] == old:
                ip["iPAddressOrRange"] = new


def _exposure(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import network
    return network.exposure_grown(compare_stack(STACK, snapshot(STACK), head))


def test_deployer_range_widened_to_a_provider_space_is_high_with_counts_and_targets() -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    _deployer_cidr(head, "198.51.100.0/24", "20.0.0.0/8")
    [line] = _exposure(head)
    assert line.level == HIGH and line.rule == "exposure-grown"
    assert "256 -> 16,777,216 public addresses" in line.summary
    assert "6443" in line.summary and "every Secret" in line.summary and "VHDs" in line.summary
    assert "deployer.network: peered" in line.summary


def test_deployer_range_grown_a_little_is_medium() -> None:
    from kilonode.review.finding import MEDIUM
    head = snapshot(STACK)
    _deployer_cidr(head, "198.51.100.0/24", "198.51.100.0/23")
    [line] = _exposure(head)
    assert line.level == MEDIUM and "256 -> 512 public addresses" in line.summary


def test_deployer_range_moved_at_the_same_size_or_narrowed_says_nothing() -> None:
    head = snapshot(STACK)
    _deployer_cidr(head, "198.51.100.0/24", "203.0.113.0/24")
    assert _exposure(head) == []
    head = snapshot(STACK)
    _deployer_cidr(head, "198.51.100.0/24", "198.51.100.7/32")
    assert _exposure(head) == []
