"""The rehearsal's worker VM: the stack's first node pool image, booted detached under qemu.

    image   the pool's image from the cache, $XDG_CACHE_HOME/kilonode/images/<stack>-<pool>/<key>/
            (~/.cache/... by default), built by kilonode.image.build when the cache has none. The
            key is a sha256 over what the image is made from: the node-image recipe, the code that
            builds it (build_modules, the node programs it carries), the pool's plan and rendered
            files, preload archives and the host's apt sources (the base root filesystem's mirror). A new key
            replaces the older entries of the same image: one image per stack and pool is kept.
    boot    as `kilonode image verify` boots a pool image (kilonode.image.verify): a throwaway
            qcow2 overlay over the cached image, UEFI, TCG, a blank local-SSD disk (/dev/vdb), the
            pool's rendered cloud-init user-data as the NoCloud seed, SSH forwarded on 127.0.0.1
            only; but detached (qemu.VmConfig.pid_file): qemu outlives `kilonode local up`.
    ready   SSH answers, cloud-init has finished and systemd has settled, within a bound.
    facts   read over SSH against the pool's plan: the sysctls the plan sets, live; the runtime's
            root (`docker info` / `containerd config dump`) and the mount it sits on (the local
            SSD); the preloaded images in the store of the runtime the node uses.
    stop    guest poweroff over SSH and a bounded wait, then SIGTERM, then SIGKILL, by PID.

The PID file is trusted only while /proc/<pid>/cmdline is exactly the qemu command line
recorded when the VM was powered on (as for the etcd members, kilonode.local.etcd).

A guest that reboots by itself ends its qemu (`-no-reboot`, see kilonode.image.qemu): the
worker then shows as not running, and the next `up` powers it on again on its disks.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paramiko

from kilonode.catalog import binaries as pins
from kilonode.digest import sha256_bytes, sha256_file, sha256_text
from kilonode.image import cache, mirror
from kilonode.image.build import ImageInputs, build_image, image_name
from kilonode.image.disk import DiskError
from kilonode.image.manifest import Manifest
from kilonode.image.qemu import Vm, VmConfig, VmError
from kilonode.image.recipe import load_recipe
from kilonode.image.rootfs import BuildError
from kilonode.image.seed import make_keypair, make_seed, meta_data
from kilonode.image.verify import DEFAULT_USER
from kilonode.local.etcd import ProcessState, alive, cmdline
from kilonode.paths import PACKAGE_DIR
from kilonode.plan.model import NodePoolPlan

Progress = Callable[[str], None]

WORKER_DIR = "worker"
IMAGES = "images"  # the cache's kind: cache_root()/images/<image name>/<key>/
# SSH, then cloud-init and systemd, each within this (first boot under TCG with cloud-init,
# measured here: SSH after 64-77 s, settled after 107-117 s on a quiet 2-core machine; 129-188 s
# and 227-269 s with another guest or an etcd benchmark beside it)
READY_TIMEOUT_S = 600.0
POWEROFF_TIMEOUT_S = 90.0  # the guest powered off in 4 s here; room for a busy machine
TERM_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0
SSH_TIMEOUT_S = 30.0


class WorkerError(RuntimeError):
    """The worker VM cannot be built, booted or reached; the message says what to do."""


@dataclass(frozen=True)
class WorkerRecord:
    """What `up` booted, so that status and down need nothing else (no stack, no cache)."""

    pool: NodePoolPlan  # what the facts are checked against
    image_name: str
    image_key: str
    image: Path  # the cached raw image the overlay sits on
    preloaded: tuple[tuple[str, str], ...]  # (image, image ID) as the build baked them
    directory: Path
    user: str
    key_file: Path
    port: int  # SSH, forwarded on 127.0.0.1
    argv: tuple[str, ...]  # qemu's command line at its power-on

    @property
    def pid_file(self) -> Path:
        return self.directory / "qemu.pid"

    @property
    def console(self) -> Path:
        return self.directory / "console.log"

    @property
    def overlay(self) -> Path:
        return self.directory / "os-overlay.qcow2"  # kilonode.image.qemu.Vm's name for it

    def ssh_command(self) -> str:
        # throwaway guest on loopback with a new host key every first boot: nothing to pin
        return (f"ssh -i {shlex.quote(str(self.key_file))} -p {self.port} -o StrictHostKeyChecking=no "
                f"-o UserKnownHostsFile=/dev/null {self.user}@127.0.0.1")

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool.model_dump(mode="json"), "image_name": self.image_name, "image_key": self.image_key,
            "image": str(self.image), "preloaded": [list(p) for p in self.preloaded],
            "directory": str(self.directory), "user": self.user, "key_file": str(self.key_file), "port": self.port,
            "argv": list(self.argv),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerRecord:
        return cls(
            NodePoolPlan.model_validate(data["pool"]), data["image_name"], data["image_key"], Path(data["image"]),
            tuple((str(i), str(d)) for i, d in data["preloaded"]), Path(data["directory"]), data["user"],
            Path(data["key_file"]), int(data["port"]), tuple(data["argv"]),
        )


def probe(worker: WorkerRecord) -> ProcessState:
    """What the PID file says, checked against /proc."""
    try:
        text = worker.pid_file.read_text().strip()
    except FileNotFoundError:
        return ProcessState("stopped", None, "not running")
    if not text.isdigit():
        return ProcessState("dead", None, f"stale PID file {worker.pid_file} (it holds {text[:20]!r})")
    pid = int(text)
    if not alive(pid):
        return ProcessState("dead", pid, f"PID {pid} is not running (stale PID file {worker.pid_file})")
    running = cmdline(pid)
    if running == list(worker.argv):
        return ProcessState("running", pid, "running")
    shown = " ".join(running or ["?"])[:120]
    return ProcessState("foreign", pid, f"PID {pid} in {worker.pid_file} is now `{shown}`, not this worker's qemu")


def release_units(pool: NodePoolPlan) -> list[str]:
    """The pool's units that run a release binary (node-image/binaries.toml `unit`): kubelet,
    cri-dockerd. None is in a package registry this machine reaches, so the image carries the
    units but not the binaries (built --allow-incomplete), and each is skipped
    (ConditionPathExists=) on the node."""
    catalog = pins.load(load_recipe().binaries_file)
    roles = list(pool.binary_roles)
    return list(dict.fromkeys(c.unit for role in roles for c in catalog.role(role) if c.unit))


# --- the image ----------------------------------------------------------------------------------

def _tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _parse(path: Path) -> ast.Module:
    """ast.parse with the garbage collector paused. Twice in CI (CPython 3.11.7, pytest with
    hypothesis, whose gc callback runs Python code whenever a collection happens), ast.parse of an
    ordinary module raised "SystemError: AST constructor recursion depth mismatch": building the
    AST's Python objects counts its depth against the thread's, and a collection in the middle
    runs callbacks. Pausing collection for one parse of a small module costs nothing. A mitigation
    of a suspected cause, not a proven fix."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        if paused:
            gc.enable()


