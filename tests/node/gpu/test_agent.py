"""The GPU health agent: its config, its decisions (sticky per boot), its dry-run on the real
H100 recordings and on faults derived from them, run as on the node (Debian's python3, the
standard library alone), and the bodies it sends checked against Kubernetes' OpenAPI schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kilonode.node.gpu import agent, protocol
from kilonode.node.gpu.readings import read_dir
from kilonode.node.gpu.rules import Finding, evaluate
from tests.node.gpu.nodes import DEBIAN_PYTHON, apply_status_patch, node, node_pythonpath, run_debian, validate
from tests.node.gpu.test_gpu_health import DERIVED, FIXTURES, XML, edit, fabric, writable_copy, xid_line

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CONFIG = {"expectGpus": 1, "gpuModel": "NVIDIA H100 80GB", "kubeconfig": "/etc/kubernetes/kubelet.kubeconfig",
          "nodeName": "nc-a100-000001"}


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    return writable_copy(tmp_path)


def config_file(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "gpu-health.json"
    data = {**CONFIG, "stateDir": str(tmp_path / "state"), **changes}
    path.write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return path


def documents(text: str) -> list[dict[str, Any]]:
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := next((i for i in range(at, len(text)) if not text[i].isspace()), len(text))) < len(text):
        value, at = decoder.raw_decode(text, at)
        found.append(value)
    return found


def dry_run(tmp_path: Path, recorded: Path) -> tuple[int, dict[str, Any], dict[str, Any] | None, str]:
    result = run_debian(tmp_path, "kilonode.gpu.agent", "--config", str(config_file(tmp_path)), "--dry-run",
                        "--from", str(recorded))
    docs = documents(result.stdout)
    assert docs, result.stdout + result.stderr
    patch = docs[0]
    assert patch["patch"] == "/api/v1/nodes/nc-a100-000001/status"
    assert patch["contentType"] == "application/strategic-merge-patch+json"
    event = docs[1]["body"] if len(docs) > 1 else None
    return result.returncode, patch["body"], event, result.stderr


def check_against_the_schema(patch: dict[str, Any], event: dict[str, Any] | None) -> dict[str, Any]:
    [condition] = patch["status"]["conditions"]
    after = apply_status_patch(node(), patch)
    validate(after)
    if event is not None:
        validate(event)
        # events.go (eventTime set): message <= 1024, reason/action <= 128
        assert len(event["message"]) <= 1024 and 0 < len(event["reason"]) <= 128 and event["action"]
        assert event["metadata"]["namespace"] == "default" and event["involvedObject"]["kind"] == "Node"
    return condition


# --- the dry-run on the recordings, as on a node ----------------------------------------------

def test_the_recorded_h100_reports_true_passed_with_its_figures(tmp_path: Path, recorded: Path) -> None:
    code, patch, event, _ = dry_run(tmp_path, recorded)
    assert code == 0
    condition = check_against_the_schema(patch, event)
    assert (condition["type"], condition["status"], condition["reason"]) == ("GPUHealthy", "True", "Passed")
    assert "1 of 1 GPUs (NVIDIA H100 80GB HBM3" in condition["message"]
    assert "bf16 GEMM median >= 665 TFLOP/s" in condition["message"] and "copy >= 3.01 TB/s" in condition["message"]
    assert event is not None and event["type"] == "Normal"
    assert not (tmp_path / "state").exists(), "a dry run writes no state"


@pytest.mark.parametrize("check", sorted(DERIVED))
def test_each_derived_fault_reports_false_naming_it(tmp_path: Path, recorded: Path, check: str) -> None:
    file, change = DERIVED[check]
    edit(recorded / file, change)
    code, patch, event, stderr = dry_run(tmp_path, recorded)
    assert code == 1
    condition = check_against_the_schema(patch, event)
    assert (condition["status"], condition["reason"]) == ("False", protocol.camel(check))
    assert condition["message"].startswith(f"{check}: ")
    assert event is not None and event["type"] == "Warning" and event["reason"] == "GPUUnhealthy"
    assert f"FAULT {check}: " in stderr


def test_an_xid_fault_is_named_by_its_code_and_every_fault_is_listed(tmp_path: Path, recorded: Path) -> None:
    log = recorded / "dmesg-xid.txt"
    log.write_text(log.read_text() + xid_line(79, "GPU has fallen off the bus."))
    edit(recorded / "nvidia-smi-q.xml", DERIVED["ecc-volatile"][1])
    _, patch, event, _ = dry_run(tmp_path, recorded)
    condition = check_against_the_schema(patch, event)
    assert condition["reason"] == "EccVolatile"  # the first fault, in evaluate's order
    assert [line.split(":")[0] for line in condition["message"].splitlines()] == ["ecc-volatile", "xid"]
    assert "Xid 79" in condition["message"]


def test_a_node_without_nvidia_smi_reports_the_gpus_unqueryable(tmp_path: Path) -> None:
    result = run_debian(tmp_path, "kilonode.gpu.agent", "--config", str(config_file(tmp_path)), "--dry-run")
    assert shutil.which("nvidia-smi") is None, "this test expects a machine without the NVIDIA tools"
    assert result.returncode == 1
    [condition] = documents(result.stdout)[0]["body"]["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "NvidiaSmi")
    assert "nvidia-smi is not installed" in condition["message"]


# --- decisions --------------------------------------------------------------------------------

def findings(recorded: Path) -> list[Finding]:
    return evaluate(read_dir(recorded), 1)


def test_a_failure_is_sticky_for_the_boot_and_keeps_its_transition_time(recorded: Path) -> None:
    state = agent.State("boot-1")
    first = agent.decide(state, findings(recorded), "all good", "2026-11-23T10:00:00Z", "n")
    assert first.condition["status"] == "True" and first.event is not None
    again = agent.decide(first.state, findings(recorded), "all good", "2026-11-23T10:05:00Z", "n")
    assert again.condition["lastTransitionTime"] == "2026-11-23T10:00:00Z"
    assert again.condition["lastHeartbeatTime"] == "2026-11-23T10:05:00Z"
    assert again.event is None  # nothing new to tell
    edit(recorded / "nvidia-smi-q.xml", DERIVED["remapped-rows-pending"][1])
    failed = agent.decide(again.state, findings(recorded), "", "2026-11-23T10:10:00Z", "n")
    assert (failed.condition["status"], failed.condition["lastTransitionTime"]) == ("False", "2026-11-23T10:10:00Z")
    # the counter clears (a GPU reset) but the boot is the same: still False, same failure
    clean = agent.decide(failed.state, findings(FIXTURES), "all good", "2026-11-23T10:15:00Z", "n")
    assert clean.condition["status"] == "False" and clean.condition["reason"] == "RemappedRowsPending"
    assert clean.condition["lastTransitionTime"] == "2026-11-23T10:10:00Z"
    # a reboot: new boot, new state
    rebooted = agent.decide(agent.State("boot-2"), findings(FIXTURES), "all good", "2026-11-23T11:00:00Z", "n")
    assert rebooted.condition["status"] == "True"


def test_the_state_survives_a_restart_in_the_same_boot_only(tmp_path: Path) -> None:
    state = agent.State("boot-1", "False", "EccVolatile", "ecc-volatile: ...", "2026-11-23T10:10:00Z", True, 5.0)
    state.save(tmp_path)
    assert agent.State.load(tmp_path, "boot-1") == state
    assert agent.State.load(tmp_path, "boot-2") == agent.State("boot-2")


def test_a_long_message_is_cut_to_the_event_limit_with_a_pointer() -> None:
    many = [Finding("xid", None, f"Xid 79 number {i}", "x" * 80) for i in range(40)]
    report = agent.decide(agent.State("b"), many, "", "2026-11-23T10:00:00Z", "nc-a100-000001")
    message = report.condition["message"]
    assert len(message) == protocol.MESSAGE_LIMIT
    assert message.endswith("all faults: journalctl -u kilonode-gpu-health on nc-a100-000001")
    assert report.condition["reason"] == "Xid79"
    validate(report.event or {})


def test_the_check_request_is_unknown_and_the_gpu_pods_are_found() -> None:
    report = agent.request_check(agent.State("b", "True", "Passed", "ok", "t0"), "2026-11-23T10:00:00Z", "n")
    assert (report.condition["status"], report.condition["reason"]) == ("Unknown", "ActiveCheckRequested")
    validate(apply_status_patch(node(), agent.status_patch(report.condition)))

    def pod(name: str, phase: str, resources: dict[str, Any], init: bool = False) -> dict[str, Any]:
        container = {"name": "c", "image": "i", "resources": resources}
        spec = {"initContainers": [container], "containers": [{"name": "m", "image": "i"}]} if init else \
            {"containers": [container]}
        return {"metadata": {"namespace": "ml", "name": name}, "spec": spec, "status": {"phase": phase}}

    pods = [
        pod("train", "Running", {"limits": {"nvidia.com/gpu": "8"}}),
        pod("warmup", "Pending", {"requests": {"nvidia.com/gpu": 1}}, init=True),
        pod("done", "Succeeded", {"limits": {"nvidia.com/gpu": "8"}}),
        pod("cpu", "Running", {"limits": {"cpu": "2"}}),
        pod("zero", "Running", {"limits": {"nvidia.com/gpu": "0"}}),
    ]
    assert agent.gpu_pods(pods) == ["ml/train", "ml/warmup"]


# --- config -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "message"), [
    ({"expectGpus": None}, "expectGpus must be a positive integer, not None"),
    ({"expectGpus": "8"}, "expectGpus must be a positive integer, not '8'"),
    ({"kubeconfig": ""}, "kubeconfig must be a non-empty string"),
    ({"passiveIntervalSeconds": 0}, "passiveIntervalSeconds must be a positive integer, not 0"),
    ({"passiveInterval": 60}, "unknown field(s) passiveInterval"),
])
def test_a_bad_config_names_the_file_and_field(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    path = config_file(tmp_path, **changes)
    with pytest.raises(agent.ConfigError, match=f"^{path}: .*") as error:
        agent.load_config(path)
    assert message in str(error.value)
    result = run_debian(tmp_path, "kilonode.gpu.agent", "--config", str(path), "--dry-run")
    assert result.returncode == 2 and message in result.stderr


def test_the_defaults_come_from_thresholds_toml(tmp_path: Path) -> None:
    config = agent.load_config(config_file(tmp_path))
    assert (config.passive_interval_s, config.active_interval_s, config.taint_wait_s, config.heartbeat_s) == \
        (300, 86400, 120, 3600)
    assert config.node_name == "nc-a100-000001" and config.expect_gpus == 1
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(agent.ConfigError, match=r"bad\.json: not JSON"):
        agent.load_config(tmp_path / "bad.json")


# --- the active check where it cannot run -------------------------------------------------------

def fake_nvidia_smi(tmp_path: Path) -> Path:
    """nvidia-smi answering with the recorded H100's outputs, so the agent's own collection
    (not --from) runs here; the CUDA libraries stay absent, as on this machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncase \"$*\" in\n  '-q -x') cat {FIXTURES / 'nvidia-smi-q.xml'} ;;\n"
                    "  *) exit 0 ;;\nesac\n")
    tool.chmod(0o755)
    # journalctl -k -b -o short-monotonic: the recorded kernel log's lines, plus kernel.log if written
    journal = bin_dir / "journalctl"
    journal.write_text(f"#!/bin/sh\n[ \"$*\" = '-k -b -o short-monotonic --no-pager' ] || exit 64\n"
                       f"cat {FIXTURES / 'dmesg-xid.txt'}\necho '[ 1.0] host kernel: unrelated line'\n"
                       f"cat {tmp_path / 'kernel.log'} 2>/dev/null\nexit 0\n")
    journal.chmod(0o755)
    return bin_dir


