"""The misjudgements a sixth independent trace of `kilonode diff` found on research-7500, each on the stack's
recorded snapshot changed by hand as the pull request changes it: a recording rule renamed under its alerts,
the DNS autoscaler's parameters cut, fewer apiservers, control-plane machines moved between zones, an
autoscaled pool's floor raised, and the wording of a kube-proxy mode switch and of Prometheus's sizing."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from kilonode.plan.resolve.components import apiserver_inflight
from kilonode.review import alerting, apiservers, capacity, coredns
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.lifecycle import RESTART_KEYS_OUTPUT
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _config_map(entry: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == CONFIG_MAP
               and (r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"]) == (namespace, name)]
    return found


def test_an_unchanged_stack_says_none_of_the_new_rules() -> None:
    found = risks(snapshot(STACK))
    for name in ("recording-rule-missing", "dns-replicas-cut", "apiserver-load", "autoscaler-min-not-enforced"):
        assert not rule(found, name)


# --- 1. a recording rule renamed under its alerts ---------------------------------------------------------------


def _rename_record(entry: dict[str, Any], old: str, new: str) -> None:
    rules = _config_map(entry, "monitoring", "kilonode-prometheus")["data"]
    assert f"record: {old}\n" in rules["kilonode-rules.yaml"]
    rules["kilonode-rules.yaml"] = rules["kilonode-rules.yaml"].replace(f"record: {old}\n", f"record: {new}\n")


def test_a_renamed_recording_rule_leaves_both_quota_alerts_unable_to_fire() -> None:
    head = snapshot(STACK)
    _rename_record(head, "kilonode:etcd_db_quota:ratio", "kilonode:etcd_db_quota:fraction")
    [missing] = rule(risks(head), "recording-rule-missing")
    assert missing.level == HIGH and missing.subjects == ("KilonodeEtcdDatabaseNearQuota",)
    assert missing.summary.startswith("kilonode:etcd_db_quota:ratio is no longer recorded by any recording rule")
    assert "as kilonode:etcd_db_quota:fraction: a rename the alerts did not follow" in missing.summary
    assert "can never fire" in missing.summary and "promtool" in missing.summary


def test_a_record_an_alert_reads_through_another_record_is_followed() -> None:
    """KilonodeEtcdNoSpace reads kilonode:etcd_db_quota_headroom:bytes: renaming that one names it alone."""
    head = snapshot(STACK)
    _rename_record(head, "kilonode:etcd_db_quota_headroom:bytes", "kilonode:etcd_db_headroom:bytes")
    [missing] = alerting.records_missing(compare_stack(STACK, snapshot(STACK), head))
    assert missing.subjects == ("KilonodeEtcdNoSpace",)


def test_a_colon_name_the_base_never_recorded_is_not_this_rule() -> None:
    """Only a name the base recorded: an alert on a name nobody ever recorded is not a change's doing here."""
    head = snapshot(STACK)
    rules = _config_map(head, "monitoring", "kilonode-prometheus")["data"]
    rules["kilonode-rules.yaml"] = rules["kilonode-rules.yaml"].replace(
        "expr: kilonode:etcd_db_quota:ratio > 0.7", "expr: kilonode:never_recorded:ratio > 0.7")
    assert alerting.records_missing(compare_stack(STACK, snapshot(STACK), head)) == []


# --- 2. the DNS autoscaler's parameters ---------------------------------------------------------------------------


def _dns_params(entry: dict[str, Any], **params: Any) -> None:
    data = _config_map(entry, "kube-system", "coredns-autoscaler")["data"]
    data["linear"] = json.dumps({**json.loads(data["linear"]), **params}, sort_keys=True)


def test_dns_nodes_per_replica_1000_cuts_coredns_from_31_to_8_at_once() -> None:
    head = snapshot(STACK)
    _dns_params(head, max=8, nodesPerReplica=437.87)  # what DNS_NODES_PER_REPLICA = 1000 renders
    [cut] = rule(risks(head), "dns-replicas-cut")
    assert cut.level == HIGH and cut.subjects == ("ConfigMap kube-system/coredns-autoscaler",)
    assert "max 31 -> 8" in cut.summary and "nodesPerReplica 113.0 -> 437.87" in cut.summary
    assert "gives 31 CoreDNS replicas at the base and 8 at the head (23 fewer)" in cut.summary
    assert "every 10s" in cut.summary and "getExpectedReplicasFromParams" in cut.summary
    assert "coredns PodDisruptionBudget does not pace it" in cut.summary
    assert "serves 438 nodes instead of 113" in cut.summary