def build_modules() -> list[Path]:
    """The kilonode.image modules an image build runs: build.py and what it imports from the
    package, transitively (not verify, qemu, the probes: they check an image, never make one)."""
    package = PACKAGE_DIR / "image"
    found: dict[str, Path] = {}
    todo = ["build"]
    while todo:
        name = todo.pop()
        path = package / f"{name}.py"
        if name in found or not path.is_file():
            continue
        found[name] = path
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1 or module == "kilonode.image":  # from . import x / from kilonode.image import x
                    todo += [module.split(".")[0]] if node.level == 1 and module else [a.name for a in node.names]
                elif module.startswith("kilonode.image."):
                    todo.append(module.split(".")[2])
            elif isinstance(node, ast.Import):
                todo += [a.name.split(".")[2] for a in node.names if a.name.startswith("kilonode.image.")]
    return sorted(found.values())


def image_key(inputs: ImageInputs) -> str:
    """sha256 over what the pool's image is made from (module docstring). Cheap: no build.

    The build's code is hashed whole (build_modules, and the node programs the image carries):
    an edit to it costs a rebuild (under a minute with the base cached), where a key that
    missed it would boot a stale image."""
    pool = inputs.pool
    if pool is None:
        raise ValueError("a worker boots a pool's image")
    recipe = load_recipe()
    archives = {}
    for item in pool.preload_images:
        if item.source == "archive" and item.archive:
            path = Path(item.archive)
            path = path if path.is_absolute() else inputs.project_dir / path
            archives[item.image] = sha256_file(path) if path.is_file() else f"missing: {path}"
    try:
        sources: str | None = sha256_file(mirror.sources_file())
    except FileNotFoundError:
        sources = None  # the build says what to do about it, if it has to run
    return cache.key_of({
        "name": image_name(inputs.stack, inputs.target),
        "recipe": _tree_hashes(recipe.root),
        "code": {
            "image": {p.name: sha256_file(p) for p in build_modules()},
            # the node programs it carries (kilonode.node.ship), as written into the image
            "node": {path: [mode, sha256_bytes(data)]
                     for program in inputs.node_programs for path, data, mode in program.files()},
        },
        "pool": pool.model_dump(mode="json"),
        "kubernetes_version": pool.kubernetes_version or inputs.plan.kubernetes_version,
        "files": {path: [f.mode, sha256_text(f.content)] for path, f in inputs.files.items()},
        "archives": archives,
        "apt_sources": sources,
    })


