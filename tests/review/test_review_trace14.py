"""A fourteenth independent trace of `kilonode diff` on research-7500, each on the recorded snapshot
changed as the pull request changes it:

A. PRs 11 and 14: `pulumi up` PUTs the model of every autoscaled scale set it updates, with the size
   read at the run's start, whatever rule judges the cause (a join-token rotation, an inert custom data
   change): one `autoscaled-model-put` line says to pause the autoscaler, once per review, not only
   under fleet-rollout.
B. PR 05: `--scale-down-unneeded-time` 30m -> 5m at the shipped GPU threshold (one millionth) evicts no
   gang pod (only a GPU node with no GPU requested is a candidate): the line says churn and the Permit
   window, medium; gang eviction stays where the thresholds let a running GPU pod go.
C. PR 01: `net.core.somaxconn` set on the nodes is per network namespace and new namespaces start at the
   kernel's 4096: pods keep it (`sysctl-not-in-pods`)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.catalog.sysctls import sysctls
from kilonode.render.pool import SYSCTL_FILE
from kilonode.review import autoscaler, sysctl_netns
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot
from tests.review.test_review_trace import _rotated

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
PUT = "autoscaled-model-put"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def test_the_shipped_stack_says_none_of_the_new_lines() -> None:
    found = risks(snapshot(STACK))
    assert not rule(found, PUT) and not rule(found, sysctl_netns.RULE)


# --- A. the autoscaler race follows the PUT, not the rule ------------------------------------------------------------


def test_a_join_token_rotation_that_puts_the_autoscaled_models_says_to_pause_the_autoscaler() -> None:
    found = risks(_rotated())
    assert not rule(found, "fleet-rollout") and rule(found, "join-token-rotated")
    [put] = rule(found, PUT)
    assert put.level == MEDIUM and len(put.subjects) == 25 and all("-h100-ib-" in s for s in put.subjects)
    assert "25 autoscaled scale set(s)" in put.summary and "--replicas=0" in put.summary
    assert "removed with no drain" in put.summary


def test_custom_data_that_changes_nothing_running_still_puts_the_autoscaled_models() -> None:
    """custom-data-inert's decision (no rollout) leaves the PUT: the same line, from the resources."""
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS and "-h100-ib-" in r["name"]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:1111]"
    [put] = rule(risks(head), PUT)
    assert len(put.subjects) == 25


def test_a_fleet_rollout_says_the_race_once_in_its_own_line() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS and "-ib-" in r["name"]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:0000]"
    found = risks(head)
    assert rule(found, "fleet-rollout") and not [r for r in rule(found, "fleet-rollout") if "--replicas=0" in r.summary]
    [put] = rule(found, PUT)
    assert len(put.subjects) == 25, "the fixed a100-ib scale sets are not autoscaled"
    assert sum("--replicas=0" in r.summary for r in found) == 1


def test_a_capacity_moved_alone_is_no_put() -> None:
    """sku.capacity is under ignoreChanges: its change alone sends nothing."""
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS and "-h100-ib-" in r["name"]:
            r["inputs"].setdefault("sku", {})["capacity"] = 7
    assert not rule(risks(head), PUT)


# --- B. scale-down at the shipped GPU threshold: churn and the Permit window ------------------------------------------


def _autoscaler_args(entry: dict[str, Any], **flags: str) -> None:
    container = pod_spec(entry, "Deployment", "cluster-autoscaler")["containers"][0]
    args = [a for a in container["args"] if a.split("=", 1)[0][2:] not in flags]
    container["args"] = args + [f"--{k}={v}" for k, v in flags.items()]


def _scale_down(**flags: str) -> list[Any]:
    head = snapshot(STACK)
    _autoscaler_args(head, **flags)
    return autoscaler.scale_down_raised(compare_stack(STACK, snapshot(STACK), head))


def test_a_shorter_unneeded_time_at_the_shipped_threshold_is_churn_and_the_permit_window() -> None:
    [line] = _scale_down(**{"scale-down-unneeded-time": "5m"})
    assert line.level == MEDIUM and line.subjects == ("pool h100-ib",)
    assert "--scale-down-unneeded-time 30m -> 5m" in line.summary
    assert "gang pod evicted" not in line.summary and "no gang member, is evicted" in line.summary
    assert "any node with no GPU requested" in line.summary
    assert "deleted after 5m idle" in line.summary and "NODE_READY_MIN (30 min" in line.summary
    assert "Coscheduling holds its pods at Permit" in line.summary and "for up to 300 s" in line.summary
    assert "info.go" in line.summary


