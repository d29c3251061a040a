"""A twelfth independent trace of `kilonode diff` on research-7500 (12b) found "No risk found" for four changes
that break nothing at `pulumi up` and only show later (kilonode.review.serving): the apiserver load balancers'
probe moved from /readyz to /livez (lb-probe-not-readiness), kube-proxy moved to iptables under Felix's nftables
mode (proxy-felix-mode-mismatch), kube-proxy's maxUnavailable 10% -> 100% (daemonset-pacing-raised), and the etcd
quota alerts' thresholds 0.7/0.85 -> 0.95/0.98 (alert-threshold-weakened)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import alerting, serving
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot, workload
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULES = ("monitoring", "kilonode-prometheus", "kilonode-rules.yaml")


def _risks(head: dict[str, Any], rule: str) -> list[Risk]:
    return [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def _config_map(entry: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    [found] = [r["inputs"]["data"] for r in entry["resources"] if r["type"] == alerting.CONFIG_MAP
               and (r["inputs"]["metadata"].get("namespace"), r["inputs"]["metadata"]["name"]) == (namespace, name)]
    return found


def _probe_path(entry: dict[str, Any], path: str, only: str = "") -> None:
    for r in entry["resources"]:
        if r["type"] == serving.LOAD_BALANCER and only in r["name"]:
            for probe in r["inputs"].get("probes") or []:
                probe["requestPath"] = path


def _proxy_mode(entry: dict[str, Any], mode: str) -> None:
    data = _config_map(entry, "kube-system", "kube-proxy")
    assert "mode: nftables\n" in data["config.conf"]
    data["config.conf"] = data["config.conf"].replace("mode: nftables\n", f"mode: {mode}\n")


def _felix(entry: dict[str, Any], value: str) -> None:
    [container] = [c for c in pod_spec(entry, "DaemonSet", "calico-node")["containers"] if c["name"] == "calico-node"]
    [env] = [e for e in container["env"] if e["name"] == serving.FELIX_NFTABLES]
    env["value"] = value


def _rules(entry: dict[str, Any], old: str, new: str) -> None:
    data = _config_map(entry, RULES[0], RULES[1])
    assert old in data[RULES[2]], old
    data[RULES[2]] = data[RULES[2]].replace(old, new)


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_an_unchanged_shipped_stack_gives_nothing(stack: str) -> None:
    assert serving.assess(compare_stack(stack, snapshot(stack), snapshot(stack))) == []


def test_the_probe_moved_to_livez_is_high_and_says_what_is_lost() -> None:
    head = snapshot(STACK)
    _probe_path(head, "/livez")
    [risk] = _risks(head, "lb-probe-not-readiness")
    assert risk.level == HIGH
    assert set(risk.subjects) == {"research-7500-apiserver-lb", "research-7500-apiserver-public-lb"}
    assert "`/readyz` -> `/livez`" in risk.summary and "--shutdown-delay-duration" in risk.summary
    assert "terminating apiserver" in risk.summary and "Keep the probe on /readyz" in risk.summary


def test_one_load_balancer_moved_names_only_it() -> None:
    head = snapshot(STACK)
    _probe_path(head, "/healthz", only="public")
    [risk] = _risks(head, "lb-probe-not-readiness")
    assert risk.subjects == ("research-7500-apiserver-public-lb",)


def test_a_tcp_probe_without_a_path_is_reported() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == serving.LOAD_BALANCER:
            for probe in r["inputs"]["probes"]:
                probe.pop("requestPath")
                probe["protocol"] = "Tcp"
    [risk] = _risks(head, "lb-probe-not-readiness")
    assert "a Tcp probe with no path" in risk.summary


def test_kube_proxy_to_iptables_under_felix_nftables_is_high() -> None:
    head = snapshot(STACK)
    _proxy_mode(head, "iptables")
    [risk] = _risks(head, "proxy-felix-mode-mismatch")
    assert risk.level == HIGH
    assert "kube-proxy mode nftables -> iptables" in risk.summary
    assert "FELIX_NFTABLESMODE enabled" in risk.summary and "in one change, or neither" in risk.summary


def test_felix_alone_disabled_is_reported_and_both_moved_or_auto_are_not() -> None:
    head = snapshot(STACK)
    _felix(head, "Disabled")
    [risk] = _risks(head, "proxy-felix-mode-mismatch")
    assert "FELIX_NFTABLESMODE enabled -> disabled" in risk.summary
    _proxy_mode(head, "iptables")
    assert _risks(head, "proxy-felix-mode-mismatch") == []
    head = snapshot(STACK)
    _proxy_mode(head, "iptables")
    _felix(head, "Auto")
    assert _risks(head, "proxy-felix-mode-mismatch") == []


def test_kube_proxy_max_unavailable_to_100_percent_names_nodes_and_steps() -> None:
    head = snapshot(STACK)
    workload(head, "DaemonSet", "kube-proxy")["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "100%"
    [risk] = _risks(head, "daemonset-pacing-raised")
    assert risk.level == MEDIUM
    assert risk.subjects == ("DaemonSet kube-system/kube-proxy",)
    assert "maxUnavailable 10% -> 100%" in risk.summary and "(every node at once)" in risk.summary
    nodes = serving.placement.daemonset_nodes(compare_stack(STACK, snapshot(STACK), head), "kube-system",
                                              "kube-proxy")
    assert nodes
    total = sum(nodes.values())
    assert f"on {total:,} nodes" in risk.summary
    assert f"{-(-total // 10):,} -> {total:,} nodes per step" in risk.summary


def test_max_unavailable_lowered_is_not_reported() -> None:
    head = snapshot(STACK)
    workload(head, "DaemonSet", "kube-proxy")["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = "5%"
    assert _risks(head, "daemonset-pacing-raised") == []


def test_per_step_rounds_a_percentage_up() -> None:
    assert serving.per_step("10%", 7517) == 752
    assert serving.per_step(1, 7517) == 1
    assert serving.per_step("100%", 3) == 3
    assert serving.per_step("x%", 3) is None


def test_etcd_quota_thresholds_raised_say_before_after_and_headroom() -> None:
    head = snapshot(STACK)
    _rules(head, "kilonode:etcd_db_quota:ratio > 0.7\n", "kilonode:etcd_db_quota:ratio > 0.95\n")
    _rules(head, "kilonode:etcd_db_quota:ratio > 0.85\n", "kilonode:etcd_db_quota:ratio > 0.98\n")
    [risk] = _risks(head, "alert-threshold-weakened")
    assert risk.level == MEDIUM
    assert risk.subjects == ("KilonodeEtcdDatabaseNearQuota",)
    assert "KilonodeEtcdDatabaseNearQuota (warning): `> 0.7` -> `> 0.95`" in risk.summary
    assert "KilonodeEtcdDatabaseNearQuota (critical): `> 0.85` -> `> 0.98`" in risk.summary
    # 8 GiB quotas: 5% and 2% of them
    assert "`> 0.95`; it fires with main 410 MiB of 8.00 GiB, events 410 MiB of 8.00 GiB left" in risk.summary
    assert "`> 0.98`; it fires with main 164 MiB of 8.00 GiB, events 164 MiB of 8.00 GiB left" in risk.summary
    assert "ErrNoSpace" in risk.summary


def test_thresholds_lowered_are_not_reported_and_a_longer_for_is() -> None:
    head = snapshot(STACK)
    _rules(head, "kilonode:etcd_db_quota:ratio > 0.7\n", "kilonode:etcd_db_quota:ratio > 0.6\n")
    assert _risks(head, "alert-threshold-weakened") == []
    _rules(head, "ratio > 0.6\n    for: 10m\n", "ratio > 0.6\n    for: 1h\n")
    [risk] = _risks(head, "alert-threshold-weakened")
    assert "for: 10m -> 1h" in risk.summary


def test_comparison_reads_either_side_and_skips_others() -> None:
    assert serving.comparison("kilonode:x:ratio > 0.7") == (">", 0.7)
    assert serving.comparison("(0.2 > kilonode:x:ratio)") == ("<", 0.2)
    assert serving.comparison("rate(x[5m]) * 2") is None
    assert serving.comparison("a > b") is None