def test_a_cut_by_half_or_less_is_medium_and_a_raise_is_nothing() -> None:
    head = snapshot(STACK)
    _dns_params(head, max=16)
    [cut] = coredns.replicas_cut(compare_stack(STACK, snapshot(STACK), head))
    assert cut.level == MEDIUM and "31 CoreDNS replicas at the base and 16 at the head" in cut.summary
    head = snapshot(STACK)
    _dns_params(head, max=40, nodesPerReplica=80.0)
    assert coredns.replicas_cut(compare_stack(STACK, snapshot(STACK), head)) == []


@pytest.mark.parametrize(("params", "nodes", "expected"), [
    ({"nodesPerReplica": 113.0, "min": 2, "max": 31}, 3503, 31),
    ({"nodesPerReplica": 437.87, "min": 2, "max": 8}, 3503, 8),
    ({"nodesPerReplica": 16, "min": 0}, 1, 1),  # min 0 is read as 1 (parseParams)
    ({"nodesPerReplica": 16, "min": 1, "preventSinglePointFailure": True}, 2, 2),
    ({"nodesPerReplica": 16, "coresPerReplica": 4, "min": 1}, 2, 2),  # the larger of nodes' and cores'
])
def test_the_count_is_the_linear_controllers(params: dict[str, Any], nodes: int, expected: int) -> None:
    assert coredns.expected_replicas(params, nodes, cores=8) == expected


# --- 3. fewer apiservers ------------------------------------------------------------------------------------------


def _apiservers(entry: dict[str, Any], keep: int, nodes: int) -> None:
    reads, mutating = apiserver_inflight(nodes, keep)
    files = entry["files"]
    for path in list(files):
        host = path.split("/", 1)[0]
        if host.startswith("apiserver-") and int(host.rsplit("-", 1)[1]) >= keep:
            del files[path]
        elif host.startswith("apiserver-") and path.endswith("kube-apiserver.service"):
            text = files[path]
            text = flags_set(text, "--max-requests-inflight", reads)
            files[path] = flags_set(text, "--max-mutating-requests-inflight", mutating)


def flags_set(text: str, flag: str, value: int) -> str:
    return re.sub(rf"{flag}=\d+", f"{flag}={value}", text)


def test_three_apiservers_of_five_carry_every_watch_and_double_their_inflight_limits() -> None:
    head = snapshot(STACK)
    _apiservers(head, 3, 7504)
    reads, mutating = apiserver_inflight(7504, 3)
    assert (reads, mutating) != apiserver_inflight(7504, 5)
    [load] = rule(risks(head), "apiserver-load")
    assert load.level == MEDIUM and load.subjects == ("apiserver.replicas",)
    assert "apiservers 5 -> 3" in load.summary
    assert "7,504 nodes, about 1,501 -> 2,501 per server, +67% each" in load.summary
    assert f"--max-requests-inflight 1,827 -> {reads:,}" in load.summary
    assert f"--max-mutating-requests-inflight 500 -> {mutating:,}" in load.summary
    assert f"5 x 2,327 = 11,635 -> 3 x {reads + mutating:,} = {3 * (reads + mutating):,}" in load.summary
    assert "etcd's load" in load.summary and "prefer resizing the apiservers up first" in load.summary


def test_more_apiservers_is_not_this_rule() -> None:
    head = snapshot(STACK)
    _apiservers(head, 4, 7504)
    assert len(apiservers.assess(compare_stack(STACK, snapshot(STACK), head))) == 1
    assert apiservers.assess(compare_stack(STACK, head, snapshot(STACK))) == []


# --- 4. zones ["1", "2"]: the control plane's zone moves ----------------------------------------------------------

ZONES = {"etcd-main-2": "1", "etcd-main-3": "2", "etcd-main-4": "1", "etcd-events-2": "1",
         "apiserver-2": "1", "apiserver-3": "2", "apiserver-4": "1"}


def _zones(entry: dict[str, Any], moves: dict[str, str]) -> None:
    named = {f"{STACK}-{machine}": zone for machine, zone in moves.items()}
    for r in entry["resources"]:
        if r["name"] in named:
            r["inputs"]["zones"] = [named[r["name"]]]
    for group in entry["outputs"][RESTART_KEYS_OUTPUT].values():
        for name, key in group.items():
            if name in named:
                key["zone"] = named[name]


def test_dropping_a_zone_says_delete_and_recreate_not_roll() -> None:
    head = snapshot(STACK)
    _zones(head, ZONES)
    found = risks(head)
    [quorum] = rule(found, "etcd-quorum")
    assert quorum.level == HIGH
    assert "3 move zone (etcd-main-2 3 -> 1, etcd-main-3 1 -> 2, etcd-main-4 2 -> 1)" in quorum.summary
    assert "PropertyChangeNotAllowed" in quorum.summary and "deleted and created again" in quorum.summary
    assert "not restarted" in quorum.summary and "loses its data" in quorum.summary
    assert "etcdctl member remove" in quorum.summary and "protected" in quorum.summary
    assert "roll one member at a time" not in quorum.summary
    [events] = rule(found, "etcd-restarted")
    assert "1 moves zone (etcd-events-2 3 -> 1)" in events.summary
    assert "2 keep quorum while it is gone" in events.summary
    [api] = rule(found, "apiservers-restarted")
    assert "3 move zone" in api.summary and "deleted and created again" in api.summary
    assert "the others serve meanwhile" not in api.summary and "restart or are replaced" not in api.summary
    assert rule(found, "update-refused")


