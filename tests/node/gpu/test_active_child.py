"""The active check's CUDA work runs in a child process (kilonode.gpu.active), so a sticky CUDA
error dies with the child: cudaErrorSystemNotReady (802) before Fabric Manager has trained an
NVSwitch fabric, which on A100 HGX nvidia-smi cannot show (its fabric state says N/A). Until
the fabric wait's deadline the agent reports pending and tries again; past it, a fault.

No GPU here: two fakes stand in, each in a real child process. A fake CUDA (a sitecustomize
on the child's PYTHONPATH replaces ctypes.CDLL for the CUDA libraries) runs the real child,
`python -m kilonode.node.gpu.active`, up to cudaGetDeviceCount, which answers per a plan. A
fake child runs the real child's main with `measure` answering per a plan: a CUDA error
through the real classification (active._cuda), or the recorded H100's burn.json."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
from pathlib import Path

import pytest

from kilonode.node.gpu import active, agent, protocol
from tests.node.gpu.test_agent import FakeClock, Recorder, config_file, fake_nvidia_smi, idle_agent
from tests.node.gpu.test_gpu_health import FIXTURES

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

FAKE_CUDA = '''\
import ctypes, os, sys, time, types

LOG, PLAN = {log!r}, {plan!r}
TEXT = {{802: b"system not yet initialized", 999: b"unknown error"}}
_real_cdll = ctypes.CDLL


def _step():
    with open(LOG, "a+") as log:
        log.seek(0)
        tries = len(log.read().split())
        log.write(f"{{os.getpid()}}\\n")
    return PLAN[min(tries, len(PLAN) - 1)]


class _Library:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args):
            if name == "cudaGetDeviceCount":  # the runtime's first call: cuInit
                step = _step()
                if step == "hang":
                    time.sleep(3600)
                if step == "kill":  # a crash, or the OOM killer
                    os.kill(os.getpid(), 9)
                if step == "bug":  # an error the child does not expect
                    raise KeyError("x")
                return int(step)
            if name == "cudaGetErrorString":
                return TEXT.get(args[0], b"?")
            raise AssertionError(f"fake CUDA: {{name}} is not expected")

        setattr(self, name, call)
        return call


def _cdll(name, *args, **kwargs):
    if os.path.basename(str(name)).startswith(("libcudart", "libcublas")):
        return _Library()
    return _real_cdll(name, *args, **kwargs)


ctypes.CDLL = _cdll
try:
    import numpy  # noqa: F401
except ImportError:
    sys.modules["numpy"] = types.ModuleType("numpy")  # only imported to see that it is there
'''

FAKE_CHILD = '''\
import json, os, sys
from kilonode.node.gpu import active

LOG, PLAN, BURN = {log!r}, {plan!r}, {burn!r}


class _Runtime:
    @staticmethod
    def cudaGetErrorString(code):
        return {{802: b"system not yet initialized", 2: b"out of memory"}}.get(code, b"?")


class _Libs:
    cudart = _Runtime


def measure(model, seconds):
    with open(LOG, "a+") as log:
        log.seek(0)
        tries = len(log.read().split())
        log.write(f"{{os.getpid()}}\\n")
    step = PLAN[min(tries, len(PLAN) - 1)]
    if step == "burn":
        return json.load(open(BURN))
    call, code, init = step
    active._cuda(_Libs, code, call, init=init)


active.measure = measure
raise SystemExit(active.main(sys.argv[1:]))
'''


def fake_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *plan: str) -> Path:
    """The real child on a fake CUDA: its cudaGetDeviceCount answers plan[try] (a CUDA error
    number, or "hang", "kill", "bug"; the last one repeats). Returns the log of the pids that
    called it."""
    where, log = tmp_path / "fake-cuda", tmp_path / "cuda-calls.log"
    where.mkdir()
    (where / "sitecustomize.py").write_text(FAKE_CUDA.format(log=str(log), plan=list(plan)))
    monkeypatch.setenv("PYTHONPATH", str(where))  # the child gets the package's root before it
    return log


def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *plan: object) -> Path:
    """The real child's main with `measure` answering plan[try]: "burn" (the recorded H100's
    burn.json) or (CUDA call, error, whether the call initialises CUDA). Returns the pid log."""
    script, log = tmp_path / "fake_child.py", tmp_path / "child-calls.log"
    script.write_text(FAKE_CHILD.format(log=str(log), plan=list(plan), burn=str(FIXTURES / "burn.json")))
    monkeypatch.setattr(active, "child_command", lambda model, seconds: [
        sys.executable, str(script), "--model", model, "--seconds", repr(seconds)])
    return log


def pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def booting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: object) -> tuple[agent.Agent, Recorder,
                                                                                          FakeClock]:
    """An agent at its first start in a boot (the startup taint), running the tools itself: a
    fake nvidia-smi answers with the recorded GPU, whose fabric state is N/A, as an A100 HGX's
    is even with Fabric Manager running; so await_fabric has nothing to wait for."""
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path)}:{os.environ['PATH']}")
    recorder = Recorder(taint_after=10**6, pods=[[], []], pending=True)
    runner = idle_agent(tmp_path, recorder, monkeypatch)
    runner.config = agent.load_config(config_file(tmp_path, **config))
    runner.recorded, runner.state = None, agent.State("boot-1")
    clock = FakeClock()
    monkeypatch.setattr(agent, "time", clock)
    return runner, recorder, clock


def test_the_active_checks_cuda_runs_in_a_child_process_not_the_agents(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_cuda(tmp_path, monkeypatch, "802")
    with pytest.raises(active.SystemNotReady) as error:
        active.run("NVIDIA A100-SXM4-40GB", timeout_s=60)
    assert str(error.value) == "cudaGetDeviceCount: CUDA error 802 (system not yet initialized)"
    assert error.value.code == active.CUDA_ERROR_SYSTEM_NOT_READY == 802
    # CUDA was called once, by another process; this one never loaded the (fake) libraries
    [child] = pids(log)
    assert child != os.getpid()
    assert isinstance(ctypes.CDLL, type), "this process's ctypes is the real one: the fake is the child's"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # gone, and its sticky error with it


def test_cuda_not_ready_then_ready_is_pending_then_healthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an A100 HGX booting: nvidia-smi says the fabric state is N/A, so the agent does not wait;
    # CUDA says 802 twice while Fabric Manager trains the fabric, then the check runs
    log = fake_child(tmp_path, monkeypatch, ("cudaGetDeviceCount", 802, True), ("cudaSetDevice(3)", 802, True),
                     "burn")
    runner, recorder, clock = booting(tmp_path, monkeypatch)
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_FABRIC_PENDING), ("True", "Passed")]
    assert clock.now == 2 * agent.CUDA_RETRY_S, "two sleeps, then the third try ran"
    tries = pids(log)
    assert len(tries) == 3 and len(set(tries)) == 3 and os.getpid() not in tries, "each try a fresh process"
    assert runner.state.last_active > 0 and "bf16 GEMM median >= 665 TFLOP/s" in (runner.state.message or "")
    assert recorder.pods == [], "the GPU pods were listed before the check and after it"


def test_the_pending_report_says_cuda_is_not_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_child(tmp_path, monkeypatch, ("cudaGetDeviceCount", 802, True))
    runner, recorder, _ = booting(tmp_path, monkeypatch, fabricWaitSeconds=10)
    sent: list[agent.Report] = []
    send = runner.send
    monkeypatch.setattr(runner, "send", lambda report: (sent.append(report), send(report)))
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_FABRIC_PENDING), ("False", "ActiveCheckError")]
    assert [r.condition["reason"] for r in sent] == [protocol.REASON_FABRIC_PENDING, "ActiveCheckError"]
    assert sent[0].condition["status"] == "Unknown" and sent[0].event is None
    assert sent[0].condition["message"] == (
        "CUDA reports the system not ready (cudaErrorSystemNotReady, 802): waiting for Fabric Manager to finish "
        "training the NVSwitch fabric before the first active check, at most 10 s")


def test_cuda_not_ready_until_the_fabric_wait_is_up_is_a_fault_naming_802_and_the_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_cuda(tmp_path, monkeypatch, "802")  # the real child, its CUDA never ready
    runner, recorder, clock = booting(tmp_path, monkeypatch, fabricWaitSeconds=30)
    runner.startup()
    assert recorder.sent == [("Unknown", protocol.REASON_FABRIC_PENDING), ("False", "ActiveCheckError")]
    assert clock.now == 30.0 and len(pids(log)) == 4, "tried at 0, 10, 20 and 30 s; the last one is judged"
    assert runner.state.message == (
        "active-check-error: CUDA reports the system not ready (cudaErrorSystemNotReady, 802): the NVSwitch fabric "
        "is not trained (Fabric Manager not running, failed, or still training) [cudaGetDeviceCount: CUDA error 802 "
        "(system not yet initialized); still so at the end of the 30 s fabric wait (fabric_wait_s)] -> RESTART_BM")
    # later in the boot (no fabric wait: an agent restarted after its first check), 802 is a fault at once
    (tmp_path / "later").mkdir()
    runner, recorder, clock = booting(tmp_path / "later", monkeypatch)
    runner.state.last_active = 0.0
    assert runner.fabric_deadline is None
    assert runner.full_check(active=True) == 1
    assert recorder.sent == [("False", "ActiveCheckError")] and clock.now == 0


@pytest.mark.parametrize(("plan", "evidence"), [
    ("999", "cudaGetDeviceCount: CUDA error 999 (unknown error)"),  # the real child on the fake CUDA
    (("cudaMalloc(134217728)", 2, False), "cudaMalloc(134217728): CUDA error 2 (out of memory)"),
    # 802 from a call that does not initialise CUDA is not the fabric's training: a failure like the rest
    (("cudaMemcpy A", 802, False), "cudaMemcpy A: CUDA error 802 (system not yet initialized)"),
])
def test_another_cuda_error_is_a_fault_at_once_without_a_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               plan: object, evidence: str) -> None:
    log = fake_cuda(tmp_path, monkeypatch, plan) if isinstance(plan, str) else fake_child(tmp_path, monkeypatch, plan)
    runner, recorder, clock = booting(tmp_path, monkeypatch)
    runner.startup()
    assert recorder.sent == [("False", "ActiveCheckError")] and clock.now == 0
    assert len(pids(log)) == 1
    assert runner.state.message == f"active-check-error: a CUDA call of the active check failed [{evidence}] -> drain"


def test_a_child_that_runs_out_of_time_is_killed_and_a_fault_naming_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert agent.thresholds()["agent"]["active_timeout_s"] == 600  # the default bound
    log = fake_cuda(tmp_path, monkeypatch, "hang")  # cudaGetDeviceCount never returns
    monkeypatch.setattr(active, "run", functools.partial(active.run, timeout_s=2))
    runner, recorder, _ = booting(tmp_path, monkeypatch)
    runner.startup()
    assert recorder.sent == [("False", "ActiveCheckError")]
    [child] = pids(log)
    message = runner.state.message or ""
    assert f"the active check did not finish within 2 s (active_timeout_s): its process (pid {child}) was killed" \
        in message
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_a_child_that_dies_without_an_answer_is_unusable_or_by_a_signal_a_fault(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(tmp_path, monkeypatch, "bug")
    with pytest.raises(active.Unusable) as error:
        active.run("NVIDIA A100-SXM4-40GB", timeout_s=60)
    assert type(error.value) is active.Unusable, "a bug in the check is not a GPU fault"
    assert "exited 1 without an answer: " in str(error.value) and str(error.value).endswith("KeyError: 'x'")
    (tmp_path / "kill").mkdir()
    fake_cuda(tmp_path / "kill", monkeypatch, "kill")
    with pytest.raises(active.CudaFailure, match=r"\(pid \d+\) was killed by SIGKILL before it answered"):
        active.run("NVIDIA A100-SXM4-40GB", timeout_s=60)
    assert active._answer(7, 0, json.dumps({"burn": {"gpus": []}, "pid": 7}), "") == {"gpus": []}