def image_entry(name: str, key: str) -> Path:
    return cache.cache_root() / IMAGES / name / key


def cached_image(inputs: ImageInputs, key: str, progress: Progress) -> tuple[Path, bool]:
    """The pool image's raw file in the cache, built first if the cache has none; (raw, built)."""
    name = image_name(inputs.stack, inputs.target)
    entry = image_entry(name, key)
    raw = entry / f"{name}.raw"
    if raw.is_file() and (entry / f"{name}.manifest.json").is_file():
        progress(f"pool image {name}: in the cache ({key[:12]}, {entry})")
        return raw, False
    progress(f"pool image {name}: not in the cache ({key[:12]}), building it (kilonode image build) ...")
    entry.parent.mkdir(parents=True, exist_ok=True)
    # built aside and renamed into place: an interrupted build never looks like an entry
    building = entry.parent / f".build-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    started = time.monotonic()
    try:
        # the rehearsal builds offline, without the pinned binaries (no --fetch here): the VMs
        # it boots check what runs without them, and the build says what is missing
        result = build_image(inputs, building, progress=lambda line: progress(f"  image: {line}"),
                             allow_incomplete=True)
        # the fixed VHD is Azure's copy of the same disk; the worker boots the raw
        result.vhd.unlink(missing_ok=True)
        try:
            building.rename(entry)
        except OSError:  # another `up` finished the same build first: keep its entry
            shutil.rmtree(building, ignore_errors=True)
    except (BuildError, DiskError) as error:
        shutil.rmtree(building, ignore_errors=True)
        raise WorkerError(f"the pool image {name} could not be built: {error}") from None
    except BaseException:  # interrupted: leave no half-built directory behind
        shutil.rmtree(building, ignore_errors=True)
        raise
    progress(f"pool image {name}: built in {time.monotonic() - started:.0f} s ({entry})")
    _prune(entry)
    return raw, True


def _prune(keep: Path) -> None:
    """Older keys of the same image, and builds whose process is gone. A VM still running on
    a removed image keeps reading it through qemu's open file; a kept, stopped worker on an
    older key is booted afresh from the new image by the next `up` anyway."""
    for sibling in keep.parent.iterdir():
        if sibling == keep:
            continue
        if sibling.name.startswith(".build-"):
            pid = sibling.name.removeprefix(".build-")
            if pid.isdigit() and alive(int(pid)):
                continue
        shutil.rmtree(sibling, ignore_errors=True)


# --- boot and reach -------------------------------------------------------------------------------

def _vm(worker: WorkerRecord) -> Vm:
    """A handle on the worker's VM for SSH and power-on; its qemu may belong to another process."""
    vm = Vm(_config(worker.image, worker.directory, worker.key_file, worker.pool))
    vm.port = worker.port
    return vm


