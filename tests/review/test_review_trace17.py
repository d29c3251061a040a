"""The seventeenth independent trace of `kilonode diff` on research-7500: what each finding of its
PRs misjudged or said only in part, each boundary on the shipped stack changed in memory
(tests.review.snapshots), with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"


def _of(entry: dict[str, Any], type_: str, name: str | None = None) -> dict[str, Any]:
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == type_
               and (name is None or r["inputs"]["metadata"]["name"] == name)]
    return found


def _risks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, snapshot(STACK), head), {})


# --- PR 6 / 6b: the Prometheus StorageClass changed ----------------------------------------------


def test_every_recorded_in_cluster_kind_has_effect_rows() -> None:
    """A kind with no rows reads every change as a plain update: the next new kind must come with its rows."""
    from kilonode.catalog import CATALOG_DIR
    rows = tomllib.loads((CATALOG_DIR / "effects.toml").read_text())["effect"]
    known = {r["type"] for r in rows}
    recorded = {r["type"] for r in snapshot(STACK)["resources"] if r["type"].startswith("kubernetes:")}
    assert recorded - known == set(), "add effects.toml rows (at least metadataForceNewProperties) for these kinds"


def test_storage_class_parameters_replace_and_reclaim_policy_is_refused() -> None:
    head = snapshot(STACK)
    _of(head, STORAGE_CLASS)["parameters"]["fsType"] = "xfs"
    [change] = [c for c in compare_stack(STACK, snapshot(STACK), head).resources if c.type == STORAGE_CLASS]
    assert change.action == "replace"
    head = snapshot(STACK)
    _of(head, STORAGE_CLASS)["reclaimPolicy"] = "Delete"
    [line] = [r for r in _risks(head) if r.rule == "update-refused"]
    assert line.level == "high" and "reclaimPolicy" in line.summary and "ValidateStorageClassUpdate" in line.summary


def test_storage_class_replaced_names_its_claims() -> None:
    head = snapshot(STACK)
    _of(head, STORAGE_CLASS)["parameters"]["fsType"] = "xfs"
    [line] = [r for r in _risks(head) if r.rule == "storageclass-replaced"]
    assert line.level == "medium"
    assert "monitoring/data-prometheus-0" in line.summary and "monitoring/data-alertmanager-0" in line.summary
    assert "keep their disks as provisioned" in line.summary


def test_premium_v2_with_host_caching_says_new_claims_never_provision() -> None:
    head = snapshot(STACK)
    _of(head, STORAGE_CLASS)["parameters"]["skuName"] = "PremiumV2_LRS"  # cachingMode stays ReadOnly
    [line] = [r for r in _risks(head) if "azuredisk-sku-without-caching-none" in r.summary]
    assert line.level == "high"
    assert "Premium_LRS -> PremiumV2_LRS" in line.summary and "cachingMode ReadOnly" in line.summary
    assert "monitoring/data-prometheus-0" in line.summary and "azure_disk_utils.go:706-710" in line.summary


def test_premium_v2_with_caching_none_or_unset_says_nothing() -> None:
    for caching in ("None", None):
        head = snapshot(STACK)
        parameters = _of(head, STORAGE_CLASS)["parameters"]
        parameters["skuName"] = "PremiumV2_LRS"
        if caching is None:
            del parameters["cachingMode"]  # the driver's check passes an unset cachingMode (then sets None)
        else:
            parameters["cachingMode"] = caching
        assert [r for r in _risks(head) if "azuredisk-sku" in r.summary] == []


def test_statefulset_replace_row_keeps_the_retained_claim() -> None:
    from kilonode.catalog import CATALOG_DIR
    text = (CATALOG_DIR / "effects.toml").read_text()
    assert "new, empty TSDB" not in text
    assert "mounts data-prometheus-0 again" in text


# --- PR 11: metrics-server's budget at its replicas -----------------------------------------------

PDB = "kubernetes:policy/v1:PodDisruptionBudget"


def _budget(head: dict[str, Any], **spec: Any) -> None:
    budget = _of(head, PDB, "metrics-server")["spec"]
    for key in ("minAvailable", "maxUnavailable"):
        budget.pop(key, None)
    budget.update(spec)


def _blocks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import disruption
    return disruption.assess(compare_stack(STACK, snapshot(STACK), head))


@pytest.mark.parametrize("spec", [{"minAvailable": 2}, {"minAvailable": "100%"}, {"maxUnavailable": 0},
                                  {"maxUnavailable": "0%"}])
def test_budget_at_the_replicas_blocks_every_eviction(spec: dict[str, Any]) -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    _budget(head, **spec)
    [line] = _blocks(head)
    assert line.level == HIGH and line.rule == "pdb-blocks-eviction"
    assert "Deployment metrics-server at 2 replica(s)" in line.summary and "429" in line.summary
    assert "kilonode.rollout.execute" in line.summary and "h100-ib" in line.summary  # autoscaled: scale-down too


@pytest.mark.parametrize("spec", [{"minAvailable": 1}, {"minAvailable": "50%"}, {"maxUnavailable": 1},
                                  {"maxUnavailable": "10%"}])
def test_budget_leaving_a_disruption_says_nothing(spec: dict[str, Any]) -> None:
    head = snapshot(STACK)
    _budget(head, **spec)  # 50% of 2 rounds up to 1; 10% of 2 rounds up to 1 unavailable
    assert _blocks(head) == []


def test_replicas_lowered_to_the_budget_blocks() -> None:
    from tests.review.snapshots import workload
    head = snapshot(STACK)
    _budget(head, minAvailable=1)
    workload(head, "Deployment", "metrics-server")["spec"]["replicas"] = 1
    [line] = _blocks(head)
    assert "at 1 replica(s)" in line.summary


# --- PR 9: NVLink fields gone from dcgm-exporter's counters file ----------------------------------

NVLINK_ERRORS = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                 "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")


def _counters_without(head: dict[str, Any], fields: tuple[str, ...]) -> None:
    data = _of(head, "kubernetes:core/v1:ConfigMap", "dcgm-exporter-counters")["data"]
    data["counters.csv"] = "".join(line + "\n" for line in data["counters.csv"].splitlines()
                                   if line.split(",", 1)[0].strip() not in fields)


def _dropped(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import alerting
    return alerting.dropped(compare_stack(STACK, snapshot(STACK), head))


def test_fields_gone_from_the_exporter_set_name_the_alert_that_cannot_fire() -> None:
    from kilonode.review.finding import MEDIUM
    head = snapshot(STACK)
    _counters_without(head, NVLINK_ERRORS)
    [line] = _dropped(head)
    assert line.rule == "metric-dropped" and line.level == MEDIUM  # a warning: it does not page
    assert "KilonodeGpuNvlinkErrors (warning) can no longer fire" in line.summary
    assert "counters file" in line.summary and "pkg/cmd/app.go" in line.summary


def test_a_paging_alert_on_a_gone_field_is_high() -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    for r in head["resources"]:
        for key, text in ((r["inputs"].get("data") or {}).items() if r["type"] == "kubernetes:core/v1:ConfigMap"
                          else []):
            if "KilonodeGpuNvlinkErrors" in text and "groups:" in text:
                import yaml
                document = yaml.safe_load(text)
                for group in document["groups"]:
                    for rule in group["rules"]:
                        if rule.get("alert") == "KilonodeGpuNvlinkErrors":
                            rule["labels"]["severity"] = "critical"
                r["inputs"]["data"][key] = yaml.safe_dump(document, sort_keys=False)
    _counters_without(head, NVLINK_ERRORS)
    [line] = _dropped(head)
    assert line.level == HIGH and "it pages" in line.summary


def test_a_field_no_alert_reads_gone_says_nothing() -> None:
    head = snapshot(STACK)
    _counters_without(head, ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",))  # the dashboards' only
    assert _dropped(head) == []


# --- PR 15: CoreDNS's policy drops 53/TCP only ----------------------------------------------------


def _dns_ports(head: dict[str, Any], protocols: tuple[str, ...], sources: list[dict[str, Any]] | None = None) -> None:
    STACK_POLICY = f"{STACK}-k8s-kube-system-policies-coredns"
    [policy] = [r["inputs"] for r in head["resources"] if r["name"] == STACK_POLICY]
    rule = policy["spec"]["ingress"][0]  # 53 over UDP and TCP, from everyone
    rule["ports"] = [p for p in rule["ports"] if p.get("protocol") in protocols]
    if sources is not None:
        rule["from"] = sources


def _dns_breaks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import preflight_break
    return [b for b in preflight_break.assess(compare_stack(STACK, snapshot(STACK), head))
            if "served-to-every-pod" in b.summary]


def test_dns_tcp_refused_alone_says_only_truncated_answers_fail() -> None:
    from kilonode.review.finding import HIGH
    head = snapshot(STACK)
    _dns_ports(head, ("UDP",))
    [line] = _dns_breaks(head)
    assert line.level == HIGH  # still a break
    assert "only answers too large for UDP fail" in line.summary and "headless Service" in line.summary
    assert "no Service name resolves anywhere" not in line.summary


def test_dns_tcp_refused_to_host_sources_only_combines_both() -> None:
    head = snapshot(STACK)
    _dns_ports(head, ("UDP",), [{"namespaceSelector": {}}])  # UDP from pods only, TCP from no one
    [line] = _dns_breaks(head)
    # UDP is refused to the node addresses too: the host-only sentence, not the TCP-only one
    assert "hostNetwork pods (dnsPolicy ClusterFirstWithHostNet) and processes on the nodes lose DNS" in line.summary


def test_dns_udp_refused_keeps_the_cluster_wide_sentence() -> None:
    head = snapshot(STACK)
    _dns_ports(head, ("TCP",))
    [line] = _dns_breaks(head)
    assert "no Service name resolves anywhere in the cluster" in line.summary
    assert "only answers too large" not in line.summary


def test_dns_both_protocols_admitted_says_nothing() -> None:
    head = snapshot(STACK)
    _dns_ports(head, ("UDP", "TCP"))
    assert _dns_breaks(head) == []
