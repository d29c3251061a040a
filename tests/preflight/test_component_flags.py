"""component-flags: the shipped stacks render control-plane units and a metrics-server Deployment
whose flags the programs accept; a flag out of the program's own bounds (kube-apiserver's
ServerRunOptions.Validate, metrics-server v0.8.0's Options.validate) is a break naming the host or
workload, the value, upstream's message, the consequence and the kilonode setting.

The breaks are planted in the rendered units and the recorded Deployment, as a change to the
renderer, kilonode.plan.defaults or kilonode.k8s.metrics_server would render them."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.catalog.flag_validation import catalogue
from kilonode.preflight import run
from kilonode.preflight.checks.component_flags import broken, number
from tests.preflight.conftest import artefacts, inputs_of, resource

STACK = "research-7500"
UNIT = "etc/systemd/system/kube-apiserver.service"
CHECK = "component-flags"


def found(stack: str, files: dict[str, str] | None = None,
          graph: dict[str, Any] | None = None) -> list[tuple[str, str, str, str]]:
    return [(f.level, f.where, f.what, f.fix) for f in run(inputs_of(stack, files=files, graph=graph), [CHECK])]


def set_unit_flag(files: dict[str, str], host: str, flag: str, value: str) -> None:
    """The host's apiserver unit with the flag's value replaced (or added as the last flag)."""
    path = f"{host}/{UNIT}"
    lines = files[path].splitlines()
    at = [i for i, line in enumerate(lines) if line.strip().startswith(f"--{flag}=")]
    if at:
        end = " \\" if lines[at[0]].rstrip().endswith("\\") else ""
        lines[at[0]] = f"    --{flag}={value}{end}"
    else:
        last = max(i for i, line in enumerate(lines) if line.startswith("    --"))
        lines[last] = lines[last] + " \\"
        lines.insert(last + 1, f"    --{flag}={value}")
    files[path] = "\n".join(lines) + "\n"


def metrics_server_args(graph: dict[str, Any]) -> list[str]:
    deployment = resource(graph, "Deployment", "metrics-server")
    [container] = [c for c in deployment["inputs"]["spec"]["template"]["spec"]["containers"]
                   if c["name"] == "metrics-server"]
    args: list[str] = container["args"]
    return args


def with_arg(graph: dict[str, Any], flag: str, value: str) -> None:
    args = metrics_server_args(graph)
    args[:] = [a for a in args if not a.startswith(f"--{flag}=")] + [f"--{flag}={value}"]


def test_the_shipped_stacks_programs_accept_their_flags(shipped: str) -> None:
    assert found(shipped) == []


def test_the_catalogue_covers_the_programs_and_says_what_it_read() -> None:
    programs = catalogue().programs
    assert set(programs) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "metrics-server"}
    apiserver = {r.flag for r in programs["kube-apiserver"].rules}
    assert apiserver >= {"goaway-chance", "max-requests-inflight", "max-mutating-requests-inflight",
                         "request-timeout", "min-request-timeout", "shutdown-delay-duration", "livez-grace-period"}
    assert "kubernetes-1.34.2" in programs["kube-apiserver"].source
    assert "NOT read at v1.34.2" in programs["kube-controller-manager"].source
    assert programs["metrics-server"].defaults == {"metric-resolution": "60s", "kubelet-request-timeout": "10s"}


def test_a_goaway_chance_above_two_percent_keeps_the_apiserver_down() -> None:
    files, _ = artefacts(STACK)
    set_unit_flag(files, "apiserver-1", "goaway-chance", "0.05")
    [(level, where, what, fix)] = found(STACK, files=files)
    assert level == "break" and where == f"apiserver-1/{UNIT}"
    assert "--goaway-chance=0.05: " in what
    assert '"--goaway-chance can not be less than 0 or greater than 0.02"' in what
    assert "kube-apiserver exits at start" in what and "no apiserver serves" in what
    assert "kilonode.render.control_plane" in fix


def test_a_negative_max_requests_inflight_is_a_break_on_every_apiserver() -> None:
    files, _ = artefacts(STACK)
    hosts = [f"apiserver-{i}" for i in range(5)]
    for host in hosts:
        set_unit_flag(files, host, "max-requests-inflight", "-1")
    [(level, where, what, _)] = found(STACK, files=files)
    assert level == "break" and where == f"{UNIT} on {', '.join(hosts)}"
    assert "--max-requests-inflight=-1: " in what
    assert "--max-requests-inflight can not be negative value" in what


def test_a_five_second_metric_resolution_crash_loops_metrics_server() -> None:
    _, graph = artefacts(STACK)
    with_arg(graph, "metric-resolution", "5s")
    breaks = found(STACK, graph=graph)
    assert [(level, where) for level, where, _, _ in breaks] == [
        ("break", "Deployment kube-system/metrics-server container metrics-server")] * 2
    said = " ".join(what for _, _, what, _ in breaks)
    assert "metric-resolution should be a time duration at least 10s" in said
    assert "--metric-resolution=5s with --kubelet-request-timeout=10s" in said
    assert "metrics.k8s.io is unavailable" in said and "crash-loop" in said
    assert "METRICS_SERVER_RESOLUTION_S" in breaks[0][3]


def test_a_resolution_below_the_kubelet_timeout_over_nine_tenths_is_a_break() -> None:
    _, graph = artefacts(STACK)
    with_arg(graph, "metric-resolution", "15s")
    with_arg(graph, "kubelet-request-timeout", "14s")  # 15 s * 0.9 = 13.5 s < 14 s
    [(level, _, what, _)] = found(STACK, graph=graph)
    assert level == "break"
    assert "--metric-resolution=15s with --kubelet-request-timeout=14s" in what
    assert "metric-resolution should be larger than kubelet-request-timeout" in what
    with_arg(graph, "kubelet-request-timeout", "13s")
    assert found(STACK, graph=graph) == []


def test_values_parse_as_pflag_parses_them() -> None:
    [goaway] = [r for r in catalogue().programs["kube-apiserver"].rules if r.flag == "goaway-chance"]
    assert number(goaway, "0.02") == 0.02 and number(goaway, "2%") is None
    assert broken(goaway, {"goaway-chance": "0.02"}, {}) is None
    assert broken(goaway, {"goaway-chance": "-0.001"}, {}) == "--goaway-chance=-0.001"
    assert "not a float" in (broken(goaway, {"goaway-chance": "high"}, {}) or "")
    [delay] = [r for r in catalogue().programs["kube-apiserver"].rules if r.flag == "shutdown-delay-duration"]
    assert broken(delay, {"shutdown-delay-duration": "-5s"}, {}) == "--shutdown-delay-duration=-5s"
    assert broken(delay, {"shutdown-delay-duration": "1m30s"}, {}) is None
    [maxage] = [r for r in catalogue().programs["kube-apiserver"].rules if r.flag == "audit-log-maxage"]
    assert broken(maxage, {"audit-log-maxage": "-1"}, {}) is None  # no audit log file: not validated
    assert broken(maxage, {"audit-log-maxage": "-1", "audit-log-path": "/a.log"}, {}) == "--audit-log-maxage=-1"


@pytest.mark.parametrize("flag, value", [("request-timeout", "-1s"), ("min-request-timeout", "-1"),
                                         ("livez-grace-period", "-1s"), ("max-mutating-requests-inflight", "-3")])
def test_each_negative_serving_option_is_a_break(flag: str, value: str) -> None:
    files, _ = artefacts(STACK)
    set_unit_flag(files, "apiserver-0", flag, value)
    [(level, where, what, _)] = found(STACK, files=files)
    assert level == "break" and where == f"apiserver-0/{UNIT}" and f"--{flag}={value}" in what
