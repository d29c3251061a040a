"""The GPU health agent's and taint controller's records and metrics (kilonode/node/gpu/metrics.py):
the agent's record after checks of the real H100 recordings and of a fault derived from them, its
figures as burn.json has them, what a restart and a reboot keep; the controller's record after a
list, a conflicting write and a watch, and after failures; the record written in one rename and
readable by another user; every record that cannot be read answered `state_readable 0`, never an
error; the exposition read back by a strict parser (tests/node/gpu/exposition.py); and the program
behind a real accepting socket, run by Debian's python3 from the package as the image ships it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kilonode.node.gpu import agent, controller, metrics, protocol
from kilonode.node.gpu.kubeapi import ApiError
from kilonode.node.gpu.rules import Finding
from kilonode.plan import defaults
from tests.node.gpu.exposition import ExpositionError, parse, values
from tests.node.gpu.nodes import DEBIAN_PYTHON, node, node_pythonpath
from tests.node.gpu.test_agent import GPU_POD, Recorder, config_file
from tests.node.gpu.test_gpu_health import DERIVED, FIXTURES, edit, writable_copy

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

A = "kilonode_gpu_health"
C = "kilonode_gpu_health_controller"
BURN = json.loads((FIXTURES / "burn.json").read_text())


def checked_agent(tmp_path: Path, recorded: Path, monkeypatch: pytest.MonkeyPatch) -> agent.Agent:
    """An agent on the recorded outputs, its API a recording client, after one full check."""
    config = agent.load_config(config_file(tmp_path))
    runner = agent.Agent(config, dry_run=False, recorded=recorded)
    runner.client = Recorder(taint_after=0, pods=[[], []])
    monkeypatch.setattr(agent, "gpu_processes", lambda: [])
    runner.full_check(active=True)
    return runner


def agent_answer(tmp_path: Path, boot: str | None = None) -> dict[str, float]:
    record = metrics.read_json(tmp_path / "state" / metrics.METRICS_FILE)
    return values(metrics.agent_metrics(record, boot))


def test_the_recorded_h100_passes_and_its_record_says_what_was_checked_found_and_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = time.time()
    runner = checked_agent(tmp_path, writable_copy(tmp_path), monkeypatch)
    found = agent_answer(tmp_path, runner.state.boot_id)
    assert found[f"{A}_state_readable"] == 1
    for check in ("passive", "active"):
        assert before <= found[f'{A}_last_check_timestamp_seconds{{check="{check}"}}'] <= time.time()
        assert found[f'{A}_check_result{{check="{check}",result="passed"}}'] == 1
        assert found[f'{A}_check_result{{check="{check}",result="failed"}}'] == 0
    assert [found[f'{A}_condition{{status="{s}"}}'] for s in ("True", "False", "Unknown")] == [1, 0, 0]
    # one GPU of the one expected; the driver the recording's nvidia-smi names
    assert (found[f"{A}_gpus"], found[f"{A}_gpus_expected"]) == (1, 1)
    assert found[f'{A}_driver_info{{driver="580.159.04",model="NVIDIA H100 80GB HBM3"}}'] == 1
    # the active check's figures as burn.json has them, in base units
    assert found[f'{A}_active_gemm_bf16_flops_per_second{{gpu="0"}}'] == BURN["gemm_bf16_8192"]["tflops_median"] * 1e12
    assert found[f'{A}_active_gemm_max_relative_error{{gpu="0"}}'] == BURN["gemm_bf16_max_rel_error_vs_fp64"]
    assert found[f'{A}_active_copy_bytes_per_second{{gpu="0"}}'] == BURN["d2d_copy_TBps_read_plus_write"] * 1e12
    # the condition was written: the report's time is the agent's last_sent
    assert found[f"{A}_last_report_timestamp_seconds"] == runner.state.last_sent
    assert found[f"{A}_errors_total"] == 0
    assert not any(key.startswith(f"{A}_findings") for key in found), "the clean recording finds nothing"


@pytest.mark.parametrize(("fault", "failed", "passed"), [("ecc-volatile", "passive", "active"),
                                                          ("active-gemm", "active", "passive")])
def test_a_derived_fault_fails_its_kind_of_check_turns_the_condition_false_and_is_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, failed: str, passed: str) -> None:
    recorded = writable_copy(tmp_path)
    file, change = DERIVED[fault]
    edit(recorded / file, change)
    runner = checked_agent(tmp_path, recorded, monkeypatch)
    found = agent_answer(tmp_path, runner.state.boot_id)
    assert found[f'{A}_check_result{{check="{failed}",result="failed"}}'] == 1
    assert found[f'{A}_check_result{{check="{passed}",result="passed"}}'] == 1
    assert [found[f'{A}_condition{{status="{s}"}}'] for s in ("True", "False", "Unknown")] == [0, 1, 0]
    findings = {k: v for k, v in found.items() if k.startswith(f"{A}_findings")}
    assert findings == {f'{A}_findings{{rule="{fault}",tainting="true"}}': 1}


def finding(rule: str, taints: bool = True) -> Finding:
    return Finding(rule, None, "m", "e", taints=taints)


@pytest.mark.parametrize(("findings", "active", "unusable", "results"), [
    ([], True, None, {"passive": "passed", "active": "passed"}),
    ([], False, None, {"passive": "passed"}),
    ([finding("xid", taints=False)], True, None, {"passive": "passed", "active": "passed"}),
    ([finding("ecc-volatile")], True, None, {"passive": "failed", "active": "passed"}),
    ([finding("active-gemm")], True, None, {"passive": "passed", "active": "failed"}),
    ([finding("active-check-error")], True, None, {"passive": "passed", "active": "failed"}),
    ([finding(agent.SHARED, taints=False)], True, None, {"passive": "passed", "active": "shared"}),
    ([], True, "cannot load libcublasLt.so.11", {"passive": "passed", "active": "unusable"}),
    # nvidia-smi could not run: the GPUs were never reached, so no active check ran either
    ([finding("nvidia-smi")], False, None, {"passive": "failed"}),
])
def test_each_kind_of_check_has_its_own_result(findings: list[Finding], active: bool, unusable: str | None,
                                               results: dict[str, str]) -> None:
    assert agent.check_results(findings, active, unusable) == results


def test_the_active_rules_are_the_ones_named_so() -> None:
    from kilonode.node.gpu import rules

    assert agent.SHARED.startswith(agent.ACTIVE_RULES)
    burn = {"device": "NVIDIA H100 80GB HBM3", "stack": "cublas11",
            "gpus": [{"index": 0, "gemm_bf16_8192": {"tflops_median": 1.0}, "gemm_bf16_max_rel_error_vs_fp64": 1.0,
                      "d2d_copy_TBps_read_plus_write": 0.1}]}
    readings = type("R", (), {"burn": burn})()
    names = {f.check for f in rules.burn_findings(readings, rules.thresholds())}  # type: ignore[arg-type]
    assert names == {"active-gemm", "active-gemm-correctness", "active-memory-bandwidth"}
    assert all(name.startswith(agent.ACTIVE_RULES) for name in names)
    # per GPU, with the index the active check gives each
    assert [f.gpu for f in agent.burn_figures(burn)] == ["0"]
    assert agent.burn_figures({"gpus": [{"index": 3, "gemm_bf16_8192": {"tflops_median": "x"}}]}) == [
        metrics.Figures("3")]


def test_a_restart_in_the_same_boot_keeps_the_record_and_a_reboot_starts_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = checked_agent(tmp_path, writable_copy(tmp_path), monkeypatch)
    path = tmp_path / "state" / metrics.METRICS_FILE
    first = runner.record
    assert first is not None
    again = metrics.AgentRecord.begin(path, first.boot_id, first.first_start + 60, 8)
    assert (again.first_start, again.checks, again.expect_gpus) == (first.first_start, first.checks, 8)
    fresh = metrics.AgentRecord.begin(path, "another-boot", first.first_start + 60, 8)
    assert (fresh.first_start, fresh.checks) == (first.first_start + 60, {})
    # the scrape refuses a record of another boot (a /run that is not tmpfs)
    assert agent_answer(tmp_path, "another-boot") == {f"{A}_state_readable": 0}


def test_the_loop_counts_its_failures_and_writes_the_record_before_the_first_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = agent.load_config(config_file(tmp_path))
    runner = agent.Agent(config, dry_run=False, recorded=FIXTURES)

    class Down:
        def get_node(self, name: str) -> dict[str, Any]:
            raise ApiError(503, "Service Unavailable", "")

    class Stop(BaseException):
        pass

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise Stop

    runner.client = Down()
    monkeypatch.setattr(agent.time, "sleep", sleep)
    with pytest.raises(Stop):
        runner.loop()
    found = agent_answer(tmp_path, runner.state.boot_id)
    assert found[f"{A}_errors_total"] == 3 and sleeps == [agent.RETRY_S] * 3
    assert found[f"{A}_first_start_timestamp_seconds"] <= time.time()
    assert not any(k.startswith(f"{A}_last_check") for k in found), "no check yet"
    assert found[f'{A}_check_result{{check="passive",result="passed"}}'] == 0


def test_the_record_is_replaced_in_one_rename_readable_by_others(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run" / metrics.METRICS_FILE
    metrics.write_atomic(path, {"format": metrics.FORMAT, "n": 1})
    inode = path.stat().st_ino
    metrics.write_atomic(path, {"format": metrics.FORMAT, "n": 2})
    assert path.stat().st_ino != inode, "a new file renamed over the old, not the old rewritten"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == [metrics.METRICS_FILE]
    # a write that fails half-way leaves the old record whole and no temporary file behind
    monkeypatch.setattr(metrics.json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(OSError):
        metrics.write_atomic(path, {"format": metrics.FORMAT, "n": 3})
    assert json.loads(path.read_text())["n"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == [metrics.METRICS_FILE]


GOOD_AGENT = {"format": 1, "boot_id": "b", "first_start": 1.0, "checks": {"passive": {"at": 2.0, "result": "passed"}}}


@pytest.mark.parametrize("text", [
    None,  # no file
    "",
    '{"format": 1, "boot_id": "b", ',  # torn
    "[1, 2]",
    json.dumps({**GOOD_AGENT, "format": 2}),  # another layout
    json.dumps({**GOOD_AGENT, "checks": {"passive": {"at": "soon", "result": "passed"}}}),
    json.dumps({**GOOD_AGENT, "checks": {"passive": {"at": 2.0, "result": "shared"}}}),  # not a passive result
    json.dumps({**GOOD_AGENT, "checks": {"passive": "passed"}}),
    json.dumps({**GOOD_AGENT, "condition": "Maybe"}),
    json.dumps({**GOOD_AGENT, "findings": [["xid", "yes", 1]]}),
    json.dumps({**GOOD_AGENT, "figures": [{"gpu": "0", "copy_tbps": "fast"}]}),
    json.dumps({**GOOD_AGENT, "figures": [{"gpu": "0", "unknown_field": 1}]}),
    json.dumps({k: v for k, v in GOOD_AGENT.items() if k != "first_start"}),
])
def test_a_record_that_cannot_be_read_is_said_so_and_nothing_else(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / metrics.METRICS_FILE
    if text is not None:
        path.write_text(text)
    assert values(metrics.agent_metrics(metrics.read_json(path), "b")) == {f"{A}_state_readable": 0}
    assert values(metrics.controller_metrics(metrics.read_json(path))) == {f"{C}_state_readable": 0}
    # the control: the good record is readable
    path.write_text(json.dumps(GOOD_AGENT))
    assert values(metrics.agent_metrics(metrics.read_json(path), "b"))[f"{A}_state_readable"] == 1


def full_agent_record(gpus: int) -> metrics.AgentRecord:
    record = metrics.AgentRecord("b", 1.0, expect_gpus=gpus, gpus=gpus, driver="535.261.03", model="NVIDIA A100",
                                 condition="True", last_report=3.0,
                                 figures=[metrics.Figures(str(i), 300.0, 0.002, 1.5) for i in range(gpus)])
    record.note_check("passive", 2.0, "passed")
    record.note_check("active", 2.0, "passed")
    return record


def test_the_series_are_those_the_plan_counts() -> None:
    """kilonode.plan.defaults.monitoring's exact figures: the agent's fixed series and three per GPU,
    the controller's; the findings (an estimate there) come on top, one series per rule seen."""
    for gpus in (1, 8):
        samples, _ = parse(metrics.agent_metrics(json.loads(json.dumps(_data(full_agent_record(gpus)))), "b"))
        assert len(samples) == (defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE
                                + defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_GPU * gpus)
    record = full_agent_record(8)
    record.note_findings([("pcie-width-idle", False)] * 8 + [("xid", False)])
    samples, _ = parse(metrics.agent_metrics(_data(record), "b"))
    assert len(samples) == defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE + 3 * 8 + 2
    assert samples[(f"{A}_findings", frozenset({("rule", "pcie-width-idle"), ("tainting", "false")}))] == 8
    controller_record = metrics.ControllerRecord(1.0, last_sync=2.0)
    samples, kinds = parse(metrics.controller_metrics(_data(controller_record)))
    assert len(samples) == defaults.PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER
    assert kinds[f"{C}_taints_added_total"] == "counter"


