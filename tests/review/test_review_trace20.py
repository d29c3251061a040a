"""The twentieth independent trace of `kilonode diff` on research-7500: P05 (Felix's metrics turned on: a new
unauthenticated listener on every node) on the shipped stack changed in memory, with a quiet variant. P08 (a route
before the pager) is in test_review_alert_routing.py; P13 and P15 in test_review_trace20_storage.py and
test_review_trace20_rbac.py."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _effects(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == "value-effect"]


def _felix_env(head: dict[str, Any], name: str, value: str) -> None:
    [container] = [c for c in pod_spec(head, "DaemonSet", "calico-node")["containers"] if c["name"] == "calico-node"]
    container["env"].append({"name": name, "value": value})


def test_felix_metrics_on_is_an_unfenced_listener() -> None:
    head = snapshot(STACK)
    _felix_env(head, "FELIX_PROMETHEUSMETRICSENABLED", "true")
    [line] = [r for r in _effects(head) if "felix-metrics-unfenced" in r.summary]
    assert line.level == "medium" and "9091" in line.summary and "node-ports.nft" in line.summary
    assert "7,5" in line.summary  # the nodes the DaemonSet runs on


def test_another_felix_variable_is_not() -> None:
    head = snapshot(STACK)
    _felix_env(head, "FELIX_PROMETHEUSMETRICSENABLED", "false")
    assert not [r for r in _effects(head) if "felix-metrics-unfenced" in r.summary]


# --- trace 21, P06: the GPU pool grows, the monitoring pool's VM with it, but the running VM keeps its size -----
def _scaled_up(head: dict[str, Any], vm: str, cpus: int, memory: float) -> None:
    """The head's plan as kilonode would plan h100-ib larger with the monitoring pool on a bigger size."""
    import yaml as _yaml
    plan = _yaml.safe_load(head["files"]["plan.yaml"])
    [pool] = [p for p in plan["nodePools"] if p["name"] == plan["prometheus"]["pool"]]
    pool["vmSize"], pool["vcpus"] = vm, pool["vcpus"] * 2
    plan["prometheus"]["cpus"], plan["prometheus"]["memoryGib"] = cpus, memory
    head["files"]["plan.yaml"] = _yaml.safe_dump(plan, sort_keys=False)


def _pending(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {})
            if r.rule == "prometheus-pending-until-resize"]


def test_prometheus_grown_past_the_running_vm_waits_pending_until_the_manual_upgrade() -> None:
    head = snapshot(STACK)
    _scaled_up(head, "Standard_E32ds_v5", 15, 68)
    [line] = _pending(head)
    assert line.level == "high" and "15 CPUs" in line.summary and "Standard_E16ds_v5" in line.summary
    assert "Manual" in line.summary and "kilonode rollout start --pool monitoring" in line.summary


def test_prometheus_that_still_fits_the_running_vm_is_not_pending() -> None:
    head = snapshot(STACK)
    _scaled_up(head, "Standard_E32ds_v5", 10, 60)
    assert _pending(head) == []
