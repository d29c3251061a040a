"""promtool cases for the alerts research-7500's independent on-call trace (its remaining gaps) added: one node's
exporter down while the node is Ready, kube-system's node DaemonSets and CoreDNS short of pods (kube-state-metrics'
daemonset and deployment series), and the kubelet's PIDPressure. Registered into tests/monitoring/alert_cases.py's
CASES (imported at its end), so test_alert_cases.py runs them and counts them for its firing-and-quiet coverage."""

from __future__ import annotations

from kilonode.plan import ClusterPlan
from kilonode.render import monitoring
from tests.monitoring.alert_cases import Check, Series, case, expected, selector

KSM = monitoring.JOB_KUBE_STATE_METRICS
NE = monitoring.JOB_NODE_EXPORTER
DCGM = monitoring.JOB_DCGM_EXPORTER
NODE = "pool-a100-ib-000007"
POOL = "a100-ib"


# --- one node's exporter down on a Ready node ----------------------------------------------------------------------
def _exporter_on_node(job: str, up: str, ready: str) -> list[Series]:
    """`job`'s target on NODE (labelled as the scrape job labels it: node and pool from node discovery), a second
    node's healthy, and kube-state-metrics' Ready condition of both."""
    other = "pool-a100-ib-000008"
    return [(selector("up", {"job": job, "instance": "10.2.0.7:9400", "node": NODE, "pool": POOL}), up),
            (selector("up", {"job": job, "instance": "10.2.0.8:9400", "node": other, "pool": POOL}), "1x45"),
            (selector("kube_node_status_condition", {"job": KSM, "node": NODE, "condition": "Ready",
                                                     "status": "true"}), ready),
            (selector("kube_node_status_condition", {"job": KSM, "node": other, "condition": "Ready",
                                                     "status": "true"}), "1x45")]


@case(stack="research-7500")
def dcgm_exporter_down_on_one_ready_node(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeExporterDownOnReadyNode"
    labels = {"severity": "warning", "job": DCGM, "node": NODE, "pool": POOL}
    return _exporter_on_node(DCGM, "1x5 0x40", "1x45"), [
        ("15m", name, []),  # down 10 minutes: not yet
        ("30m", name, [expected(plan, name, labels)]),
    ]


@case(stack="research-7500")
def node_exporter_down_on_a_not_ready_node_is_the_nodes_story(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # the node went NotReady with its exporter: the node alerts' matter, not this one
    return _exporter_on_node(NE, "1x5 0x40", "1x5 0x40"), [("30m", "KilonodeExporterDownOnReadyNode", [])]


@case(stack="research-7500")
def exporters_answering_on_ready_nodes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    return _exporter_on_node(NE, "1x45", "1x45"), [("30m", "KilonodeExporterDownOnReadyNode", [])]


# --- kube-system's node DaemonSets ----------------------------------------------------------------------------------
def _daemonset(name: str, desired: int, unavailable: str) -> list[Series]:
    labels = {"job": KSM, "namespace": "kube-system", "daemonset": name}
    return [(selector("kube_daemonset_status_desired_number_scheduled", labels), f"{desired}x45"),
            (selector("kube_daemonset_status_number_unavailable", labels), unavailable)]


@case()
def kube_proxy_missing_on_a_few_nodes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 3 of 100 nodes without kube-proxy from minute 5: a warning, under the critical share
    name = "KilonodeDaemonSetPodsUnavailable"
    series = _daemonset("kube-proxy", 100, "0x5 3x40") + _daemonset("calico-node", 100, "0x45")
    warning = expected(plan, name, {"severity": "warning", "daemonset": "kube-proxy"})
    return series, [("15m", name, []), ("30m", name, [warning])]


@case()
def calico_node_missing_on_a_fifth_of_the_nodes(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # 20 of 100: above the critical share, and the warning as well
    name = "KilonodeDaemonSetPodsUnavailable"
    series = _daemonset("calico-node", 100, "0x5 20x40")
    return series, [("30m", name, [expected(plan, name, {"severity": "warning", "daemonset": "calico-node"}),
                                   expected(plan, name, {"severity": "critical", "daemonset": "calico-node"})])]


@case()
def node_daemonsets_all_available_or_not_watched(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # every pod available; a team's DaemonSet of kube-system not in the list is not this alert's
    series = _daemonset("node-exporter", 100, "0x45") + _daemonset("team-logger", 100, "50x45")
    return series, [("30m", "KilonodeDaemonSetPodsUnavailable", [])]


# --- CoreDNS ---------------------------------------------------------------------------------------------------------
def _coredns(unavailable: str) -> list[Series]:
    labels = {"job": KSM, "namespace": "kube-system", "deployment": monitoring.COREDNS_DEPLOYMENT}
    return [(selector("kube_deployment_spec_replicas", labels), "4x45"),
            (selector("kube_deployment_status_replicas_unavailable", labels), unavailable)]


@case()
def coredns_short_of_a_replica(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeCoreDnsReplicasUnavailable"
    labels = {"severity": "warning", "deployment": monitoring.COREDNS_DEPLOYMENT}
    return _coredns("0x5 1x40"), [("15m", name, []), ("30m", name, [expected(plan, name, labels)])]


@case()
def coredns_all_replicas_available(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    # a replica replaced for 3 minutes (a rollout) and back
    return _coredns("0x10 1x3 0x32"), [("30m", "KilonodeCoreDnsReplicasUnavailable", [])]


# --- PIDPressure ----------------------------------------------------------------------------------------------------
@case()
def a_node_reports_pid_pressure(plan: ClusterPlan) -> tuple[list[Series], list[Check]]:
    name = "KilonodeNodePressure"
    node = {"job": KSM, "node": "pool-a-000004"}
    series = [(selector("kube_node_status_condition", {**node, "condition": "PIDPressure", "status": "true"}),
               "0x10 1x30"),
              (selector("kube_node_status_condition", {**node, "condition": "PIDPressure", "status": "false"}),
               "1x10 0x30")]
    where = {"severity": "warning", "node": "pool-a-000004", "condition": "PIDPressure"}
    return series, [("15m", name, []), ("30m", name, [expected(plan, name, where)])]