def _data(record: metrics.AgentRecord | metrics.ControllerRecord) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(record).items() if k != "saved"}


def test_a_hostile_driver_string_stays_inside_its_label() -> None:
    record = full_agent_record(1)
    record.driver = 'evil"} 1\nkilonode_gpu_health_condition{status="True'
    text = metrics.agent_metrics(_data(record), "b")
    found = values(text)
    assert found[f'{A}_driver_info{{driver="{record.driver}",model="NVIDIA A100"}}'] == 1
    assert sum(1 for line in text.splitlines() if line.startswith(f"{A}_condition")) == 3
    # and the reader can fail: the same line unescaped is refused
    with pytest.raises(ExpositionError):
        parse(text.replace('\\"} 1\\n', '"} 1\n'))


def test_not_a_number_and_infinity_are_written_as_the_format_spells_them() -> None:
    assert [metrics.value(x) for x in (float("nan"), float("inf"), float("-inf"), 3, 0.5)] == [
        "NaN", "+Inf", "-Inf", "3", "0.5"]


# --- the controller -----------------------------------------------------------------------------------
PENDING = protocol.taint(protocol.STARTUP_TAINT, protocol.STARTUP_VALUE)


def passed() -> dict[str, Any]:
    return {"type": protocol.CONDITION, "status": "True", "reason": protocol.REASON_PASSED, "message": "ok",
            "lastHeartbeatTime": "2026-11-23T10:00:00Z", "lastTransitionTime": "2026-11-23T10:00:00Z"}


