"""The misjudgements a fourth independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed by hand as the pull request changes it: custom data that an
upgrade to the model alone does not apply (cloud-init reads it at first boot only), a replaced
Deployment (CoreDNS's selector), a PriorityClass value change on the globalDefault class, and a
scrape interval at or past Prometheus's lookback under an alert's instant vector."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml

from kilonode.paths import REPO_ROOT
from kilonode.review import alerting, lifecycle
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
PRIORITY_CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


# --- 1. custom data: upgrade, then reimage (or a new instance) ----------------------------------------------------


def test_a_custom_data_rollout_says_upgrade_then_reimage() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS and "h100-ib" in r["name"]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:0000]"
    [rollout] = rule(risks(head), "fleet-rollout")
    assert "cloud-init reads custom data only when the instance is provisioned" in rollout.summary
    assert "`az vmss update-instances`" in rollout.summary
    assert "then reimage it (`az vmss reimage --instance-ids`)" in rollout.summary
    assert "delete it and let a new instance be created" in rollout.summary
    assert "a reimage does not do it" not in rollout.summary


def test_the_custom_data_row_says_a_reimage_after_the_upgrade() -> None:
    assert REPO_ROOT is not None
    rows = tomllib.loads((REPO_ROOT / "infra/kilonode/catalog/effects.toml").read_text())["effect"]
    [row] = [r for r in rows if r["type"] == VMSS and r["path"] == "virtualMachineProfile.osProfile.customData"]
    assert "first boot" in row["why"] and "az vmss reimage --instance-ids" in row["why"]
    assert "reaches an existing instance only when it is upgraded" not in row["why"]


def test_new_registration_labels_recommend_only_kubectl() -> None:
    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    [pool] = [p for p in plan["nodePools"] if p["name"] == "h100-ib"]
    pool["labels"] = {**(pool.get("labels") or {}), "example.com/tier": "training"}
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    [labels] = [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), head))
                if f.rule == "labels-until-reimaged"]
    assert "kubectl label nodes" in labels.summary and "kubectl taint nodes" in labels.summary
    assert "it registers anew" not in labels.summary and "`kubectl delete node" not in labels.summary
    assert "Deleting the Node does not make it register anew" in labels.summary


# --- 2. a replaced Deployment ----------------------------------------------------------------------------------------


def test_a_coredns_selector_change_is_a_high_replacement_with_dns_down() -> None:
    head = snapshot(STACK)
    coredns = workload(head, "Deployment", "coredns")
    coredns["spec"]["selector"]["matchLabels"]["k8s-app"] = "coredns"
    coredns["spec"]["template"]["metadata"]["labels"]["k8s-app"] = "coredns"
    diff = compare_stack(STACK, snapshot(STACK), head)
    [change] = [c for c in diff.resources if c.type == "kubernetes:apps/v1:Deployment"]
    assert change.action == "replace"
    [replaced] = rule(assess(diff, {}), "deployment-replaced")
    assert replaced.level == HIGH and replaced.subjects == (f"{STACK}-k8s-dns-deployment",)
    assert "Deployment kube-system/coredns is replaced" in replaced.summary
    assert "deleted before the new Deployment exists" in replaced.summary
    assert "cluster DNS is down meanwhile" in replaced.summary and "starts at 1 replica" in replaced.summary
    assert "Keep the selector" in replaced.summary and "new name first" in replaced.summary


def test_another_replaced_deployment_names_its_pods() -> None:
    head = snapshot(STACK)
    metrics = workload(head, "Deployment", "metrics-server")
    metrics["spec"]["selector"]["matchLabels"]["k8s-app"] = "ms"
    metrics["spec"]["template"]["metadata"]["labels"]["k8s-app"] = "ms"
    [replaced] = rule(risks(head), "deployment-replaced")
    assert "its 2 pod(s) are deleted" in replaced.summary and "metrics-server serves is down" in replaced.summary
    assert "cluster DNS" not in replaced.summary


# --- 3. a PriorityClass's value ---------------------------------------------------------------------------------------


def test_the_default_priority_class_value_is_told_a_new_class_under_a_new_name() -> None:
    head = snapshot(STACK)
    [team] = [r for r in head["resources"] if r["type"] == PRIORITY_CLASS
              and r["inputs"]["metadata"]["name"] == "kilonode-team"]
    team["inputs"]["value"] = 2000
    [refused] = [r for r in rule(risks(head), "update-refused") if r.cause == "value"]
    assert "the value is immutable" in refused.summary
    assert "kilonode-team is globalDefault" in refused.summary
    assert "priority 0" in refused.summary and "refused at admission" in refused.summary
    assert "new class under a new name" in refused.summary and "move globalDefault to it" in refused.summary
    assert "recreate them deliberately" not in refused.summary


# --- 4. a scrape interval at or past the 5m lookback under an instant vector --------------------------------------


def _scrape_interval(entry: dict[str, Any], job: str, old: str, new: str) -> None:
    for r in entry["resources"]:
        if r["type"] != "kubernetes:core/v1:ConfigMap":
            continue
        data = r["inputs"].get("data") or {}
        for key, text in data.items():
            if f"job_name: {job}\n  scrape_interval: {old}" in text:
                data[key] = text.replace(f"job_name: {job}\n  scrape_interval: {old}",
                                         f"job_name: {job}\n  scrape_interval: {new}")


def test_a_job_scraped_every_5m_under_an_instant_vector_is_medium_naming_the_alerts() -> None:
    head = snapshot(STACK)
    _scrape_interval(head, "kilonode-gpu-health-agent", "60s", "5m")
    [gap] = rule(risks(head), "scrape-past-lookback")
    assert gap.level == "medium"
    assert gap.subjects == ("KilonodeGpuHealthAgentCannotReport", "KilonodeGpuHealthAgentStale")
    assert gap.summary.startswith("job kilonode-gpu-health-agent is scraped every 300s, at or past")
    assert "its `for:` starts again" in gap.summary and "a late scrape)" in gap.summary
    assert "kilonode-certificates" not in gap.summary


@pytest.mark.parametrize("stack", ["local", "research-2500", "research-7500"])
def test_no_shipped_alert_reads_a_job_scraped_past_the_lookback(stack: str) -> None:
    """The shipped render itself: kilonode-certificates was scraped every 5m under the expiry alerts'
    instant vectors (a late scrape reset their `for:`); every job an alert reads is now under it."""
    assert alerting.stale_instant_reads(snapshot(stack)) == {}


def test_the_certificates_job_at_5m_is_seen() -> None:
    head = snapshot(STACK)
    _scrape_interval(head, "kilonode-certificates", "1m", "5m")
    [gap] = rule(risks(head), "scrape-past-lookback")
    assert gap.summary.startswith("job kilonode-certificates is scraped every 300s")
    assert "KilonodeCertificateExpiresSoon" in gap.subjects


def test_past_the_lookback_every_cycle_drops_out() -> None:
    head = snapshot(STACK)
    _scrape_interval(head, "kilonode-gpu-health-agent", "60s", "10m")
    [gap] = rule(risks(head), "scrape-past-lookback")
    assert "every cycle at this interval" in gap.summary


def test_ranges_are_not_instant_reads_and_subqueries_are() -> None:
    intervals = {"j": 300.0, "fast": 60.0}
    assert alerting._stale_reads('rate(x{job="j"}[15m]) > 0', intervals) == set()
    assert alerting._stale_reads('max_over_time(x{job="j"}[15m])', intervals) == set()
    assert alerting._stale_reads('x{job="j"} > 0', intervals) == {("j", 300.0)}
    assert alerting._stale_reads('max_over_time(x{job="j"}[15m:1m])', intervals) == {("j", 300.0)}
    assert alerting._stale_reads('x{job=~"j|fast"} == 0', intervals) == {("j", 300.0)}
    assert alerting._stale_reads('x{job="fast"} == 0', intervals) == set()
    assert alerting._stale_reads('x{job=~"[j]"} == 0', intervals) == {("j", 300.0)}
