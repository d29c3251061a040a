"""The eighteenth independent trace of `kilonode diff` on research-7500: what each finding of its
PRs misjudged or said only in part, each boundary on the shipped stack changed in memory
(tests.review.snapshots), with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _risks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, snapshot(STACK), head), {})


def _rules(head: dict[str, Any], rule: str) -> list[Any]:
    return [r for r in _risks(head) if r.rule == rule]


# --- PR 4: dcgm-exporter pointed at the image's default counters file -----------------------------


def _dcgm(entry: dict[str, Any]) -> dict[str, Any]:
    [container] = [c for c in pod_spec(entry, "DaemonSet", "dcgm-exporter")["containers"]
                   if "dcgm-exporter" in c["image"]]
    return container


def _collectors(entry: dict[str, Any], path: str) -> None:
    [env] = [e for e in _dcgm(entry)["env"] if e["name"] == "DCGM_EXPORTER_COLLECTORS"]
    env["value"] = path


def test_collectors_env_at_the_image_default_drops_kilonodes_fields_and_holds_profiling() -> None:
    head = snapshot(STACK)
    _collectors(head, "/etc/dcgm-exporter/default-counters.csv")
    dropped = _rules(head, "metric-dropped")
    assert dropped, "the image's default file lacks the NVLink error, ECC and violation counters the alerts read"
    said = " ".join(r.summary for r in dropped)
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in said or "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in said
    assert "the image's default" in said and "default-counters.csv" in said
    assert "DCGM_FI_DEV_GPU_TEMP " not in said  # enabled in both files
    [held] = _rules(head, "dcgm-profiling-held")
    assert held.level == "medium" and "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in held.summary
    assert "Nsight" in held.summary


def test_collectors_flag_wins_over_env() -> None:
    head = snapshot(STACK)
    _dcgm(head).setdefault("args", []).extend(["-f", "/etc/dcgm-exporter/default-counters.csv"])
    assert _rules(head, "metric-dropped") and _rules(head, "dcgm-profiling-held")


def test_collectors_file_moved_with_its_mount_stays_quiet() -> None:
    """Control: the same ConfigMap mounted elsewhere and the env following it is the same file."""
    head = snapshot(STACK)
    [mount] = [m for m in _dcgm(head)["volumeMounts"] if m["mountPath"] == "/etc/dcgm-exporter/kilonode"]
    mount["mountPath"] = "/etc/kilonode-dcgm"
    _collectors(head, "/etc/kilonode-dcgm/counters.csv")
    assert not _rules(head, "metric-dropped") and not _rules(head, "dcgm-profiling-held")


def test_collectors_file_kilonode_cannot_read_is_not_judged() -> None:
    head = snapshot(STACK)
    _collectors(head, "/opt/site/counters.csv")
    assert not _rules(head, "metric-dropped") and not _rules(head, "dcgm-profiling-held")


# --- PR 3: node-exporter's InfiniBand device filter narrowed away from the image's ib* names ---------


def _node_exporter_args(entry: dict[str, Any]) -> list[str]:
    [container] = [c for c in pod_spec(entry, "DaemonSet", "node-exporter")["containers"]
                   if "node-exporter" in c["image"]]
    args: list[str] = container["args"]
    return args


def _set_flag(entry: dict[str, Any], flag: str, value: str | None) -> None:
    args = _node_exporter_args(entry)
    args[:] = [a for a in args if not a.startswith(flag + "=") and a != flag]
    if value is not None:
        args.append(f"{flag}={value}" if value else flag)


def test_infiniband_filter_matching_only_mlx5_ib_loses_every_ib_series() -> None:
    head = snapshot(STACK)
    _set_flag(head, "--collector.infiniband.device-include", "^mlx5_ib[0-9]+$")
    [line] = _rules(head, "collector-narrowed")
    assert line.level == "high" and "node_infiniband_*" in line.summary
    assert "a100-ib 5,000" in line.summary and "h100-ib 2,500" in line.summary
    assert "KilonodeInfinibandPortDown" in line.summary or "KilonodeInfinibandPortSlow" in line.summary
    assert "KilonodeInfinibandPortsMissing" in line.summary and "fires instead, on every one" in line.summary


def test_infiniband_collector_switched_off_is_said() -> None:
    head = snapshot(STACK)
    _set_flag(head, "--collector.infiniband", None)  # under --collector.disable-defaults: off
    [line] = _rules(head, "collector-narrowed")
    assert line.level == "high" and "collector is off" in line.summary


def test_infiniband_filter_rewritten_to_the_same_names_stays_quiet() -> None:
    """Control: a filter that still takes every ib* form (and drops mlx5_ib) collects what the image has."""
    head = snapshot(STACK)
    _set_flag(head, "--collector.infiniband.device-include", "^ib.*$")
    assert not _rules(head, "collector-narrowed")


# --- PR 10: a PodDisruptionBudget re-keyed onto a label its pods do not carry ------------------------


def _pdb(entry: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == "kubernetes:policy/v1:PodDisruptionBudget"
               and r["inputs"]["metadata"]["name"] == name]
    return found


def _typha_pdb(entry: dict[str, Any]) -> str:
    names = [r["inputs"]["metadata"]["name"] for r in entry["resources"]
             if r["type"] == "kubernetes:policy/v1:PodDisruptionBudget"]
    return next(n for n in names if "typha" in n)


def test_typha_budget_selecting_nothing_is_high_and_names_system_pods() -> None:
    head = snapshot(STACK)
    name = _typha_pdb(head)
    _pdb(head, name)["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": "calico-typha"}}
    [line] = _rules(head, "pdb-selects-nothing")
    assert line.level == "high" and "calico-typha" in line.summary
    assert "eviction.go" in line.summary and "skip-nodes-with-system-pods" in line.summary


def test_budget_following_its_relabelled_template_stays_quiet() -> None:
    """Control: the selector and the pod template's labels changed together still select the pods."""
    head = snapshot(STACK)
    name = _typha_pdb(head)
    pdb = _pdb(head, name)
    [(key, value)] = pdb["spec"]["selector"]["matchLabels"].items()
    pdb["spec"]["selector"] = {"matchLabels": {key: value, "tier": "typha"}}
    pod = next(r["inputs"] for r in head["resources"] if r["type"] == "kubernetes:apps/v1:Deployment"
               and r["inputs"]["metadata"]["name"] == "calico-typha")
    pod["spec"]["template"]["metadata"]["labels"]["tier"] = "typha"
    assert not _rules(head, "pdb-selects-nothing")