class Stop(BaseException):
    """Ends the controller's endless loop from inside the fake API."""


class Api:
    """A list of two Nodes (one passed its check, one without the condition), whose first write
    is refused 409; one watch with a fault, ended normally by the server; then `after` happens."""

    def __init__(self, after: BaseException) -> None:
        self.after = after
        self.puts = 0
        self.watches = 0
        self.pending = node("gpu-0", taints=[PENDING], conditions=[passed()])
        self.plain = node("cpu-0")
        failed = {**passed(), "status": "False", "reason": "EccVolatile"}
        self.failing = node("gpu-1", conditions=[failed])
        self.failing["metadata"]["resourceVersion"] = "5000"

    def list_nodes(self) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": "4711"}, "items": [self.pending, self.plain]}

    def replace_node(self, body: dict[str, Any]) -> dict[str, Any]:
        self.puts += 1
        if self.puts == 1:
            raise ApiError(409, "Conflict", "the object has been modified")
        return body

    def get_node(self, name: str) -> dict[str, Any]:
        return self.pending

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        raise ApiError(403, "Forbidden", "events")

    def watch(self, path: str, version: str, timeout_s: int) -> Any:
        self.watches += 1
        if self.watches > 1:
            raise self.after
        yield {"type": "MODIFIED", "object": self.failing}