def test_the_active_check_without_cuda_libraries_is_unusable_never_a_pass(tmp_path: Path) -> None:
    from kilonode.node.gpu import active

    with pytest.raises(active.Unusable, match=r"cannot load libcublasLt\.so\.11 .*CUDA 11\.8 libraries"):
        active.run("NVIDIA H100 80GB HBM3")
    result = subprocess.run([sys.executable, "-m", "kilonode.cli", "gpu-health", "--from", str(FIXTURES), "--active"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "the active check could not run: cannot load" in " ".join(result.stderr.split())
    # the agent: the passive checks pass, the active one cannot run: Unknown, not True
    env = {**os.environ, "PATH": f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}"}
    python = node_pythonpath(tmp_path)
    result = subprocess.run([DEBIAN_PYTHON, "-S", "-m", "kilonode.gpu.agent", "--config", str(config_file(tmp_path)),
                             "--dry-run"], capture_output=True, text=True, timeout=120, check=False,
                            env={**env, "PYTHONPATH": str(python)})
    assert result.returncode == 2, result.stdout + result.stderr
    [condition] = documents(result.stdout)[0]["body"]["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("Unknown", "ActiveCheckUnusable")
    assert "cannot load libcublasLt.so.11" in condition["message"]
    validate(apply_status_patch(node(), documents(result.stdout)[0]["body"]))
    # a GPU fault in the kernel log still takes the node out
    (tmp_path / "kernel.log").write_text(xid_line(79, "GPU has fallen off the bus."))
    result = subprocess.run([DEBIAN_PYTHON, "-S", "-m", "kilonode.gpu.agent", "--config", str(config_file(tmp_path)),
                             "--dry-run"], capture_output=True, text=True, timeout=120, check=False,
                            env={**env, "PYTHONPATH": str(python)})
    [condition] = documents(result.stdout)[0]["body"]["status"]["conditions"]
    assert (result.returncode, condition["status"], condition["reason"]) == (1, "False", "Xid79")


# --- the idle re-check's sequence, against a recording client (no apiserver) --------------------

class Recorder:
    """Answers the agent's calls from a script and records what it sends."""

    def __init__(self, taint_after: int, pods: list[list[dict[str, Any]]], pending: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.gets = 0
        self.taint_after = taint_after
        self.pods = pods
        self.pending = pending  # the kubelet's startup taint (first registration)

    def list_pods_on(self, name: str) -> list[dict[str, Any]]:
        return self.pods.pop(0)

    def get_node(self, name: str) -> dict[str, Any]:
        self.gets += 1
        taints = [protocol.taint(protocol.CHECK_TAINT, protocol.CHECK_VALUE)] if self.gets > self.taint_after else []
        if self.pending:
            taints.append(protocol.taint(protocol.STARTUP_TAINT, protocol.STARTUP_VALUE))
        return node(name, taints=taints)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        [condition] = patch["status"]["conditions"]
        self.sent.append((condition["status"], condition["reason"]))
        return node(name)

    def create_event(self, event: dict[str, Any]) -> dict[str, Any]:
        return event


GPU_POD = {"metadata": {"namespace": "ml", "name": "train"}, "status": {"phase": "Running"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def idle_agent(tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> agent.Agent:
    config = agent.load_config(config_file(tmp_path, taintWaitSeconds=2))
    runner = agent.Agent(config, dry_run=False, recorded=FIXTURES)
    runner.client = recorder
    runner.state = agent.State("boot-1", "True", "Passed", "ok", "2026-11-23T10:00:00Z", False, 1.0, 0.0)
    monkeypatch.setattr(agent, "POLL_S", 0.01)
    monkeypatch.setattr(agent, "gpu_processes", lambda: [])
    return runner


def test_the_idle_recheck_waits_for_the_taint_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(taint_after=2, pods=[[], []])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    assert runner.idle_recheck() is True
    assert recorder.sent == [("Unknown", "ActiveCheckRequested"), ("True", "Passed")]
    assert recorder.gets == 3 and runner.state.last_active > 1.0
    assert agent.State.load(tmp_path / "state", runner.state.boot_id).status == "True"


def test_the_idle_recheck_gives_the_gpus_to_a_pod_that_arrived(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(taint_after=0, pods=[[], [GPU_POD]])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    assert runner.idle_recheck() is False
    assert recorder.sent == [("Unknown", "ActiveCheckRequested")]
    assert runner.state.last_active == 1.0, "no active check ran"
    runner.full_check(active=False)  # what the loop does next: the condition leaves Unknown
    assert recorder.sent[-1] == ("True", "Passed")
    # a GPU pod already there: nothing is asked at all
    recorder = Recorder(taint_after=0, pods=[[GPU_POD]])
    assert idle_agent(tmp_path, recorder, monkeypatch).idle_recheck() is False
    assert recorder.sent == []


def test_without_the_controllers_taint_the_recheck_is_given_up(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(taint_after=10**6, pods=[[]])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    # the 2 s of taintWaitSeconds pass on a fake clock: polled every POLL_S until they are up
    clock = FakeClock()
    monkeypatch.setattr(agent, "time", clock)
    monkeypatch.setattr(agent, "POLL_S", 0.5)
    assert runner.idle_recheck() is False
    assert recorder.sent == [("Unknown", "ActiveCheckRequested")]
    assert runner.state.last_active == 1.0
    assert (recorder.gets, clock.now) == (4, 2.0)


class FakeClock:
    """The `time` module as the agent reads it, where a sleep moves the monotonic clock on at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return time.time()


def test_the_first_check_of_a_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # first registration: the startup taint keeps pods away, so the check runs at once
    recorder = Recorder(taint_after=10**6, pods=[[]], pending=True)
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.state = agent.State("boot-1")
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and runner.state.last_active > 0
    assert recorder.pods == [], "the GPU pods were listed before the active check"
    # ... unless a GPU pod is already bound there (it tolerates the startup taint, or was
    # created with spec.nodeName, which no taint stops): passive only, the GPUs stay its own
    recorder = Recorder(taint_after=10**6, pods=[[GPU_POD]], pending=True)
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.state = agent.State("boot-1")
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and runner.state.last_active == 0
    # a reboot: no startup taint (it applies at registration only), the job's pods restart:
    # the agent asks for the GPUs first
    recorder = Recorder(taint_after=0, pods=[[], []])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.state = agent.State("boot-2")
    runner.startup()
    assert recorder.sent == [("Unknown", "ActiveCheckRequested"), ("True", "Passed")]
    # ... and with a GPU pod running, checks passively, leaving the active check for later
    recorder = Recorder(taint_after=0, pods=[[GPU_POD]])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.state = agent.State("boot-3")
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and runner.state.last_active == 0
    # an agent restarted later in a boot that had its active check: passive only
    recorder = Recorder(taint_after=0, pods=[])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and runner.state.last_active == 1.0


# --- the NVSwitch fabric: awaited before the first active check, judged at every check ---------

class FabricClock(FakeClock):
    """A fake clock whose sleeps also let the GPUs' fabric registration move on: at `at`
    seconds `change` is applied to the recorded nvidia-smi -q -x."""

    def __init__(self, recorded: Path, at: float | None = None, change: Any = None) -> None:
        super().__init__()
        self.recorded, self.at, self.change = recorded, at, change

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.at is not None and self.now >= self.at:
            edit(self.recorded / XML, self.change)
            self.at = None


def booting_agent(tmp_path: Path, recorded: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock,
                  **config: Any) -> tuple[agent.Agent, Recorder]:
    """An agent at its first start in a boot, at the node's first registration (the startup
    taint), reading the GPUs from `recorded` on `clock`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    recorder = Recorder(taint_after=10**6, pods=[[]], pending=True)
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.config = agent.load_config(config_file(tmp_path, **config))
    runner.recorded, runner.state = recorded, agent.State("boot-1")
    monkeypatch.setattr(agent, "time", clock)
    return runner, recorder


def sent_condition(runner: agent.Agent) -> dict[str, Any]:
    return {"status": runner.state.status, "reason": runner.state.reason, "message": runner.state.message or ""}


def test_the_agent_waits_for_the_fabric_to_complete_then_checks(tmp_path: Path, recorded: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # an HGX node booting: Fabric Manager has started (the unit's After=) but is still training
    # the fabric; CUDA now would fail with cudaErrorSystemNotReady for the rest of the boot
    edit(recorded / XML, fabric("In Progress", "N/A"))
    clock = FabricClock(recorded, at=40.0, change=fabric("Completed", "Success"))
    runner, recorder = booting_agent(tmp_path, recorded, monkeypatch, clock)
    runner.startup()
    # pending while it waits, then the first check (active) once the GPU is registered
    assert recorder.sent == [("Unknown", protocol.REASON_FABRIC_PENDING), ("True", "Passed")]
    assert clock.now == 40.0 and runner.state.last_active > 0
    assert recorder.pods == [], "the active check ran (the GPU pods were listed for it)"


def test_a_fabric_that_never_completes_is_a_fault_naming_the_gpu_once_the_wait_is_up(
        tmp_path: Path, recorded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edit(recorded / XML, fabric("In Progress", "N/A"))
    clock = FabricClock(recorded)
    runner, recorder = booting_agent(tmp_path, recorded, monkeypatch, clock)
    assert runner.config.fabric_wait_s == 300  # thresholds.toml [agent] fabric_wait_s
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_FABRIC_PENDING), ("False", "FabricNotCompleted")]
    assert clock.now == 300.0, "bounded by fabric_wait_s, polled every FABRIC_POLL_S"
    assert runner.state.message == ("fabric-not-completed: GPU 0 (GPU-7b81450a-b098-19f7-62c8-e757cc988445): not "
                                    "registered with the NVSwitch fabric: Fabric Manager is not running, restarted, "
                                    "or has not finished training the fabric [fabric/state = In Progress, "
                                    "fabric/status = N/A] -> RESTART_BM")
    assert runner.state.last_active == 0, "no active check on an unregistered fabric"
    # a registration that failed is not waited for: reported at once
    edit(recorded / XML, fabric("Completed", "Insufficient Resources"))
    clock = FabricClock(recorded)
    runner, recorder = booting_agent(tmp_path / "again", recorded, monkeypatch, clock, fabricWaitSeconds=30)
    runner.startup()
    assert recorder.sent == [("False", "FabricFailed")] and clock.now == 0
    assert "GPU 0 (GPU-7b81450a" in sent_condition(runner)["message"]
    assert "[fabric/state = Completed, fabric/status = Insufficient Resources]" in sent_condition(runner)["message"]


def test_a_gpu_without_an_nvswitch_fabric_is_not_waited_for(tmp_path: Path, recorded: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the recorded H100 (one GPU passed through, no NVSwitch) says N/A; a PCIe size and an A100
    # say N/A or Not Supported too
    for state in ("N/A", "Not Supported"):
        if state != "N/A":
            edit(recorded / XML, fabric(state, "N/A"))
        clock = FabricClock(recorded)
        runner, recorder = booting_agent(tmp_path / state.replace("/", ""), recorded, monkeypatch, clock)
        readings = runner.fabric_gpus()
        assert [(g.fabric_state, g.fabric_status) for g in readings] == [(state, "N/A")]
        runner.startup()
        assert recorder.sent == [("True", "Passed")] and clock.now == 0
        assert runner.state.last_active > 0
    # the control: the same agent with a GPU whose fabric is In Progress waits for it
    edit(recorded / XML, fabric("In Progress", "N/A"))
    clock = FabricClock(recorded, at=10.0, change=fabric("Completed", "Success"))
    runner, recorder = booting_agent(tmp_path / "hgx", recorded, monkeypatch, clock)
    runner.startup()
    assert recorder.sent[-1] == ("True", "Passed") and clock.now == 10.0


def test_a_fabric_manager_that_dies_is_seen_at_the_next_passive_check(tmp_path: Path, recorded: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    edit(recorded / XML, fabric("Completed", "Success"))
    clock = FabricClock(recorded)
    runner, recorder = booting_agent(tmp_path, recorded, monkeypatch, clock)
    runner.startup()
    assert recorder.sent == [("True", "Passed")] and clock.now == 0  # registered already: no wait
    # Fabric Manager dies (or restarts): the GPU's registration is no longer Completed
    edit(recorded / XML, fabric("In Progress", "N/A"))
    assert runner.full_check(active=False) == 1
    assert recorder.sent[-1] == ("False", "FabricNotCompleted")
    assert "GPU 0 (GPU-7b81450a-b098-19f7-62c8-e757cc988445)" in sent_condition(runner)["message"]
    # ... and one whose registration reports an error status
    edit(recorded / XML, fabric("Completed", "Insufficient Resources"))
    assert runner.full_check(active=False) == 1
    assert [f.line() for f in findings(recorded)] == [
        "fabric-failed: GPU 0 (GPU-7b81450a-b098-19f7-62c8-e757cc988445): NVSwitch fabric registration failed "
        "[fabric/state = Completed, fabric/status = Insufficient Resources] -> RESTART_BM"]


def test_the_pending_report_never_hides_a_failure_already_reported_in_the_boot(
        tmp_path: Path, recorded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edit(recorded / XML, fabric("In Progress", "N/A"))
    clock = FabricClock(recorded)
    runner, recorder = booting_agent(tmp_path, recorded, monkeypatch, clock, fabricWaitSeconds=10)
    runner.state = agent.State("boot-1", "False", "Xid79", "xid: ...", "2026-11-23T10:00:00Z", True)
    assert runner.await_fabric() is False
    assert recorder.sent == [] and runner.state.status == "False"


def test_an_unchanged_condition_is_written_only_as_a_heartbeat(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(taint_after=0, pods=[])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.state = agent.State("boot-1")
    assert runner.full_check(active=False) == 0
    assert runner.full_check(active=False) == 0
    assert recorder.sent == [("True", "Passed")]
    runner.state.last_sent -= 3600
    runner.full_check(active=False)
    assert recorder.sent == [("True", "Passed")] * 2


def test_a_pass_names_what_it_recorded_without_tainting(recorded: Path) -> None:
    from kilonode.node.gpu.rules import xid_catalog

    app = min(code for code, row in xid_catalog().items() if row.get("immediate") == "RESTART_APP")
    log = recorded / "dmesg-xid.txt"
    log.write_text(log.read_text() + xid_line(app, "an application's fault"))
    report = agent.decide(agent.State("b"), findings(recorded), "1 of 1 GPUs", "2026-11-23T10:00:00Z", "n")
    assert report.condition["status"] == "True"
    assert report.condition["message"].splitlines()[1].startswith(f"recorded, not tainting: xid: Xid {app} ")


def test_a_cuda_failure_in_the_active_check_is_a_fault_beside_the_passive_findings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.node.gpu import active

    def failing(model: str) -> dict[str, Any]:
        raise active.CudaFailure("cudaMalloc(134217728): CUDA error 2 (out of memory)")

    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    monkeypatch.setattr(active, "run", failing)
    config = agent.load_config(config_file(tmp_path, expectGpus=2))
    readings, found, unusable = agent.check(config, tmp_path / "work", True, None)
    assert readings is not None and unusable is None
    assert [(f.check, f.taints) for f in found] == [("gpu-count", True), ("active-check-error", True)]
    assert "out of memory" in found[1].evidence


def test_a_gpu_pod_that_arrived_during_the_active_check_voids_its_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.node.gpu import active

    burn = json.loads((FIXTURES / "burn.json").read_text())
    burn["gemm_bf16_8192"]["tflops_median"] = 100.0  # what sharing the GPU with a job looks like
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    monkeypatch.setattr(active, "run", lambda model: dict(burn))
    config = agent.load_config(config_file(tmp_path, expectGpus=2))
    # a pod bound before the check taint landed shows up once the check has run: the figures
    # are not judged (no active-gemm fault), the run is recorded as shared, not tainting
    readings, found, unusable = agent.check(config, tmp_path / "work", True, None, lambda: ["ml/train"])
    assert readings is not None and readings.burn is None and unusable is None
    assert [(f.check, f.taints) for f in found] == [("gpu-count", True), (agent.SHARED, False)]
    assert found[1].evidence == "ml/train"
    # the control: alone on the GPUs, the same figures fail the floor
    readings, found, unusable = agent.check(config, tmp_path / "work2", True, None, lambda: [])
    assert [(f.check, f.taints) for f in found] == [("gpu-count", True), ("active-gemm", True)]
    # and the agent does not count a shared run: the idle re-check stays due
    recorder = Recorder(taint_after=0, pods=[[GPU_POD]])
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.recorded = None
    monkeypatch.setattr(agent, "gpu_processes", lambda: [])
    runner.state.last_active = 1.0
    runner._full_check(tmp_path / "work3", active=True)
    assert runner.state.last_active == 1.0 and recorder.pods == []


def test_without_nvml_nvlink_is_said_to_be_unchecked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.node.gpu import nvml

    assert nvml.nvlink_states() is None, "this test expects a machine without libnvidia-ml.so.1"
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    config = agent.load_config(config_file(tmp_path))
    readings, found, _ = agent.check(config, tmp_path / "work", False, None)
    assert readings is not None and found == []
    assert not (tmp_path / "work" / "nvml.json").exists()
    text = agent.summary(readings, 1, None)
    assert "note: no nvml.json: NVLink state not checked" in text and "note: no burn.json" in text
    assert "no Xid" in text  # the (fake) journal was read
