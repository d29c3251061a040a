"""The misjudgements a fifth independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed by hand as the pull request changes it: a Corefile change (the
`reload` plugin reaches every CoreDNS replica at once; `pods verified` past the memory limit), and a
priority level's shares cut (every apiserver applies it at once, before any roll)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from kilonode.review import coredns, flowcontrol
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
NODE_AGENTS = "kilonode-node-agents"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def test_an_unchanged_stack_says_neither() -> None:
    found = risks(snapshot(STACK))
    assert rule(found, "corefile-reloaded") == [] and rule(found, "apf-live-change") == []


# --- 1. the Corefile ----------------------------------------------------------------------------------------------


def _corefile(entry: dict[str, Any], old: str, new: str) -> None:
    [config] = [r["inputs"] for r in entry["resources"] if r["type"] == coredns.CONFIGMAP
                and r["inputs"]["metadata"]["name"] == "coredns"]
    assert old in config["data"]["Corefile"]
    config["data"]["Corefile"] = config["data"]["Corefile"].replace(old, new)


def _memory_limit(entry: dict[str, Any], limit: str) -> None:
    [container] = workload(entry, "Deployment", "coredns")["spec"]["template"]["spec"]["containers"]
    container["resources"]["limits"]["memory"] = limit


def test_any_corefile_change_is_medium_reaching_every_replica() -> None:
    head = snapshot(STACK)
    _corefile(head, "cache 30", "cache 60")
    [line] = rule(risks(head), "corefile-reloaded")
    assert line.level == MEDIUM and line.subjects == ("ConfigMap kube-system/coredns",)
    assert "reaches every CoreDNS replica at once, without a rollout" in line.summary
    assert "`reload` plugin" in line.summary and "30s +/- 15s" in line.summary
    assert "keeps the old configuration running" in line.summary
    assert "loads it at start and exits" in line.summary


def test_without_reload_the_replicas_keep_the_old_corefile_until_they_restart() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    _corefile(base, "    reload\n", "")
    _corefile(head, "    reload\n", "")
    _corefile(head, "cache 30", "cache 60")
    [line] = [f for f in coredns.assess(compare_stack(STACK, base, head))]
    assert line.level == MEDIUM and "until its pod restarts" in line.summary


def test_pods_verified_and_autopath_past_the_memory_limit_is_high_with_the_numbers() -> None:
    head = snapshot(STACK)
    _corefile(head, "pods insecure", "pods verified")
    _corefile(head, "    kubernetes cluster.local", "    autopath @kubernetes\n    kubernetes cluster.local")
    found = rule(risks(head), "corefile-reloaded")
    assert [f.level for f in found] == [HIGH, MEDIUM]
    high = found[0].summary
    assert "`pods verified` (for `autopath @kubernetes`, which needs it)" in high
    # the DaemonSets on 7,504 nodes (preflight's placement) and kilonode's replicas, plus the Services: the
    # figures move with what the stack runs (exporters, storage), so the line's arithmetic is checked, not a count
    pods, services, need = _estimate(high)
    assert pods > 50_000 and need == round((pods + services) / 250 + 56)
    assert "memory limit of 170Mi (178 MB)" in high and "all 31 replicas" in high
    assert "OOM-killed" in high and "cluster DNS is down" in high
    assert re.search(r"to at least \d+Mi", high) and "keep `pods insecure` at this scale" in high


def _estimate(summary: str) -> tuple[int, int, int]:
    """(pods, Services, MB) of the line's `(pods + services) / 250 + 56 = MB`."""
    found = re.search(r"\(([\d,]+) \+ (\d+)\) / 250 \+ 56 = (\d+) MB", summary)
    assert found, summary
    return int(found[1].replace(",", "")), int(found[2]), int(found[3])


@pytest.mark.parametrize(("below", "level"), [(True, HIGH), (False, None)])
def test_the_memory_boundary_is_the_limit(below: bool, level: str | None) -> None:
    # the estimate's MB at the shipped stack, then the MiB just under it and just over it
    probe = snapshot(STACK)
    _corefile(probe, "pods insecure", "pods verified")
    high = next(f for f in coredns.assess(compare_stack(STACK, snapshot(STACK), probe)) if f.level == HIGH).summary
    pods, services, _ = _estimate(high)
    need_mib = ((pods + services) / 250 + 56) * 1e6 / 2**20
    limit = f"{math.floor(need_mib) if below else math.ceil(need_mib)}Mi"
    base, head = snapshot(STACK), snapshot(STACK)
    _memory_limit(base, limit)
    _memory_limit(head, limit)
    _corefile(head, "pods insecure", "pods verified")
    found = [f.level for f in coredns.assess(compare_stack(STACK, base, head)) if f.level == HIGH]
    assert found == ([level] if level else [])


def test_autopath_without_pods_verified_is_medium_and_says_it_does_nothing() -> None:
    head = snapshot(STACK)
    _corefile(head, "    kubernetes cluster.local", "    autopath @kubernetes\n    kubernetes cluster.local")
    [line] = rule(risks(head), "corefile-reloaded")
    assert line.level == MEDIUM and "without `pods verified` does nothing" in line.summary


