"""Container runtime: overlay storage, root on the local SSD, patient parallel pulls."""

from __future__ import annotations

import json
import time

import pytest
import testinfra

from kilonode.image.manifest import Manifest
from kilonode.image.probes import is_local_disk, run_ok
from kilonode.plan.model import NodePoolPlan


def docker_info(host: testinfra.host.Host) -> dict[str, object]:
    return dict(json.loads(run_ok(host, "docker info --format '{{json .}}'")))


@pytest.mark.persistent
def test_runtime_storage_driver_is_overlay(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """Field notes: parallel pulls need overlay2 (Docker) / overlayfs (containerd)."""
    if pool.runtime == "docker":
        assert docker_info(host)["Driver"] == "overlay2"
    else:
        dump = run_ok(host, "containerd config dump")
        assert 'snapshotter = "overlayfs"' in dump


@pytest.mark.persistent
def test_runtime_root_is_the_plans_root(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    if pool.runtime == "docker":
        root = docker_info(host)["DockerRootDir"]
    else:
        root = run_ok(host, "containerd config dump | sed -n 's/^root = \"\\(.*\\)\"/\\1/p'").strip()
    assert root == pool.runtime_root, f"runtime root is {root}, the plan says {pool.runtime_root}"


@pytest.mark.persistent
def test_runtime_root_on_local_ssd_mount(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """The directory the runtime actually uses sits on the local disk, not the OS disk."""
    root = str(docker_info(host)["DockerRootDir"]) if pool.runtime == "docker" else pool.runtime_root
    target, source = run_ok(host, f"findmnt -n -o TARGET,SOURCE -T {root}").split()
    storage = pool.local_storage
    assert target == storage.mount_point, f"{root} is on {target} ({source}), not the local SSD"
    assert is_local_disk(host, storage, source), f"{root} is on {source}, not the plan's {storage.kind} local disk"
    # hand-written: whatever the plan says, the runtime root is never on the root filesystem
    assert run_ok(host, f"stat -c %d {root}") != run_ok(host, "stat -c %d /"), f"{root} is on the OS disk"


@pytest.mark.persistent
def test_max_concurrent_downloads_in_loaded_config(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """The value is in the config file the running daemon read (written before it started)."""
    if pool.runtime == "docker":
        pid = run_ok(host, "systemctl show docker.service -p MainPID --value").strip()
        argv = run_ok(host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()
        path = "/etc/docker/daemon.json"
        for i, arg in enumerate(argv):
            if arg.startswith("--config-file"):
                path = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
        config = json.loads(run_ok(host, f"cat {path}"))
        assert config.get("max-concurrent-downloads") == pool.max_concurrent_downloads, (
            f"{path}: max-concurrent-downloads = {config.get('max-concurrent-downloads')}"
        )
        started = int(run_ok(host, f"date -d \"$(ps -o lstart= -p {pid})\" +%s"))
        modified = int(run_ok(host, f"stat -c %Y {path}"))
        assert modified <= started, f"{path} changed after dockerd started: not the config it runs with"
    else:
        dump = run_ok(host, "containerd config dump")
        assert f"max_concurrent_downloads = {pool.max_concurrent_downloads}" in dump


def test_preloaded_pause_image_runs_and_stops_on_sigterm(host: testinfra.host.Host, pool: NodePoolPlan) -> None:
    """The pause image the recipe built starts, and exits 0 at once on SIGTERM (no SIGKILL wait)."""
    name = "kilonode-verify-pause"
    if pool.runtime == "containerd":
        # `ctr run` (not detached) exits with the task's exit status
        ctr = "ctr -n k8s.io"
        script = (
            f"{ctr} run --rm {pool.pause_image} {name} >/dev/null 2>&1 & pid=$!; "
            f"for i in $(seq 120); do {ctr} task ls | grep -q {name}.*RUNNING && break; sleep 0.5; done; "
            f"start=$(date +%s); {ctr} task kill -s SIGTERM {name}; "
            # bounded: a pause that ignores SIGTERM is killed after 20 s (and exits 137)
            # (the task list, not kill -0: an exited `ctr run` stays a zombie until `wait`)
            f"for i in $(seq 40); do {ctr} task ls | grep -q {name}.*RUNNING || break; sleep 0.5; done; "
            f"{ctr} task ls | grep -q {name}.*RUNNING && {ctr} task kill -s SIGKILL {name}; wait $pid; rc=$?; "
            "echo $rc $(( $(date +%s) - start ))"
        )
        code, took = run_ok(host, script).split()
        assert code == "0", f"pause exited {code} (137 = killed: it ignored SIGTERM)"
        assert int(took) < 20, f"stopping took {took} s"
        return
    host.run(f"docker rm -f {name}")
    run_ok(host, f"docker run -d --name {name} --network none {pool.pause_image}")
    try:
        start = time.monotonic()
        run_ok(host, f"docker stop -t 30 {name}")
        took = time.monotonic() - start
        code = run_ok(host, f"docker inspect -f '{{{{.State.ExitCode}}}}' {name}").strip()
        assert code == "0", f"pause exited {code} (137 = killed: it ignored SIGTERM)"
        assert took < 20, f"docker stop took {took:.0f} s"
    finally:
        host.run(f"docker rm -f {name}")


@pytest.mark.persistent
def test_containerd_runs_the_binary_the_image_placed(
    host: testinfra.host.Host, pool: NodePoolPlan, manifest: Manifest
) -> None:
    """Where the build placed containerd >= 1.7 (node-image/binaries.toml), the unit runs it,
    not Debian's 1.6, which ignores the rendered image_pull_progress_timeout; where it could
    not, the manifest says the node runs 1.6, and it does."""
    if pool.runtime != "containerd":
        pytest.skip("a docker pool: containerd is Docker's, configured by the docker.io package")
    placed = next(b for b in manifest.data["other_binaries"] if b["name"] == "containerd")
    expected = "/usr/local/bin/containerd" if placed["present"] else "/usr/bin/containerd"
    assert bool(placed.get("activated")) == placed["present"], placed
    pid = run_ok(host, "systemctl show containerd.service -p MainPID --value").strip()
    assert pid not in ("", "0"), "containerd.service is not running"
    running = run_ok(host, f"readlink /proc/{pid}/exe").strip()
    assert running == expected, f"containerd.service runs {running}; the manifest says {expected} ({placed['origin']})"
