"""Valid values whose effect upstream documents as dangerous (kilonode.review.value_effects, rows in
kilonode/catalog/value_effects.yaml): an independent trace of `kilonode diff` on research-7500 where
kube-apiserver --watch-cache=false (x09) was only control-plane-flag-changed, the device plugin's
FAIL_ON_INIT_ERROR true -> false (x15) only a DaemonSet rollout, and kube-proxy's updateStrategy
RollingUpdate -> OnDelete (x11) "No risk found"; each on the recorded snapshot changed as the pull
request changes it (the rendered units in `files`, the in-cluster objects in `resources` and their
YAML view in-cluster/*.yaml)."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.catalog.value_effects import ValueEffect, value_effects
from kilonode.review import control_flags
from kilonode.review import value_effects as rule
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.risks import assess
from tests.review.snapshots import pod_spec, snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"


def _flag(entry: dict[str, Any], flags: str, unit: str = "kube-apiserver.service") -> dict[str, Any]:
    """Every apiserver host's unit with `flags` added at the end of its ExecStart."""
    for path in list(entry["files"]):
        if path.endswith("/etc/systemd/system/" + unit):
            text = entry["files"][path]
            assert "--shutdown-delay-duration=15s\n" in text or unit != "kube-apiserver.service"
            lines = text.splitlines(keepends=True)
            start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
            end = next(i for i in range(start, len(lines)) if not lines[i].rstrip().endswith("\\"))
            lines[end] = lines[end].rstrip("\n") + f" \\\n    {flags}\n"
            entry["files"][path] = "".join(lines)
    return entry


def _fail_on_init(entry: dict[str, Any], value: str) -> dict[str, Any]:
    [container] = [c for c in pod_spec(entry, "DaemonSet", DEVICE_PLUGIN)["containers"]
                   if c["name"] == "nvidia-device-plugin-ctr"]
    [var] = [v for v in container["env"] if v["name"] == "FAIL_ON_INIT_ERROR"]
    var["value"] = value
    path = "in-cluster/device-plugin.yaml"
    entry["files"][path] = entry["files"][path].replace("- name: FAIL_ON_INIT_ERROR\n          value: 'true'",
                                                        f"- name: FAIL_ON_INIT_ERROR\n          value: '{value}'")
    return entry


def _on_delete(entry: dict[str, Any], name: str = "kube-proxy") -> dict[str, Any]:
    workload(entry, "DaemonSet", name)["spec"]["updateStrategy"] = {"type": "OnDelete"}
    return entry


def _findings(base: dict[str, Any], head: dict[str, Any]) -> list[Finding]:
    return rule.assess(compare_stack(STACK, base, head))


def test_every_row_reads_and_names_a_source() -> None:
    rows = value_effects().effects
    assert {"apiserver-watch-cache-off", "device-plugin-init-error-tolerated", "daemonset-on-delete"} <= {
        r.id for r in rows}
    for row in rows:
        assert row.source and row.consequence and row.fix


def test_the_shipped_stack_says_nothing() -> None:
    assert _findings(snapshot(STACK), snapshot(STACK)) == []


def test_x09_watch_cache_off_is_high_and_not_repeated_as_a_generic_flag() -> None:
    head = _flag(snapshot(STACK), "--watch-cache=false")
    [line] = _findings(snapshot(STACK), head)
    assert line.level == HIGH and line.rule == "value-effect"
    assert "--watch-cache (unset, default true) -> false" in line.summary
    assert "goes to etcd" in line.summary and "etcd.go" in line.summary
    hosts = [p.split("/", 1)[0] for p in head["files"] if p.endswith("/kube-apiserver.service")]
    assert len(line.subjects) == len(hosts) > 1
    # control_flags' generic line no longer says the flag a row judged
    diff = compare_stack(STACK, snapshot(STACK), head)
    flags = control_flags.assess(diff, frozenset(rule.flags_spoken(diff)))
    assert not [f for f in flags if f.rule == "control-plane-flag-changed" and "watch-cache" in f.summary]
    # and the whole review says it once, high
    said = [r for r in assess(compare_stack(STACK, snapshot(STACK), head), {}) if "watch-cache" in r.summary]
    assert [(r.level, r.rule) for r in said] == [(HIGH, "value-effect")]


def test_x09_turning_the_watch_cache_back_on_says_nothing_here_and_is_a_generic_flag() -> None:
    base = _flag(snapshot(STACK), "--watch-cache=false")
    head = _flag(snapshot(STACK), "--watch-cache=true")
    assert _findings(base, head) == []
    flags = control_flags.assess(compare_stack(STACK, base, head))
    assert [f for f in flags if f.rule == "control-plane-flag-changed" and "--watch-cache false -> true" in f.summary]


def test_staying_off_says_nothing() -> None:
    off = _flag(snapshot(STACK), "--watch-cache=false")
    assert _findings(off, _flag(snapshot(STACK), "--watch-cache=0")) == []


def test_x15_device_plugin_init_error_tolerated_is_high() -> None:
    [line] = _findings(snapshot(STACK), _fail_on_init(snapshot(STACK), "false"))
    assert line.level == HIGH and line.rule == "value-effect"
    assert "env FAIL_ON_INIT_ERROR true -> false" in line.summary
    assert "Waiting indefinitely" in line.summary and "no nvidia.com/gpu" in line.summary
    assert "never restarts" in line.summary and "v0.17.4" in line.summary
    assert line.subjects == (f"kube-system/DaemonSet/{DEVICE_PLUGIN} container nvidia-device-plugin-ctr",)