def test_pods_verified_already_running_is_not_told_again() -> None:
    base, head = snapshot(STACK), snapshot(STACK)
    _corefile(base, "pods insecure", "pods verified")
    _corefile(head, "pods insecure", "pods verified")
    _corefile(head, "cache 30", "cache 60")
    assert [f.level for f in coredns.assess(compare_stack(STACK, base, head))] == [MEDIUM]


def test_the_estimate_is_scaling_corednss_formula() -> None:
    assert coredns.estimate_mb(37_616, 5) == pytest.approx(37_621 / 250 + 56)
    assert coredns.memory_bytes("170Mi") == 170 * 2**20 and coredns.memory_bytes("1G") == 10**9
    assert coredns.memory_bytes("lots") is None


# --- 2. API Priority and Fairness -----------------------------------------------------------------------------------


def _shares(entry: dict[str, Any], level: str, value: int) -> None:
    [spec] = [r["inputs"]["spec"] for r in entry["resources"] if r["type"] == flowcontrol.LEVEL
              and r["inputs"]["metadata"]["name"] == level]
    spec["limited"]["nominalConcurrencyShares"] = value


def _reads(entry: dict[str, Any], old: int, new: int) -> None:
    for path in entry["files"]:
        if flowcontrol.APISERVER_UNIT.match(path):
            assert f"--max-requests-inflight={old} " in entry["files"][path]
            entry["files"][path] = entry["files"][path].replace(f"--max-requests-inflight={old} ",
                                                                f"--max-requests-inflight={new} ")


def test_node_agents_shares_cut_to_a_quarter_is_high_at_once_on_every_apiserver() -> None:
    head = snapshot(STACK)
    _shares(head, NODE_AGENTS, 5)
    _reads(head, 1827, 1705)  # kilonode sizes --max-requests-inflight from its levels' shares
    [line] = rule(risks(head), "apf-live-change")
    assert line.level == HIGH
    assert line.subjects == (f"{STACK}-k8s-api-protection-kilonode-node-agents-level",)
    text = line.summary
    assert "every running apiserver (5) applies it as soon as `pulumi up` writes it" in text
    assert "before any apiserver roll" in text
    # ceil(2327 x 20 / 285) = 164; ceil(2327 x 5 / 270) = 44; ceil(2205 x 5 / 270) = 41
    assert "server concurrency limit 2,327 (--max-requests-inflight=1827 + --max-mutating-requests-inflight=500)" \
        in text
    assert "2,205 at the head (1705 + 500)" in text
    assert "kilonode-node-agents: 164 -> 44 seats per apiserver at once (shares 20 -> 5), 41 once" in text
    assert "kube-proxy on 7,504 nodes" in text and "cloud-node-manager on 7,504 nodes" in text
    assert "less than half its seats" in text


@pytest.mark.parametrize(("shares", "level"), [(10, MEDIUM), (9, HIGH)])
def test_the_half_boundary(shares: int, level: str) -> None:
    # 20 -> 10 keeps ceil(2327 x 10 / 275) = 85 of 164 (over half); 20 -> 9: 77 (under)
    head = snapshot(STACK)
    _shares(head, NODE_AGENTS, shares)
    [line] = flowcontrol.assess(compare_stack(STACK, snapshot(STACK), head))
    assert line.level == level


def test_a_monitoring_level_cut_is_medium_and_names_its_flows() -> None:
    head = snapshot(STACK)
    _shares(head, "kilonode-monitoring", 1)
    [line] = rule(risks(head), "apf-live-change")
    assert line.level == MEDIUM
    assert "kilonode-monitoring: 82 -> 9 seats per apiserver at once" in line.summary
    assert "ServiceAccount monitoring/*" in line.summary and "group kilonode:monitoring-agents" in line.summary


def test_a_level_grown_names_the_vital_builtin_levels_it_takes_from() -> None:
    head = snapshot(STACK)
    _shares(head, "kilonode-monitoring", 400)
    [line] = flowcontrol.assess(compare_stack(STACK, snapshot(STACK), head))
    assert line.level == HIGH  # workload-high and the kubelets' levels keep less than half
    assert "workload-high: " in line.summary and "its shares unchanged" in line.summary
    assert "kube-controller-manager, kube-scheduler" in line.summary
    assert "node-high: " in line.summary


def test_a_flowschema_precedence_change_is_told() -> None:
    head = snapshot(STACK)
    [spec] = [r["inputs"]["spec"] for r in head["resources"] if r["type"] == flowcontrol.SCHEMA
              and r["inputs"]["metadata"]["name"] == NODE_AGENTS]
    spec["matchingPrecedence"] = 950
    [line] = flowcontrol.assess(compare_stack(STACK, snapshot(STACK), head))
    assert line.level == MEDIUM and line.summary.startswith("FlowSchema kilonode-node-agents changed")
    assert "kilonode-node-agents: 164 -> 164 seats" in line.summary