@pytest.mark.parametrize("flags", [
    {"scale-down-gpu-utilization-threshold": "0.5"},  # 4 of 8 GPUs requested is at the threshold: a candidate
    {"scale-down-gpu-utilization-threshold": "0.125"},  # one GPU of eight is at it
    {"scale-down-unneeded-time": "5m", "expendable-pods-priority-cutoff": "100"},  # pods below it count as none
])
def test_thresholds_that_let_a_running_gpu_pod_go_keep_gang_eviction(flags: dict[str, str]) -> None:
    [line] = _scale_down(**flags)
    assert line.level == HIGH and "a gang pod evicted stops its whole job" in line.summary
    assert "Permit" not in line.summary


def test_the_pinned_autoscaler_keeps_a_node_only_above_the_threshold() -> None:
    """eligibility.go isNodeAtOrBelowUtilizationThreshold at the pinned releases: Utilization > threshold
    keeps a node, so at 0.5 a node with 4 of 8 GPUs requested goes; one millionth keeps any GPU request."""
    [line] = _scale_down(**{"scale-down-gpu-utilization-threshold": "0.5"})
    assert "any node with 4 or fewer of its 8 GPUs requested" in line.summary
    assert autoscaler._threshold_gpus({"scale-down-gpu-utilization-threshold": "0.000001"}, 8) == 1
    assert autoscaler._threshold_gpus({"scale-down-gpu-utilization-threshold": "0"}, 8) == 1
    assert autoscaler._threshold_gpus({"scale-down-gpu-utilization-threshold": "0.125"}, 8) == 2


# --- C. a namespaced sysctl set on the nodes does not reach pods ------------------------------------------------------


def _sysctl(head: dict[str, Any], pool: str, line: str) -> None:
    head["files"][f"{pool}/{SYSCTL_FILE}"] += line + "\n"


def test_somaxconn_on_the_nodes_reaches_host_network_processes_only() -> None:
    head = snapshot(STACK)
    pools = sorted({p.split("/", 1)[0] for p in head["files"] if p.endswith(SYSCTL_FILE) and p.startswith("pool-")})
    for pool in pools:
        _sysctl(head, pool, "net.core.somaxconn = 8192")
    found = risks(head)
    [line] = rule(found, sysctl_netns.RULE)
    assert line.level == MEDIUM and len(line.subjects) == len(pools)
    assert "net.core.somaxconn unset -> 8192" in line.summary
    assert "reaches host-network processes only" in line.summary and "kernel's 4096" in line.summary
    assert "net_defaults_init_net" in line.summary and "securityContext.sysctls" in line.summary
    assert "--allowed-unsafe-sysctls" in line.summary and "no kubelet here does" in line.summary


def test_a_safe_namespaced_sysctl_says_pods_may_set_it() -> None:
    head = snapshot(STACK)
    _sysctl(head, "pool-cpu" if any(p.startswith("pool-cpu/") for p in head["files"]) else "pool-h100-ib",
            "net.ipv4.ip_local_port_range = 1024 65000")
    [line] = rule(risks(head), sysctl_netns.RULE)
    assert "32768 60999" in line.summary and "a safe sysctl" in line.summary


def test_a_key_new_namespaces_copy_from_the_host_is_not_said() -> None:
    head = snapshot(STACK)
    _sysctl(head, "pool-h100-ib", "net.ipv4.tcp_rmem = 4096 131072 16777216")
    assert not rule(risks(head), sysctl_netns.RULE)


def test_the_catalogue_records_the_namespace_facts_with_their_kernel_source() -> None:
    catalogue = sysctls()
    somaxconn = catalogue.key("net.core.somaxconn")
    assert somaxconn is not None and somaxconn.netns is not None
    assert somaxconn.netns.start == "default" and somaxconn.netns.default == "4096" and somaxconn.netns.safe is False
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        row = catalogue.key(key)
        assert row is not None and row.netns is not None and row.netns.start == "host"
    assert all("@v6.1" in row.netns.source for row in catalogue.keys.values() if row.netns)