# --- PR 13: automatic instance repairs on the GPU scale sets ------------------------------------------


VMSS = "azure-native:compute:VirtualMachineScaleSet"


def _gpu_scale_sets(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["inputs"] for r in entry["resources"] if r["type"] == VMSS
            and r["inputs"]["tags"].get("kilonode-role", "").startswith("pool-a100-ib")]


def test_repairs_without_health_signal_are_refused() -> None:
    head = snapshot(STACK)
    for inputs in _gpu_scale_sets(head):
        inputs["automaticRepairsPolicy"] = {"enabled": True, "gracePeriod": "PT30M"}
    [line] = _rules(head, "vmss-repairs-refused")
    assert line.level == "high" and "a100-ib" in line.summary and "health probe or health extension" in line.summary
    assert not _rules(head, "vmss-repairs-replace")


def test_repairs_with_health_extension_replace_gpu_vms_without_drain() -> None:
    head = snapshot(STACK)
    for inputs in _gpu_scale_sets(head):
        inputs["automaticRepairsPolicy"] = {"enabled": True}
        inputs["virtualMachineProfile"]["extensionProfile"] = {"extensions": [
            {"name": "health", "type": "ApplicationHealthLinux", "publisher": "Microsoft.ManagedServices"}]}
    [line] = _rules(head, "vmss-repairs-replace")
    assert line.level == "high" and "no drain" in line.summary and "ApplicationHealthLinux" in line.summary
    assert not _rules(head, "vmss-repairs-refused")


def test_repairs_left_off_or_restart_action_stay_quiet() -> None:
    """Controls: the policy present but disabled, and a Restart action with a probe."""
    head = snapshot(STACK)
    for inputs in _gpu_scale_sets(head):
        inputs["automaticRepairsPolicy"] = {"enabled": False}
    assert not _rules(head, "vmss-repairs-refused") and not _rules(head, "vmss-repairs-replace")
    head = snapshot(STACK)
    for inputs in _gpu_scale_sets(head):
        inputs["automaticRepairsPolicy"] = {"enabled": True, "repairAction": "Restart"}
        inputs["virtualMachineProfile"]["networkProfile"]["healthProbe"] = {"id": "/subscriptions/x/probe"}
    assert not _rules(head, "vmss-repairs-refused") and not _rules(head, "vmss-repairs-replace")