def _config(image: Path, directory: Path, key_file: Path, pool: NodePoolPlan) -> VmConfig:
    storage = pool.local_storage
    # as verify: a pool whose plan chose local NVMe disks gets that many blank ones
    nvme = storage.nvme_count if storage.kind != "device" else 0
    return VmConfig(image=image, seed=directory / "seed.img", workdir=directory, user=DEFAULT_USER,
                    key_file=key_file, nvme_disks=nvme, pid_file=directory / "qemu.pid")


def _argv(vm: Vm) -> tuple[str, ...]:
    """qemu's command line as it runs (what /proc/<pid>/cmdline must show)."""
    assert vm.proc is not None
    return tuple(str(a) for a in vm.proc.args)  # type: ignore[union-attr]


def boot_fresh(pool: NodePoolPlan, raw: Path, key: str, directory: Path, progress: Progress,
               save: Callable[[WorkerRecord], None], timeout_s: float = READY_TIMEOUT_S) -> WorkerRecord:
    """Power on a new worker: fresh overlay, blank local SSD, new NVRAM, the pool's user-data."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    manifest = Manifest.for_image(raw)
    key_file, public_key = make_keypair(directory)
    try:
        make_seed(directory / "seed.img", manifest.user_data_path.read_text(),
                  meta_data(public_key, f"{manifest.data['name']}-worker"))
    except (OSError, subprocess.CalledProcessError) as error:
        raise WorkerError(f"the NoCloud seed could not be made (mkfs.vfat, mcopy: `make setup`): {error}") from None
    vm = Vm(_config(raw, directory, key_file, pool), progress=progress)
    progress("worker VM: powering on a throwaway overlay of the pool image (qemu, TCG, UEFI; blank local SSD "
             "as /dev/vdb; the pool's cloud-init user-data as its NoCloud seed) ...")
    try:
        vm.start()
    except (VmError, OSError, subprocess.CalledProcessError) as error:
        vm.stop()
        raise WorkerError(f"qemu did not start: {error}") from None
    worker = WorkerRecord(
        pool=pool, image_name=str(manifest.data["name"]), image_key=key, image=raw,
        preloaded=tuple((str(i["image"]), str(i["image_id"])) for i in manifest.preloaded_images),
        directory=directory, user=DEFAULT_USER, key_file=key_file, port=vm.port, argv=_argv(vm),
    )
    save(worker)  # before the wait: an interrupted `up` leaves a VM that `down` can find
    return _wait_booted(vm, worker, progress, save, timeout_s)


def power_on_kept(worker: WorkerRecord, progress: Progress, save: Callable[[WorkerRecord], None],
                  timeout_s: float = READY_TIMEOUT_S) -> WorkerRecord:
    """Power the worker on again on its kept disks (after `down --keep`, or a guest reboot)."""
    vm = _vm(worker)
    vm.progress = progress
    progress(f"worker VM: powering on again on its kept disks ({worker.directory}) ...")
    try:
        vm.power_on("power-on")
    except OSError as error:
        raise WorkerError(f"qemu did not start: {error}") from None
    worker = replace(worker, port=vm.port, argv=_argv(vm))  # the port moves if it was taken meanwhile
    save(worker)
    return _wait_booted(vm, worker, progress, save, timeout_s)


def _wait_booted(vm: Vm, worker: WorkerRecord, progress: Progress, save: Callable[[WorkerRecord], None],
                 timeout_s: float) -> WorkerRecord:
    """Wait for SSH, cloud-init and systemd; the record as qemu now runs (a firmware that never
    printed is powered on once more, by a new qemu: new PID, perhaps a new port)."""
    started = time.monotonic()
    try:
        vm.wait_ssh(timeout=timeout_s)
        ssh_s = time.monotonic() - started
        progress(f"worker VM: SSH answers on 127.0.0.1:{vm.port} after {ssh_s:.0f} s; waiting for cloud-init "
                 "and systemd to settle ...")
        state = vm.wait_settled(timeout=max(30.0, timeout_s - ssh_s))
    except (VmError, OSError, paramiko.SSHException, EOFError) as error:
        vm.stop()  # a VM that never came up is of no use running: stop it, keep its logs
        worker.pid_file.unlink(missing_ok=True)
        raise WorkerError(f"the worker VM did not come up: {str(error).strip()[:3000]}\n(console log "
                          f"{worker.console}, qemu log {worker.directory / 'qemu.log'})") from None
    progress(f"worker VM: systemd '{state}' {time.monotonic() - started:.0f} s after the power-on")
    if _argv(vm) != worker.argv:
        worker = replace(worker, port=vm.port, argv=_argv(vm))
        save(worker)
    return worker


def wait_ready(worker: WorkerRecord, progress: Progress, timeout_s: float = READY_TIMEOUT_S) -> None:
    """A worker another process powered on (an earlier `up`): SSH, then cloud-init and systemd,
    over one connection (Vm.wait_settled's commands, in one exec)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = probe(worker)
        if state.state != "running":
            raise WorkerError(f"the worker VM stopped while waiting for it: {state.detail}; console log "
                              f"{worker.console}")
        try:
            session = _Session(worker)
            break
        except (OSError, paramiko.SSHException, EOFError):
            pass
        if time.monotonic() > deadline:
            raise WorkerError(f"the worker VM (PID {state.pid}) runs but SSH on 127.0.0.1:{worker.port} did not "
                              f"answer within {timeout_s:.0f} s; console log {worker.console}")
        time.sleep(2)
    left = int(max(30.0, deadline - time.monotonic()))
    # settled already (the usual case: an earlier `up` waited): systemd's state says so at once,
    # and cloud-final.service is one of its boot jobs; else wait as Vm.wait_settled does
    script = (f"state=$(systemctl is-system-running); case $state in running|degraded) echo $state;; "
              f"*) timeout {left} cloud-init status --wait >/dev/null 2>&1; "
              f"timeout {left} systemctl is-system-running --wait;; esac")
    try:
        _rc, settled, _err = session.run(f"sudo sh -c {shlex.quote(script)}", timeout=2 * left + 30)
    except (OSError, paramiko.SSHException, EOFError) as error:
        raise WorkerError(f"SSH to the worker VM failed while waiting for it to settle: {error}") from None
    finally:
        session.close()
    if settled.strip() != "running":
        progress(f"worker VM: systemd is '{settled.strip()}'")


# --- facts -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SysctlFact:
    name: str
    plan: str
    live: str | None  # None: the kernel has no such key

    @property
    def ok(self) -> bool:
        # the kernel prints some values tab-separated (ranges): compare words
        return self.live is not None and self.live.split() == self.plan.split()


@dataclass
class WorkerSummary:
    record: WorkerRecord
    state: ProcessState
    systemd: str | None = None
    failed_units: list[str] = field(default_factory=list)
    sysctls: list[SysctlFact] = field(default_factory=list)
    runtime_root: str | None = None
    storage_driver: str | None = None
    root_mount: str | None = None  # the mount point the runtime root sits on
    root_source: str | None = None  # its device, resolved
    root_on_local_ssd: bool = False
    store: list[str] = field(default_factory=list)  # images in the runtime's store
    # the units of release binaries (release_units): unit -> "ActiveState, condition result"
    release_units: dict[str, str] = field(default_factory=dict)
    preloaded: list[dict[str, Any]] = field(default_factory=list)  # per baked image: in the store, same ID
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.state.state == "running" and not self.errors and self.systemd == "running"
                and bool(self.sysctls) and all(s.ok for s in self.sysctls) and self.root_on_local_ssd
                and all(p["in_store"] and p["id_matches"] is not False for p in self.preloaded))

    @property
    def problems(self) -> list[str]:
        found = list(self.errors)
        if self.state.state != "running":
            found.append(f"qemu: {self.state.detail}")
            return found
        if self.systemd != "running":
            found.append(f"systemd is {self.systemd!r}" + (f": failed {', '.join(self.failed_units)}"
                                                           if self.failed_units else ""))
        found += [f"{s.name} is {s.live}, the plan says {s.plan}" for s in self.sysctls if not s.ok]
        if self.runtime_root is not None and not self.root_on_local_ssd:
            storage = self.record.pool.local_storage
            found.append(f"the runtime root {self.runtime_root} is on {self.root_mount} ({self.root_source}), not "
                         f"the local SSD ({storage.mount_point} on {storage.device or storage.kind})")
        for p in self.preloaded:
            if not p["in_store"]:
                found.append(f"{p['image']} is not in the {self.record.pool.runtime} store")
            elif p["id_matches"] is False:
                found.append(f"{p['image']} in the store is {p['store_id']}, not the baked {p['image_id']}")
        return found

    def to_json(self) -> dict[str, Any]:
        worker = self.record
        storage = worker.pool.local_storage
        return {
            "pool": worker.pool.name,
            "image": {"name": worker.image_name, "key": worker.image_key, "raw": str(worker.image)},
            "pid": self.state.pid,
            "state": self.state.state,
            "ssh": {"address": "127.0.0.1", "port": worker.port, "user": worker.user, "key": str(worker.key_file),
                    "command": worker.ssh_command()},
            "directory": str(worker.directory),
            "console_log": str(worker.console),
            "systemd": self.systemd,
            "failed_units": self.failed_units,
            "sysctls": [{"name": s.name, "plan": s.plan, "live": s.live, "ok": s.ok} for s in self.sysctls],
            "runtime": {
                "name": worker.pool.runtime,
                "root": self.runtime_root,
                "plan_root": worker.pool.runtime_root,
                "storage_driver": self.storage_driver,
                "mount": self.root_mount,
                "source": self.root_source,
                "local_ssd": {"mount_point": storage.mount_point, "device": storage.device, "kind": storage.kind},
                "on_local_ssd": self.root_on_local_ssd,
            },
            "images": {"store": self.store, "preloaded": self.preloaded},
            "release_units": self.release_units,
            "ok": self.ok,
            "problems": self.problems,
        }


