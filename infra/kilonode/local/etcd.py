"""etcd members as local processes, and what etcdctl says about them.

A member runs detached (its own session: it outlives the command that started it) with its
data, log and PID file in its own directory of the state dir. A PID file is trusted only
while `/proc/<pid>/cmdline` is exactly the command line recorded for the member (the PID of
a member that died may since belong to anything); only such a process is ever signalled.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

STOP_TIMEOUT_S = 10.0  # SIGTERM, then this long (a member stops in ~1 s here), then SIGKILL
KILL_TIMEOUT_S = 5.0
ETCDCTL_TIMEOUT_S = 5

# Children this process started: polled, so a member that dies while we still run is reaped
# (a zombie would pass `kill(pid, 0)`), and no Popen is garbage-collected while running.
_children: dict[int, subprocess.Popen[bytes]] = {}
# A member's whole environment is this PATH and its unit's Environment=: an ETCD_* variable
# of the caller's would set (or, beside a flag, refuse) one of etcd's settings.
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class EtcdError(RuntimeError):
    """A member cannot be started or reached; the message names it and what to do."""


def find_tool(name: str) -> str:
    """etcd or etcdctl: Debian's etcd-server / etcd-client (installed by `make setup`)."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        package = "etcd-server" if name == "etcd" else "etcd-client"
        raise EtcdError(f"{name} not found: install Debian's {package} (`make setup` does), then run again")
    return found


@dataclass(frozen=True)
class ClientTls:
    """What etcdctl needs to reach a cluster: the CA that signed its servers, a client pair."""

    ca: Path
    cert: Path
    key: Path

    def to_json(self) -> dict[str, str]:
        return {"ca": str(self.ca), "cert": str(self.cert), "key": str(self.key)}


@dataclass(frozen=True)
class Member:
    cluster: str  # main | events
    name: str
    address: str  # its loopback address
    argv: tuple[str, ...]  # exactly what runs: the local etcd, then the localised rendered flags
    directory: Path
    client_url: str
    listens: tuple[tuple[str, int, str], ...]  # (address, port, flag) it binds
    # the unit's Environment= (ETCD_INITIAL_CLUSTER_STATE=new): etcd reads a flag missing
    # from its command line from ETCD_<FLAG>; nothing else of the caller's environment
    env: tuple[tuple[str, str], ...] = ()

    @property
    def pid_file(self) -> Path:
        return self.directory / "etcd.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "etcd.log"

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "address": self.address, "argv": list(self.argv),
                "directory": str(self.directory), "client_url": self.client_url,
                "listens": [list(item) for item in self.listens], "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Member:
        return cls(data["cluster"], data["name"], data["address"], tuple(data["argv"]), Path(data["directory"]),
                   data["client_url"], tuple((str(a), int(p), str(f)) for a, p, f in data["listens"]),
                   tuple(data.get("env", {}).items()))


State = Literal["running", "stopped", "dead", "foreign", "changed"]


@dataclass(frozen=True)
class ProcessState:
    state: State
    pid: int | None
    detail: str


def cmdline(pid: int) -> list[str] | None:
    """The process's argv; None if it is gone. Empty for a kernel thread, a zombie, and for a
    moment during exec (the new image's arguments are set after the old one is released,
    after Popen has returned): so an empty one is read again, briefly."""
    for _ in range(50):  # bounded: 0.5 s
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if raw:
            return raw.rstrip(b"\0").decode(errors="replace").split("\0")
        time.sleep(0.01)
    return []


def alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and certainly not ours
    try:
        # a zombie (exited, not yet reaped by its parent) still answers kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def probe(member: Member) -> ProcessState:
    """What the member's PID file says, checked against /proc."""
    try:
        text = member.pid_file.read_text().strip()
    except FileNotFoundError:
        return ProcessState("stopped", None, "not started")
    if not text.isdigit():
        return ProcessState("dead", None, f"stale PID file {member.pid_file} (it holds {text[:20]!r})")
    pid = int(text)
    if not alive(pid):
        return ProcessState("dead", pid, f"PID {pid} is not running (stale PID file {member.pid_file})")
    running = cmdline(pid)
    if running == list(member.argv):
        return ProcessState("running", pid, "running")
    data_dir = next((a for a in member.argv if a.startswith("--data-dir=")), None)
    if running and os.path.basename(running[0]) == "etcd" and data_dir in running:
        return ProcessState("changed", pid, f"PID {pid} runs this member with other flags than the stack renders now")
    shown = " ".join(running or ["?"])[:120]
    return ProcessState("foreign", pid, f"PID {pid} in {member.pid_file} is now `{shown}`, not this member")