def test_the_controllers_record_after_a_list_a_conflict_and_a_watch(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run" / metrics.METRICS_FILE
    api = Api(Stop())
    start = time.time()
    with pytest.raises(Stop):
        controller.run(api, "apiserver-0", lambda line: None, controller.Recorder(path, lambda line: None))
    found = values(metrics.controller_metrics(metrics.read_json(path)))
    assert found[f"{C}_state_readable"] == 1
    assert start <= found[f"{C}_start_timestamp_seconds"] <= found[f"{C}_last_sync_timestamp_seconds"] <= time.time()
    assert (found[f"{C}_lists_total"], found[f"{C}_nodes"], found[f"{C}_nodes_reporting"]) == (1, 2, 1)
    # gpu-0: refused once (409), read again, written; gpu-1 (from the watch): tainted
    assert (found[f"{C}_write_conflicts_total"], found[f"{C}_node_writes_total"]) == (1, 2)
    assert found[f'{C}_taints_removed_total{{taint="{protocol.STARTUP_TAINT}"}}'] == 1
    assert found[f'{C}_taints_added_total{{taint="{protocol.FAULT_TAINT}"}}'] == 1
    assert found[f'{C}_taints_added_total{{taint="{protocol.CHECK_TAINT}"}}'] == 0
    # every Event refused (gpu-0's taint removed; gpu-1's taint added, its scale-down hold): counted,
    # the writes stand
    assert found[f"{C}_event_errors_total"] == 3 and found[f"{C}_errors_total"] == 0


def test_the_controller_counts_its_failures_and_gives_up_on_a_node_after_repeated_conflicts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / metrics.METRICS_FILE
    api = Api(RuntimeError("watch broke"))
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise Stop

    monkeypatch.setattr(controller.time, "sleep", sleep)
    with pytest.raises(Stop):
        controller.run(api, "apiserver-0", lambda line: None, controller.Recorder(path, lambda line: None))
    found = values(metrics.controller_metrics(metrics.read_json(path)))
    assert found[f"{C}_errors_total"] == 2 and found[f"{C}_lists_total"] == 2
    record = metrics.ControllerRecord(1.0)

    class Conflicts:
        def replace_node(self, body: dict[str, Any]) -> dict[str, Any]:
            raise ApiError(409, "Conflict", "")

        def get_node(self, name: str) -> dict[str, Any]:
            return api.pending

    controller.reconcile(Conflicts(), api.pending, "apiserver-0", lambda line: None, record)
    assert (record.conflicts, record.gave_up, record.writes) == (controller.CONFLICT_RETRIES, 1, 0)


def test_a_record_that_cannot_be_written_never_stops_the_controller(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    said: list[str] = []
    recorder = controller.Recorder(blocked / "sub" / metrics.METRICS_FILE, said.append)
    recorder.save(force=True)
    recorder.save(force=True)
    assert len(said) == 1 and "cannot be written" in said[0], "said once, not at every save"


def test_the_controllers_record_is_written_at_most_every_few_seconds_while_it_works(tmp_path: Path) -> None:
    path = tmp_path / metrics.METRICS_FILE
    record = metrics.ControllerRecord(1.0)
    record.save(path, 100.0)
    record.writes = 7
    record.save(path, 100.0 + metrics.SAVE_EVERY_S / 2)
    assert json.loads(path.read_text())["writes"] == 0
    record.save(path, 100.0 + metrics.SAVE_EVERY_S / 2, force=True)
    assert json.loads(path.read_text())["writes"] == 7 and "saved" not in json.loads(path.read_text())


# --- behind a real socket, as the rendered units run it ------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ask(port: int, request: bytes, deadline: float) -> str:
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(request)
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                return data.decode()
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("program", ["agent", "controller"])
def test_behind_a_real_accepting_socket_each_scrape_gets_the_record_as_it_is_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str) -> None:
    if not shutil.which("systemd-socket-activate"):
        pytest.fail("systemd-socket-activate missing (Debian's systemd package)")
    if program == "agent":
        checked_agent(tmp_path, writable_copy(tmp_path), monkeypatch)
        record = tmp_path / "state" / metrics.METRICS_FILE
        metric, expect = f"{A}_check_result", {'check="passive",result="passed"': 1.0}
    else:
        record = tmp_path / "controller" / metrics.METRICS_FILE
        metrics.ControllerRecord(time.time(), last_sync=time.time(), lists=1).save(record, time.time())
        metric, expect = f"{C}_lists_total", {"": 1.0}
    port = free_port()
    # --inetd: the connection on stdin and stdout, as the rendered service's StandardInput=socket;
    # Debian's python3 with the package alone, as the image ships it (-E: the child's environment,
    # as the service's Environment=PYTHONPATH)
    server = subprocess.Popen(["systemd-socket-activate", "--accept", "--inetd", "-l", f"127.0.0.1:{port}",
                               "-E", f"PYTHONPATH={node_pythonpath(tmp_path)}", "-E", "PYTHONDONTWRITEBYTECODE=1",
                               DEBIAN_PYTHON, "-S", "-m", "kilonode.gpu.metrics", program, "--state", str(record)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        head, _, body = ask(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n",
                            deadline).partition("\r\n\r\n")
        assert head.startswith("HTTP/1.0 200 OK") and "text/plain; version=0.0.4" in head
        assert f"Content-Length: {len(body.encode())}" in head
        found = values(body)
        for labels, number in expect.items():
            assert found[f"{metric}{{{labels}}}" if labels else metric] == number
        # HEAD: the head alone; POST: refused
        head_only = ask(port, b"HEAD /metrics HTTP/1.0\r\n\r\n", deadline)
        assert head_only.startswith("HTTP/1.0 200 OK") and head_only.endswith("\r\n\r\n")
        assert ask(port, b"POST /metrics HTTP/1.0\r\n\r\n", deadline).startswith("HTTP/1.0 405")
        # the record gone (the agent's unit stopped, /run cleared): still an answer, saying so
        record.unlink()
        head, _, body = ask(port, b"GET /metrics HTTP/1.0\r\n\r\n", deadline).partition("\r\n\r\n")
        assert head.startswith("HTTP/1.0 200 OK")
        prefix = A if program == "agent" else C
        assert values(body) == {f"{prefix}_state_readable": 0}
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_print_writes_the_metrics_alone(tmp_path: Path) -> None:
    record = tmp_path / metrics.METRICS_FILE
    metrics.ControllerRecord(1.0).save(record, 2.0, force=True)
    out = subprocess.run([sys.executable, "-m", "kilonode.node.gpu.metrics", "controller", "--state", str(record),
                          "--print"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert values(out)[f"{C}_state_readable"] == 1 and not out.startswith("HTTP")


def test_a_gpu_pod_voiding_the_active_check_is_recorded_as_shared(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.node.gpu import active
    from tests.node.gpu.test_agent import fake_nvidia_smi, idle_agent

    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    monkeypatch.setattr(active, "run", lambda model: dict(BURN))
    runner = idle_agent(tmp_path, Recorder(taint_after=0, pods=[[GPU_POD]]), monkeypatch)
    runner.recorded = None
    runner._full_check(tmp_path / "work", active=True)
    assert runner.record is not None
    found = agent_answer(tmp_path, runner.record.boot_id)
    assert found[f'{A}_check_result{{check="active",result="shared"}}'] == 1
    assert found[f'{A}_findings{{rule="{agent.SHARED}",tainting="false"}}'] == 1
    assert not any(k.startswith(f"{A}_active_") for k in found), "the voided figures are not shown"