class _Session:
    """One SSH connection for a handful of commands (each new connection costs a TCG guest ~1 s)."""

    def __init__(self, worker: WorkerRecord) -> None:
        self.client = _vm(worker).connect(timeout=SSH_TIMEOUT_S)

    def run(self, command: str, timeout: float = 60.0) -> tuple[int, str, str]:
        _stdin, stdout, stderr = self.client.exec_command(command, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err

    def close(self) -> None:
        self.client.close()


def summarise(worker: WorkerRecord) -> WorkerSummary:
    """The live facts over SSH, against the pool's plan; a worker not running says only that."""
    summary = WorkerSummary(worker, probe(worker))
    if summary.state.state != "running":
        return summary
    try:
        session = _Session(worker)
    except (OSError, paramiko.SSHException, EOFError) as error:
        summary.errors.append(f"no SSH on 127.0.0.1:{worker.port}: {error}")
        return summary
    try:
        _facts(session, worker, summary)
    except (OSError, paramiko.SSHException, EOFError) as error:
        summary.errors.append(f"SSH to 127.0.0.1:{worker.port} failed while reading the facts: {error}")
    finally:
        session.close()
    return summary


MARK = "@@kilonode-section"


def _batch(sections: list[tuple[str, str]]) -> str:
    """One shell script running each (name, command) in turn, each one's output (stderr too)
    between marker lines that carry its name and exit status: one SSH exec and one sudo for all
    (on a TCG guest each exec, sudo and docker CLI start costs a second or more)."""
    return "\n".join(f"echo '{MARK} {name}'; {{ {command}\n}} 2>&1; echo \"{MARK}-rc $?\""
                     for name, command in sections)


def _sections(output: str) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    name, lines = None, []
    for line in output.splitlines():
        if line.startswith(f"{MARK}-rc ") and name is not None:
            found[name] = (int(line.split()[-1]), "\n".join(lines))
            name, lines = None, []
        elif line.startswith(f"{MARK} "):
            name, lines = line.split(" ", 1)[1], []
        elif name is not None:
            lines.append(line)
    return found


# the facts script's sections, in the order it runs them
_FACT_SECTIONS = ("systemd", "failed", "sysctl", "runtime", "mount", "units", "images")
# what a section the script never reached reads as (exit status, output)
_NOT_RUN = (1, "")


def _facts(session: _Session, worker: WorkerRecord, summary: WorkerSummary) -> None:
    """Read the worker's live facts in one SSH command into `summary`."""
    pool = worker.pool
    # sudo: sysctl is in /usr/sbin (outside a plain user's PATH), the runtimes' sockets are root's
    _rc, out, err = session.run(f"sudo sh -c {shlex.quote(_facts_script(pool))}", timeout=120)
    found = _sections(out)
    missing = [n for n in _FACT_SECTIONS if n not in found]
    if missing:
        summary.errors.append(f"the facts script did not run through ({', '.join(missing)} missing): "
                              f"{(err or out).strip()[-300:]}")

    summary.systemd = found.get("systemd", _NOT_RUN)[1].strip() or None
    summary.failed_units = [line.split()[0] for line in found.get("failed", (0, ""))[1].splitlines() if line.strip()]
    summary.sysctls = _read_sysctls(pool, found.get("sysctl", _NOT_RUN)[1])
    _read_runtime(summary, pool, *found.get("runtime", _NOT_RUN))
    _read_mount(summary, pool, *found.get("mount", _NOT_RUN))
    summary.release_units.update(_read_units(found.get("units", _NOT_RUN)[1]))
    _read_images(summary, worker, *found.get("images", _NOT_RUN))


def _local_device(pool: NodePoolPlan) -> str | None:
    """The local disk the runtime's root should be on, where the pool names one."""
    storage = pool.local_storage
    return storage.device if storage.kind == "device" and storage.device else None


def _facts_script(pool: NodePoolPlan) -> str:
    names = " ".join(shlex.quote(s.name) for s in pool.sysctls)
    if pool.runtime == "docker":
        runtime = "info=$(docker info --format '{{.DockerRootDir}} {{.Driver}}') && echo \"$info\" && root=${info%% *}"
        images = "docker image ls --no-trunc --format '{{.Repository}}:{{.Tag}} {{.ID}}'"
    else:
        # the top-level `root = "..."` of the configuration containerd runs with
        runtime = ("dump=$(containerd config dump) && echo \"$dump\" && "
                   "root=$(echo \"$dump\" | sed -n 's/^root = \"\\(.*\\)\"$/\\1/p')")
        images = "ctr -n k8s.io images ls -q"
    units = " ".join(shlex.quote(u) for u in release_units(pool))
    disk = _local_device(pool)
    device = f" && readlink -f {shlex.quote(disk)}" if disk else ""
    return _batch([
        ("systemd", "systemctl is-system-running"),
        ("failed", "systemctl --failed --plain --no-legend --no-pager"),
        # -e: a key the kernel lacks is skipped instead of failing the rest
        ("sysctl", f"sysctl -e {names}"),
        ("runtime", runtime),
        ("mount", 'test -n "$root" && findmnt -n -o TARGET,SOURCE -T "$root" && '
                  'readlink -f "$(findmnt -n -o SOURCE -T "$root")" && stat -c %d "$root" /' + device),
        # `systemctl show` prints properties in its own order: a line of ours starts each unit
        ("units", f"for u in {units}; do echo \"Unit=$u\"; systemctl show -p ActiveState -p ConditionResult \"$u\"; "
         "done" if units else "true"),
        ("images", images),
    ])


def _read_sysctls(pool: NodePoolPlan, text: str) -> list[SysctlFact]:
    live: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep:
            live[key.strip()] = value.strip()
    return [SysctlFact(s.name, str(s.value), live.get(s.name)) for s in pool.sysctls]


def _read_runtime(summary: WorkerSummary, pool: NodePoolPlan, rc: int, text: str) -> None:
    """The container runtime's root directory and storage driver (or snapshotter)."""
    if rc != 0:
        summary.errors.append(f"the {pool.runtime} configuration could not be read: {text.strip()[:300]}")
    elif pool.runtime == "docker" and len(text.split()) == 2:
        summary.runtime_root, summary.storage_driver = text.split()
    elif pool.runtime == "containerd":
        lines = text.splitlines()
        summary.runtime_root = next((line.split("=", 1)[1].strip().strip('"') for line in lines
                                     if line.startswith("root = ")), None)
        summary.storage_driver = next((line.split("=", 1)[1].strip().strip('"') for line in lines
                                       if line.strip().startswith("snapshotter = ")), None)


def _read_mount(summary: WorkerSummary, pool: NodePoolPlan, rc: int, text: str) -> None:
    """Where the runtime's root is mounted, and whether that is the pool's local disk."""
    storage = pool.local_storage
    device = _local_device(pool)
    words = text.split()
    if summary.runtime_root and rc == 0 and len(words) == (6 if device else 5):
        summary.root_mount, summary.root_source, root_dev, os_dev = words[0], words[2], words[3], words[4]
        on_disk = summary.root_mount == storage.mount_point and root_dev != os_dev
        if device:
            disk = words[5]
            # the device itself or a partition of it (vdb1, nvme0n1p1)
            rest = summary.root_source[len(disk):] if summary.root_source.startswith(disk) else None
            on_disk = on_disk and rest is not None and (rest == "" or rest.lstrip("p").isdigit())
        summary.root_on_local_ssd = on_disk
    elif summary.runtime_root:
        summary.errors.append(f"cannot tell where {summary.runtime_root} is mounted: {text.strip()[:300]}")


def _read_units(text: str) -> dict[str, str]:
    """Each release unit -> its state and whether its condition (its binary present) held."""
    shown: dict[str, dict[str, str]] = {}
    unit = ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "Unit":
            unit = value
            shown[unit] = {}
        elif unit:
            shown[unit][key] = value
    states: dict[str, str] = {}
    for unit, properties in shown.items():
        condition = {"yes": "condition met", "no": "condition failed: binary absent"}.get(
            properties.get("ConditionResult", ""), "condition not checked")
        states[unit] = f"{properties.get('ActiveState', '?')} ({condition})"
    return states


def _read_images(summary: WorkerSummary, worker: WorkerRecord, rc: int, text: str) -> None:
    """The runtime's image store, and each preloaded image's place in it."""
    pool = worker.pool
    if rc != 0:
        summary.errors.append(f"the {pool.runtime} image store could not be listed: {text.strip()[:300]}")
    if pool.runtime == "docker":
        ids = dict(line.split() for line in text.splitlines() if len(line.split()) == 2) if rc == 0 else {}
    else:
        # containerd lists digests beside names: the names are what a pod spec uses
        ids = {line.strip(): "" for line in text.splitlines() if line.strip() and not line.startswith("sha256:")}
    summary.store = sorted(ids)
    for image, image_id in worker.preloaded:
        in_store = image in ids
        store_id = ids.get(image) or None
        summary.preloaded.append({
            "image": image, "image_id": image_id, "in_store": in_store, "store_id": store_id,
            # containerd's list shows no docker image ID to compare: None, not a verdict
            "id_matches": (store_id == image_id) if in_store and store_id else None,
            "pause": image == pool.pause_image,
        })


# --- stop ----------------------------------------------------------------------------------------

def stop(worker: WorkerRecord, progress: Progress, poweroff_timeout_s: float = POWEROFF_TIMEOUT_S) -> str:
    """Power the guest off over SSH and wait (bounded); then SIGTERM, then SIGKILL, by PID."""
    state = probe(worker)
    if state.state != "running" or state.pid is None:
        if state.state in ("stopped", "dead"):
            worker.pid_file.unlink(missing_ok=True)
            return "was not running"
        return f"left alone: {state.detail}"
    pid = state.pid
    progress(f"worker VM: powering the guest off (PID {pid}; up to {poweroff_timeout_s:.0f} s, then SIGTERM) ...")
    started = time.monotonic()
    with contextlib.suppress(Exception):  # the connection drops as the guest goes down
        session = _Session(worker)
        try:
            session.run("sudo systemctl poweroff", timeout=15)
        finally:
            session.close()
    if _wait_gone(pid, poweroff_timeout_s):
        outcome = f"powered off (PID {pid}, {time.monotonic() - started:.0f} s)"
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # qemu quits at once on SIGTERM (no guest shutdown)
        if _wait_gone(pid, TERM_TIMEOUT_S):
            outcome = f"stopped by SIGTERM (PID {pid}): the guest did not power off in {poweroff_timeout_s:.0f} s"
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, KILL_TIMEOUT_S)
            outcome = f"killed (PID {pid} ignored SIGTERM for {TERM_TIMEOUT_S:.0f} s)"
    if not alive(pid):
        worker.pid_file.unlink(missing_ok=True)
    return outcome


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
