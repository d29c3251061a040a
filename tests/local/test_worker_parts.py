"""The worker VM's parts that need no VM: the image cache key, the PID file's trust, the stop
path's fallback to signals, the facts script's framing, and what `up` lists as not started.
(tests/local/test_local_worker.py boots the VM.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kilonode.config import load_stack
from kilonode.config.load import project_root
from kilonode.image.build import ImageInputs
from kilonode.image.qemu import free_port
from kilonode.local import rehearsal, worker
from kilonode.node import ship
from kilonode.plan import ClusterPlan
from kilonode.render import render_cluster
from kilonode.render.files import RenderedFile
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def inputs(plan: ClusterPlan) -> ImageInputs:
    stack = load_stack("local")
    pool = plan.node_pools[0]
    return ImageInputs(stack=stack, plan=plan, pool=pool, files=render_cluster(plan)[f"pool-{pool.name}"],
                       project_dir=project_root(stack.file.parent) or stack.file.parent)


def test_the_image_key_follows_what_the_image_is_made_of(plans: dict[str, ClusterPlan],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    base = inputs(plans["local"])
    assert worker.image_key(base) == worker.image_key(inputs(plans["local"]))  # stable
    path = "etc/sysctl.d/90-kilonode.conf"
    edited = dict(base.files)
    edited[path] = RenderedFile(base.files[path].content + "# edited\n", base.files[path].mode)
    assert worker.image_key(replace(base, files=edited)) != worker.image_key(base)
    assert base.pool is not None
    other_pool = base.pool.model_copy(update={"max_concurrent_downloads": base.pool.max_concurrent_downloads + 1})
    assert worker.image_key(replace(base, pool=other_pool)) != worker.image_key(base)
    # a node program the image carries, not the render (kilonode.node.ship): other bytes, another key
    key = worker.image_key(base)
    edited_program = replace(ship.POD_TRAFFIC, source="cert_expiry.py")
    monkeypatch.setattr(ship, "PROGRAMS", tuple(edited_program if p is ship.POD_TRAFFIC else p for p in ship.PROGRAMS))
    assert edited_program in base.node_programs and worker.image_key(base) != key


def record(tmp_path: Path, plan: ClusterPlan, argv: tuple[str, ...], port: int = 0) -> worker.WorkerRecord:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return worker.WorkerRecord(
        pool=plan.node_pools[0], image_name="local-cpu", image_key="0" * 64, image=tmp_path / "local-cpu.raw",
        preloaded=(), directory=tmp_path, user="debian", key_file=tmp_path / "id_ecdsa", port=port, argv=argv,
    )


def test_the_pid_file_is_trusted_only_for_the_recorded_command_line(tmp_path: Path,
                                                                    plans: dict[str, ClusterPlan]) -> None:
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    process = subprocess.Popen(argv)
    try:
        running = record(tmp_path, plans["local"], argv)
        assert worker.probe(running).state == "stopped"  # no PID file yet
        running.pid_file.write_text(f"{process.pid}\n")
        assert worker.probe(running).state == "running"
        # the same PID with another command line: not ours to signal
        other = replace(running, argv=("qemu-system-x86_64", "-machine", "q35"))
        state = worker.probe(other)
        assert state.state == "foreign" and f"PID {process.pid}" in state.detail
        assert worker.stop(other, lambda _: None).startswith("left alone")
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()
    assert worker.probe(running).state == "dead"
    assert worker.stop(running, lambda _: None) == "was not running" and not running.pid_file.exists()


def test_stop_falls_back_to_sigterm_by_pid_when_the_guest_cannot_be_reached(
    tmp_path: Path, plans: dict[str, ClusterPlan]
) -> None:
    """No SSH on the recorded port (nothing listens there): the bounded wait ends, SIGTERM stops it."""
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    process = subprocess.Popen(argv)
    try:
        stuck = record(tmp_path, plans["local"], argv, port=free_port())
        stuck.pid_file.write_text(f"{process.pid}\n")
        outcome = worker.stop(stuck, lambda _: None, poweroff_timeout_s=0.2)
        assert outcome.startswith(f"stopped by SIGTERM (PID {process.pid})"), outcome
        assert process.wait(timeout=5) == -15 and not stuck.pid_file.exists()
    finally:
        process.kill()
        process.wait()


def test_the_facts_script_frames_each_command_with_its_exit_status() -> None:
    script = worker._batch([("one", "echo a; false"), ("two", "x=5 && echo $x"), ("three", "echo $x; echo b >&2")])
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    # a failed command is reported and does not stop the next; a variable set by one reaches the next
    assert worker._sections(output) == {"one": (1, "a"), "two": (0, "5"), "three": (0, "5\nb")}
    assert worker._sections("no markers at all") == {}


@pytest.mark.parametrize("booted", [True, False])
def test_not_started_says_what_the_worker_cannot_run_and_when_it_was_skipped(
    plans: dict[str, ClusterPlan], booted: bool
) -> None:
    plan = plans["local"]
    rows = rehearsal.not_started(plan, shared.rendered("local"), "cpu" if booted else None)
    pool_row = next(r for r in rows if r.where.startswith("pool cpu") and r.what != "worker VM")
    skipped = [r for r in rows if r.what == "worker VM"]
    if booted:
        assert pool_row.what == "kubelet.service, cri-docker.service" and "cannot join" in pool_row.why
        assert skipped == []
    else:
        assert len(skipped) == 1 and "--no-worker" in skipped[0].why


def test_the_key_hashes_the_build_code_not_the_checking_code() -> None:
    """An edit to verify or the VM harness must not rebuild the image; an edit to the build must."""
    names = {p.name for p in worker.build_modules()}
    assert {"build.py", "rootfs.py", "disk.py", "containers.py", "binaries.py"} <= names
    assert not names & {"verify.py", "qemu.py", "probes.py", "seed.py"}