def test_x15_a_flag_on_the_command_line_wins_over_the_variable() -> None:
    head = snapshot(STACK)
    [container] = [c for c in pod_spec(head, "DaemonSet", DEVICE_PLUGIN)["containers"]
                   if c["name"] == "nvidia-device-plugin-ctr"]
    container["args"] = ["--fail-on-init-error=false"]
    [line] = _findings(snapshot(STACK), head)
    assert "--fail-on-init-error / env FAIL_ON_INIT_ERROR true -> false" in line.summary
    # and the flag saying true keeps it out, whatever the variable says
    container["args"] = ["--fail-on-init-error=true"]
    _fail_on_init(head, "false")
    assert _findings(snapshot(STACK), head) == []


def test_x15_back_to_failing_says_nothing() -> None:
    assert _findings(_fail_on_init(snapshot(STACK), "false"), _fail_on_init(snapshot(STACK), "true")) == []


def test_x11_kube_proxy_on_delete_is_high_with_its_nodes() -> None:
    [line] = _findings(snapshot(STACK), _on_delete(snapshot(STACK)))
    assert line.level == HIGH and line.rule == "value-effect"
    assert "kube-system/DaemonSet/kube-proxy" in line.summary
    assert "spec.updateStrategy.type RollingUpdate -> OnDelete" in line.summary
    assert "never replaces a running pod" in line.summary and "version skew" in line.summary
    assert line.subjects == ("kube-system/DaemonSet/kube-proxy",)


def test_x11_every_node_daemonset_is_judged_an_unset_strategy_reading_as_the_default() -> None:
    # the RDMA plugin sets no updateStrategy: apps/v1's default RollingUpdate
    head = _on_delete(_on_delete(snapshot(STACK)), "rdma-shared-dp-ds")
    [line] = _findings(snapshot(STACK), head)
    assert "(unset, default RollingUpdate) -> OnDelete" in line.summary
    assert set(line.subjects) == {"kube-system/DaemonSet/kube-proxy", "kube-system/DaemonSet/rdma-shared-dp-ds"}


def test_x11_back_to_rolling_update_says_nothing() -> None:
    assert _findings(_on_delete(snapshot(STACK)), snapshot(STACK)) == []


def test_controller_manager_garbage_collector_off_is_high() -> None:
    head = _flag(snapshot(STACK), "--enable-garbage-collector=false", "kube-controller-manager.service")
    [line] = _findings(snapshot(STACK), head)
    assert line.level == HIGH and "controller-manager-garbage-collector-off" in line.summary


def test_apiserver_garbage_collector_off_is_medium() -> None:
    [line] = _findings(snapshot(STACK), _flag(snapshot(STACK), "--enable-garbage-collector=false"))
    assert line.level == MEDIUM and "MUST be synced" in line.summary


@pytest.mark.parametrize(("row", "value", "expected"), [
    ({"equals": "false", "boolean": True, "default": "true"}, None, False),
    ({"equals": "false", "boolean": True, "default": "true"}, "F", True),
    ({"equals": "false", "boolean": True, "default": "true"}, "nonsense", False),
    ({"notEquals": "RollingUpdate", "default": "RollingUpdate"}, "OnDelete", True),
    ({"below": 10}, "5", True),
    ({"below": 10}, "10", False),
    ({"above": 10}, "11", True),
    ({"above": 10}, None, False),
])
def test_predicates(row: dict[str, Any], value: str | None, expected: bool) -> None:
    effect = ValueEffect.model_validate({"id": "x", "title": "x", "level": "high", "program": "kube-apiserver",
                                         "flag": "x", "consequence": "x", "fix": "x", "source": "x", **row})
    assert rule.matches(effect, value) is expected


def test_a_row_needs_one_place_and_one_predicate() -> None:
    common = {"id": "x", "title": "x", "level": "high", "consequence": "x", "fix": "x", "source": "x"}
    with pytest.raises(ValueError, match="one place"):
        ValueEffect.model_validate({**common, "program": "kube-apiserver", "flag": "x", "kind": "DaemonSet",
                                    "equals": "a"})
    with pytest.raises(ValueError, match="exactly one"):
        ValueEffect.model_validate({**common, "kind": "DaemonSet", "field": "spec.x", "equals": "a", "above": 1})


def _health_checks(entry: dict[str, Any], value: str) -> dict[str, Any]:
    [container] = [c for c in pod_spec(entry, "DaemonSet", DEVICE_PLUGIN)["containers"]
                   if c["name"] == "nvidia-device-plugin-ctr"]
    container["env"].append({"name": "DP_DISABLE_HEALTHCHECKS", "value": value})
    return entry


def test_trace15_health_checks_off_by_xids_is_medium_and_a_list_of_xids_is_not() -> None:
    # the fifteenth trace's PR 15: "xids" disables every health check, not the Xids a team meant
    [line] = _findings(snapshot(STACK), _health_checks(snapshot(STACK), "xids"))
    assert line.level == MEDIUM and "disables the plugin's health checks entirely" in line.summary
    [line] = _findings(snapshot(STACK), _health_checks(snapshot(STACK), "13,xids"))
    assert "Xid 79" in line.summary
    assert _findings(snapshot(STACK), _health_checks(snapshot(STACK), "13,31,43")) == []