def listener(address: str, port: int) -> str | None:
    """None if `address:port` is free to listen on; else who holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as Go's net.Listen does, so sockets in TIME_WAIT from a member just stopped don't count
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
        else:
            return None
    return _owner(address, port) or "another process (not visible to this user)"


def _owner(address: str, port: int) -> str | None:
    """The process listening on address:port (or on the wildcard), from /proc/net/tcp{,6}."""
    wanted = {socket.inet_aton(address)[::-1].hex().upper(), "00000000"}
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                host, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port and (host in wanted or set(host) == {"0"}):
                    inodes.add(f"socket:[{inode}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        shown = " ".join(cmdline(int(proc.name)) or ["?"])[:120]
                        return f"PID {proc.name} (`{shown}`)"
    return None


def check_ports(member: Member) -> None:
    """Raise, naming the holder and what to do, if an address the member listens on is taken."""
    for address, port, flag in member.listens:
        holder = listener(address, port)
        if holder is not None:
            raise EtcdError(
                f"{address}:{port} ({member.name}'s --{flag}) is taken by {holder}: stop that process "
                f"(if it is another rehearsal, `kilonode local down` with its --state-dir), then run up again"
            )


def start(member: Member) -> int:
    """Start the member detached; its PID. Refuses, naming the holder, if a port is taken."""
    check_ports(member)
    member.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with member.log_file.open("ab") as log:
        process = subprocess.Popen(
            list(member.argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=member.directory, close_fds=True, env={"PATH": _PATH, **dict(member.env)},
            start_new_session=True,  # its own session: no terminal signal from this command reaches it
        )
    _children[process.pid] = process
    temporary = member.pid_file.with_suffix(".pid.tmp")
    temporary.write_text(f"{process.pid}\n")
    temporary.replace(member.pid_file)
    return process.pid


def stop(clusters: Iterable[Sequence[Member]], timeout_s: float = STOP_TIMEOUT_S) -> dict[str, str]:
    """Stop the members this state dir started (SIGTERM, a bounded wait, then SIGKILL); by
    name, what happened. A PID that is no longer the member's is left alone.

    One member of each cluster at a time, the clusters side by side: a leader that gets
    SIGTERM hands leadership to its longest-connected peer and waits for it (etcd
    server.go `TransferLeadership`, up to the request timeout, 7 s here); stopped all at
    once, the peer it picked is already going and the leader waits out the whole timeout.
    One at a time, each leader finds a live peer or none, and each member stops in ~1 s.
    """
    outcome: dict[str, str] = {}
    queues = [list(members) for members in clusters]
    while any(queues):
        signalled: dict[str, tuple[Member, int]] = {}
        for queue in queues:
            while queue:
                member = queue.pop(0)
                state = probe(member)
                if state.state in ("running", "changed") and state.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(state.pid, signal.SIGTERM)
                    signalled[member.name] = (member, state.pid)
                    break
                outcome[member.name] = "was not running" if state.state in ("stopped", "dead") else \
                    f"left alone: {state.detail}"
                member.pid_file.unlink(missing_ok=True)
        deadline = time.monotonic() + timeout_s
        while any(alive(pid) for _, pid in signalled.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name, (member, pid) in signalled.items():
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                kill_deadline = time.monotonic() + KILL_TIMEOUT_S
                while alive(pid) and time.monotonic() < kill_deadline:
                    time.sleep(0.05)
                outcome[name] = f"killed (PID {pid} ignored SIGTERM for {timeout_s:.0f} s)"
            else:
                outcome[name] = f"stopped (PID {pid})"
            if not alive(pid):
                member.pid_file.unlink(missing_ok=True)
    return outcome


def log_tail(member: Member, lines: int = 3) -> str:
    try:
        text = member.log_file.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:300] for line in text[-lines:])


def etcdctl(endpoints: Sequence[str], tls: ClientTls, *args: str,
            timeout_s: int = ETCDCTL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """etcdctl (API v3) against `endpoints` with exactly these certificates; ETCDCTL_*
    variables of the caller's environment are not passed on (they would add to the flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")} | {"ETCDCTL_API": "3"}
    return subprocess.run(
        [find_tool("etcdctl"), f"--endpoints={','.join(endpoints)}", f"--cacert={tls.ca}", f"--cert={tls.cert}",
         f"--key={tls.key}", f"--command-timeout={timeout_s}s", f"--dial-timeout={min(timeout_s, 3)}s", *args],
        capture_output=True, text=True, timeout=timeout_s * 3, check=False, env=env,
    )