def test_a_restart_without_a_zone_move_keeps_the_rolling_advice() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == "azure-native:compute:VirtualMachine" and r["name"].startswith(f"{STACK}-etcd-main-"):
            r["inputs"]["hardwareProfile"]["vmSize"] = "Standard_D32ds_v5"
    [quorum] = rule(risks(head), "etcd-quorum")
    assert "move zone" not in quorum.summary and "roll one member at a time" in quorum.summary


# --- 5. an autoscaled pool's floor raised -------------------------------------------------------------------------


def _floors(entry: dict[str, Any], pool: str, low: int, enforce: bool = False) -> None:
    [container] = workload(entry, "Deployment", "cluster-autoscaler")["spec"]["template"]["spec"]["containers"]
    key = "args" if container.get("args") else "command"
    container[key] = [(f"--nodes={low}:{w.split(':')[1]}:{w.split(':', 2)[2]}"
                       if w.startswith("--nodes=") and f"-{pool}-" in w else w) for w in container[key]]
    if enforce:
        container[key].append("--enforce-node-group-min-size=true")


def test_min_nodes_2000_on_h100_ib_is_told_nothing_scales_up() -> None:
    head = snapshot(STACK)
    _floors(head, "h100-ib", 80)
    [floor] = rule(risks(head), "autoscaler-min-not-enforced")
    assert floor.level == MEDIUM and len(floor.subjects) == 25
    assert floor.summary.startswith("pool h100-ib: the autoscaler's floor over 25 node group(s) rises from 1,250 "
                                    "to 2,000 nodes, but nothing will scale them up to it")
    assert "FAQ.md" in floor.summary and "--enforce-node-group-min-size" in floor.summary
    assert "its live size back" in floor.summary and "az vmss scale --new-capacity" in floor.summary


def test_with_the_flag_or_a_lower_floor_it_is_not_said() -> None:
    head = snapshot(STACK)
    _floors(head, "h100-ib", 80, enforce=True)
    assert capacity.min_not_enforced(compare_stack(STACK, snapshot(STACK), head)) == []
    head = snapshot(STACK)
    _floors(head, "h100-ib", 50)
    assert capacity.min_not_enforced(compare_stack(STACK, snapshot(STACK), head)) == []


# --- 6. wording: kube-proxy's mode, Prometheus's sizing ------------------------------------------------------------


def test_a_kube_proxy_mode_switch_says_each_node_cleans_and_resyncs() -> None:
    head = snapshot(STACK)
    data = _config_map(head, "kube-system", "kube-proxy")["data"]
    assert "mode: nftables\n" in data["config.conf"]
    data["config.conf"] = data["config.conf"].replace("mode: nftables\n", "mode: iptables\n")
    workload(head, "DaemonSet", "kube-proxy")["spec"]["template"]["metadata"]["annotations"] = {
        "kilonode.io/config-sha256": "0" * 64}
    [rollout] = [r for r in rule(risks(head), "daemonset-rollout") if "kube-proxy" in r.summary]
    assert "The kube-proxy mode changes (nftables -> iptables)" in rollout.summary
    assert "platformCleanup" in rollout.summary and "unprogrammed for that window" in rollout.summary


def test_a_kube_proxy_config_change_without_a_mode_switch_is_a_plain_rollout() -> None:
    head = snapshot(STACK)
    workload(head, "DaemonSet", "kube-proxy")["spec"]["template"]["metadata"]["annotations"] = {
        "kilonode.io/config-sha256": "0" * 64}
    [rollout] = [r for r in rule(risks(head), "daemonset-rollout") if "kube-proxy" in r.summary]
    assert "platformCleanup" not in rollout.summary


def test_prometheus_restarted_by_its_sizing_names_what_moved_it() -> None:
    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    [pool] = [p for p in plan["nodePools"] if p["name"] == "h100-ib"]
    pool["podsPerNode"] = 8
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    [container] = pod_spec(head, "StatefulSet", "prometheus")["containers"]
    container["resources"]["limits"]["memory"] = container["resources"]["requests"]["memory"] = "70Gi"
    [restart] = rule(risks(head), "prometheus-restarted")
    assert "its sizing only" in restart.summary and "pool h100-ib podsPerNode 3 -> 8" in restart.summary
    assert "pool-size change alone" not in restart.summary