# --- PR 7: Grafana's anonymous access ------------------------------------------------------------------


def _grafana_env(entry: dict[str, Any], **env: str) -> None:
    [container] = [c for c in pod_spec(entry, "Deployment", "grafana")["containers"] if "grafana" in c["image"]]
    for name, value in env.items():
        container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, "value": value}]


def _value_effect(head: dict[str, Any], row: str) -> list[Any]:
    return [r for r in _rules(head, "value-effect") if f"[{row}]" in r.summary]


def test_grafana_anonymous_admin_is_high_and_names_who_reaches_it() -> None:
    head = snapshot(STACK)
    _grafana_env(head, GF_AUTH_ANONYMOUS_ENABLED="true", GF_AUTH_ANONYMOUS_ORG_ROLE="Admin")
    [line] = _value_effect(head, "grafana-anonymous-editor")
    assert line.level == "high" and "port 3000" in line.summary
    assert "env GF_AUTH_ANONYMOUS_ORG_ROLE Admin" in line.summary
    assert "by NetworkPolicy" in line.summary and "every pod of namespace monitoring" in line.summary
    assert not _value_effect(head, "grafana-anonymous-viewer")


def test_grafana_anonymous_viewer_is_medium_and_a_policy_is_named() -> None:
    head = snapshot(STACK)
    _grafana_env(head, GF_AUTH_ANONYMOUS_ENABLED="true")
    head["resources"].append({"type": "kubernetes:networking.k8s.io/v1:NetworkPolicy", "name": "grafana-np",
                              "protect": False, "custom": True,
                              "inputs": {"metadata": {"name": "grafana", "namespace": "monitoring"}, "spec": {
                                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "grafana"}},
                                  "policyTypes": ["Ingress"],
                                  "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                                               "ports": [{"port": 3000}]}]}}})
    [line] = _value_effect(head, "grafana-anonymous-viewer")
    assert line.level == "medium" and "grafana" in line.summary and "addresses 10.0.0.0/8" in line.summary
    assert not _value_effect(head, "grafana-anonymous-editor")


def test_grafana_anonymous_off_with_admin_role_stays_quiet() -> None:
    """Control: the role alone (anonymous access still off) gives nobody anything."""
    head = snapshot(STACK)
    _grafana_env(head, GF_AUTH_ANONYMOUS_ORG_ROLE="Admin")
    assert not _value_effect(head, "grafana-anonymous-editor") and not _value_effect(head, "grafana-anonymous-viewer")


# --- PR 12: Azure metric alerts evaluated less often than their window ---------------------------------


def _metric_alerts(entry: dict[str, Any], part: str) -> list[dict[str, Any]]:
    return [r["inputs"] for r in entry["resources"] if r["type"] == "azure-native:monitor:MetricAlert"
            and part in r["name"]]


def test_frequency_past_window_leaves_blind_minutes() -> None:
    head = snapshot(STACK)
    alerts = _metric_alerts(head, "snat-failed")
    assert alerts
    for inputs in alerts:
        inputs["evaluationFrequency"], inputs["windowSize"] = "PT15M", "PT5M"
    [line] = _rules(head, "metric-alert-blind-gaps")
    assert "10 min of every 15 min" in line.summary
    assert line.level == ("high" if any(a["severity"] <= 2 for a in alerts) else "medium")


def test_frequency_within_window_stays_quiet() -> None:
    """Control: every 5 min over the last 15 min overlaps; nothing is unseen."""
    head = snapshot(STACK)
    for inputs in _metric_alerts(head, "snat-failed"):
        inputs["evaluationFrequency"], inputs["windowSize"] = "PT5M", "PT15M"
    assert not _rules(head, "metric-alert-blind-gaps")


def test_infiniband_filter_losing_one_naming_form_is_medium() -> None:
    head = snapshot(STACK)
    _set_flag(head, "--collector.infiniband.device-include", "^(mlx5_ib[0-9]+|ib[osp][0-9].*)$")  # no ibP<domain>
    [line] = _rules(head, "collector-narrowed")
    assert line.level == "medium" and "ibP257p0s0" in line.summary