def served_certificate(address: str, port: int, tls: ClientTls, timeout_s: float = 5.0) -> bytes:
    """The certificate (DER) a member presents on address:port, verified against `tls.ca`, to a
    client that shows `tls.cert`: what a peer or the apiserver sees in the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(tls.ca))
    context.load_cert_chain(str(tls.cert), str(tls.key))
    context.check_hostname = False  # the address is checked by the caller's verify of the SANs
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw) as conn:
            der = conn.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as error:
        raise EtcdError(f"{address}:{port}: no verified TLS handshake ({error})") from None
    if der is None:
        raise EtcdError(f"{address}:{port} presented no certificate")
    return der


@dataclass(frozen=True)
class EndpointStatus:
    endpoint: str
    error: str | None = None
    cluster_id: int | None = None
    member_id: int | None = None
    leader: int | None = None
    db_size: int | None = None
    version: str | None = None


def endpoint_status(endpoints: Sequence[str], tls: ClientTls) -> list[EndpointStatus]:
    """`etcdctl endpoint status -w json` per endpoint, all at once: one that does not answer
    says so without hiding the others."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")} | {"ETCDCTL_API": "3"}
    running = [
        (endpoint, subprocess.Popen(
            [find_tool("etcdctl"), f"--endpoints={endpoint}", f"--cacert={tls.ca}", f"--cert={tls.cert}",
             f"--key={tls.key}", f"--command-timeout={ETCDCTL_TIMEOUT_S}s", "--dial-timeout=3s",
             "endpoint", "status", "-w", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ))
        for endpoint in endpoints
    ]
    found = []
    for endpoint, process in running:
        try:
            stdout, stderr = process.communicate(timeout=ETCDCTL_TIMEOUT_S * 3)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            found.append(EndpointStatus(endpoint, error="etcdctl did not answer in time"))
            continue
        found.append(parse_status(endpoint, process.returncode, stdout, stderr))
    return found


def parse_status(endpoint: str, returncode: int, stdout: str, stderr: str) -> EndpointStatus:
    try:
        entries = json.loads(stdout) if returncode == 0 else []
    except json.JSONDecodeError:
        entries = []
    if not entries:
        lines = [line for line in (stderr or stdout).strip().splitlines() if line.strip()]
        return EndpointStatus(endpoint, error=(lines[-1] if lines else f"etcdctl exited {returncode}")[:300])
    status = entries[0]["Status"]
    return EndpointStatus(
        endpoint,
        cluster_id=int(status["header"]["cluster_id"]),
        member_id=int(status["header"]["member_id"]),
        leader=int(status["leader"]),
        db_size=int(status["dbSize"]),
        version=str(status.get("version", "")),
    )


def alarms(endpoints: Sequence[str], tls: ClientTls) -> list[str]:
    """Active alarms (NOSPACE, CORRUPT), as `etcdctl alarm list` prints them."""
    result = etcdctl(endpoints, tls, "alarm", "list")
    if result.returncode != 0:
        return [f"unknown ({result.stderr.strip().splitlines()[-1:] or ['etcdctl failed']})"]
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def member_names(endpoints: Sequence[str], tls: ClientTls) -> dict[int, str]:
    result = etcdctl(endpoints, tls, "member", "list", "-w", "json")
    if result.returncode != 0:
        return {}
    return {int(m["ID"]): str(m.get("name", "")) for m in json.loads(result.stdout).get("members", [])}


def wait_healthy(endpoints: Sequence[str], tls: ClientTls, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`etcdctl endpoint health` on every endpoint until all answer, or the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = etcdctl(endpoints, tls, "endpoint", "health", timeout_s=3)
        if health.returncode == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.3)
