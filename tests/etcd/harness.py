"""Real etcd members (Debian's etcd-server) started the way systemd starts the rendered unit.

Each member of a plan's etcd clusters gets its own loopback address (127.R.S.x, a /24 of the
run's own, so parallel runs never meet on 2379/2380) and its own directory standing in for
its host: the data dir on the local SSD, /run/etcd, /var/lib/kilonode-etcd (the OS disk) and
/etc/etcd/pki. The certificates follow kilonode.azure.tls's trust layout: one CA per cluster
signs its members' server and peer certificates; each cluster's client CA file holds the
main CA (the events one its own CA too); the test's clients use an apiserver-style client
certificate signed by the main CA and a bundle of both CAs.

`boot` does what systemd does with the rendered etcd.service: it parses the unit, runs each
ExecStartPre= (the rendered etcd-join script among them) with the unit's Environment= and its
EnvironmentFile= read just before each command, then ExecStart=; `ready` waits for the member
to serve (Type=notify) and runs ExecStartPost=. Every rendered host path is mapped into the
member's directory and every Azure address to its loopback one; a command that would still
name a host path is refused, so no test touches the machine's own /etc, /run or /var.
Processes are stopped by PID.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kilonode.plan import ClusterPlan, wellknown
from kilonode.plan.model import EtcdClusterPlan
from kilonode.render import render_cluster
from kilonode.render.etcd import ETCD_BINARY, ETCD_JOIN, ETCD_UNIT, ETCDCTL_BINARY
from tests.render.local_pki import TestCA

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
START_TIMEOUT_S = 30
# systemd's environment for a system service before the unit's own (systemd.exec(5)).
SYSTEMD_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Host paths no command may name once localised: they would be this machine's own (a path
# begins at the start, after a space, a quote, "=", "," or ":").
# Scripts are written and programs started from several threads at once (members boot together).
# A child forked by one thread holds every open file of the parent until it execs; executing a
# script that such a child still holds open for writing fails with ETXTBSY ("Text file busy").
# Writing a script and forking-until-exec are therefore made mutually exclusive.
_SPAWN_LOCK = threading.Lock()


def spawn(argv: list[str], **options: object) -> subprocess.Popen[bytes]:
    """subprocess.Popen, returning once the child has exec'd, never while a script is being written."""
    with _SPAWN_LOCK:
        return subprocess.Popen(argv, **options)  # type: ignore[call-overload,no-any-return]


def run(argv: list[str], *, timeout: float, env: dict[str, str], cwd: Path | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """subprocess.run(capture_output=True, text=True, check=False) through spawn()."""
    process = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    with process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def write_script(path: Path, text: str) -> None:
    with _SPAWN_LOCK:
        path.write_text(text)
        path.chmod(0o755)


HOST_PATH = re.compile(r"""(?:^|[\s'"=,:(])(/etc/etcd|/mnt/|/run/|/var/lib/|/usr/local/)""", re.M)

Tls = tuple[Path, Path, Path]  # CA file, client certificate, client key


# --- the unit, as systemd reads it ------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    argv: list[str]
    ignore_failure: bool  # "-" prefix
    privileged: bool  # "+" prefix: runs as root, not User= (the test runs as one user anyway)


class Unit:
    """The [Service] section of a rendered unit: continuation lines joined, comments dropped."""

    def __init__(self, text: str) -> None:
        self.service: list[tuple[str, str]] = []
        section = ""
        logical = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not logical and (not line or line.startswith(("#", ";"))):
                continue
            if line.endswith("\\"):
                logical += line[:-1] + " "
                continue
            logical += line
            if logical.startswith("[") and logical.endswith("]"):
                section = logical[1:-1]
            elif section == "Service":
                key, _, value = logical.partition("=")
                self.service.append((key, value))
            logical = ""

    def values(self, key: str) -> list[str]:
        return [value for k, value in self.service if k == key]

    def value(self, key: str) -> str:
        [value] = self.values(key)
        return value

    def commands(self, key: str) -> list[Command]:
        commands = []
        for value in self.values(key):
            ignore = privileged = False
            while value[:1] in {"-", "+"}:
                ignore, privileged = ignore or value[0] == "-", privileged or value[0] == "+"
                value = value[1:]
            if value[:1] in {"@", ":", "!"}:
                raise ValueError(f"exec prefix {value[0]!r} is not emulated here: {value}")
            # systemd expands $VAR and %-specifiers; kilonode's units double both ($$, %%)
            unescaped = value.replace("$$", "\0").replace("%%", "%")
            if "$" in unescaped:
                raise ValueError(f"variable expansion is not emulated here: {value}")
            commands.append(Command(shlex.split(unescaped.replace("\0", "$")), ignore, privileged))
        return commands

    def environment(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for value in self.values("Environment"):
            for assignment in shlex.split(value):
                name, _, setting = assignment.partition("=")
                env[name] = setting
        return env

    def environment_files(self) -> list[tuple[str, bool]]:
        """(path, optional): a leading "-" means a missing file is no error."""
        return [(value.removeprefix("-"), value.startswith("-")) for value in self.values("EnvironmentFile")]


def read_environment_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip().strip("\"'")
    return env


# --- certificates -------------------------------------------------------------------------

class Pki:
    """kilonode.azure.tls's trust layout, issued by throwaway CAs for the loopback addresses."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cas = {role: TestCA(directory / role, f"etcd-{role}-ca") for role in ("main", "events")}
        self.client_cas: dict[str, Path] = {}
        for role, trusted in {"main": ["main"], "events": ["main", "events"]}.items():
            bundle = directory / f"{role}-client-ca.crt"
            bundle.write_text("".join(self.cas[r].ca_file.read_text() for r in trusted))
            self.client_cas[role] = bundle
        self.ca_bundle = directory / "etcd-ca-bundle.crt"
        self.ca_bundle.write_text("".join(ca.ca_file.read_text() for ca in self.cas.values()))
        # kube-apiserver's one etcd client certificate, signed by the main CA
        cert, key = self.cas["main"].issue("apiserver-etcd-client", ["127.0.0.1"])
        self.client: Tls = (self.ca_bundle, cert, key)

    def member_files(self, role: str, name: str, ip: str) -> dict[str, Path]:
        ca = self.cas[role]
        # server: its address and 127.0.0.1, client auth too (local etcdctl). peer: its address,
        # and 127.0.0.1 here only: etcd matches a peer's certificate against the address it
        # connects from, which on one loopback is 127.0.0.1, on Azure the member's own
        server_cert, server_key = ca.issue(f"{name}-server", [ip, "127.0.0.1"])
        peer_cert, peer_key = ca.issue(f"{name}-peer", [ip, "127.0.0.1"])
        return {
            wellknown.ETCD_CA: ca.ca_file, wellknown.ETCD_CLIENT_CA: self.client_cas[role],
            wellknown.ETCD_SERVER_CERT: server_cert, wellknown.ETCD_SERVER_KEY: server_key,
            wellknown.ETCD_PEER_CERT: peer_cert, wellknown.ETCD_PEER_KEY: peer_key,
        }


# --- members ------------------------------------------------------------------------------

@dataclass
class BootResult:
    started: bool
    output: str  # what ExecStartPre= printed (etcd-join's verdict)
    returncode: int = 0
    environment: dict[str, str] = field(default_factory=dict)  # what ExecStart= ran with


@dataclass
class Member:
    name: str
    role: str
    index: int
    azure_ip: str
    ip: str
    root: Path
    pki: dict[str, Path]

    @property
    def endpoint(self) -> str:
        return f"https://{self.ip}:2379"

    @property
    def data_dir(self) -> Path:
        return self.root / "local-ssd" / "etcd"

    @property
    def journal(self) -> Path:
        return self.root / "journal.log"

    @property
    def ready_marker_dir(self) -> Path:
        return self.root / "var-lib"


class LocalEtcd:
    """A plan's etcd clusters as real processes; stops what it started, by PID."""

    def __init__(self, plan: ClusterPlan, tmp_path: Path) -> None:
        self.plan = plan
        self.tmp_path = tmp_path
        self.pki = Pki(tmp_path / "pki")
        net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
        self.members: dict[str, Member] = {}
        for offset, cluster in ((11, plan.etcd_main), (31, plan.etcd_events)):
            for m in cluster.members:
                ip = f"{net}.{offset + m.index}"
                self.members[m.name] = Member(
                    m.name, cluster.role, m.index, str(m.ip), ip, tmp_path / m.name,
                    self.pki.member_files(cluster.role, m.name, ip),
                )
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    # addresses and paths

    def cluster(self, role: str) -> EtcdClusterPlan:
        return self.plan.etcd_main if role == "main" else self.plan.etcd_events

    def names(self, role: str) -> list[str]:
        return [m.name for m in self.cluster(role).members]

    def endpoints(self, role: str, names: Iterable[str] | None = None) -> list[str]:
        return [self.members[n].endpoint for n in (names if names is not None else self.names(role))]

    def localise(self, text: str, member: Member) -> str:
        """Map every rendered host path and Azure address of `member`'s files to the test's own."""
        cluster = self.cluster(member.role)
        paths: dict[str, str] = {
            cluster.data_dir: str(member.data_dir),
            "/run/etcd": str(member.root / "run"),
            "/var/lib/kilonode-etcd": str(member.ready_marker_dir),
            f"/{ETCD_JOIN}": str(member.root / "etcd-join"),
            ETCDCTL_BINARY: ETCDCTL,
            ETCD_BINARY: ETCD,
            **{rendered: str(local) for rendered, local in member.pki.items()},
        }
        for rendered, local in sorted(paths.items(), key=lambda item: -len(item[0])):
            text = text.replace(rendered, local)
        for other in self.members.values():
            text = text.replace(f"//{other.azure_ip}:", f"//{other.ip}:")
        return text

    def rendered(self, name: str) -> dict[str, str]:
        files = render_cluster(self.plan)[name]
        return {path: file.content for path, file in files.items()}

    def unit(self, name: str) -> Unit:
        return Unit(self.rendered(name)[ETCD_UNIT])

    def _argv(self, member: Member, command: Command) -> list[str]:
        argv = [self.localise(arg, member) for arg in command.argv]
        if Path(argv[0]).name == "install":
            # the test runs every command as one user: no -o/-g
            argv = [a for i, a in enumerate(argv) if a not in {"-o", "-g"} and argv[i - 1] not in {"-o", "-g"}]
        for i, arg in enumerate(argv):
            if arg.startswith("--listen-client-urls=") or arg.startswith("--listen-metrics-urls="):
                # every member also listens on 127.0.0.1 on a real host; here they share one
                # loopback, so each keeps its own address only
                flag, _, urls = arg.partition("=")
                argv[i] = f"{flag}={','.join(u for u in urls.split(',') if '//127.0.0.1:' not in u)}"
        leaked = [a for a in argv if HOST_PATH.search(a)]
        if leaked:
            raise AssertionError(f"{member.name}: a command would touch this machine's own paths: {leaked}")
        return argv

    def _environment(self, member: Member, unit: Unit) -> dict[str, str]:
        env = {**SYSTEMD_BASE_ENV, **unit.environment()}
        for rendered, optional in unit.environment_files():
            path = Path(self.localise(rendered, member))
            if path.exists():
                env |= read_environment_file(path)
            elif not optional:
                raise FileNotFoundError(path)
        return env

    # systemd

    def boot(self, name: str) -> BootResult:
        """systemctl start etcd on `name`'s host, up to the point where etcd runs."""
        member = self.members[name]
        unit = self.unit(name)
        assert unit.value("Type") == "notify" and unit.value("RuntimeDirectory") == "etcd"
        assert unit.value("StateDirectory") == "kilonode-etcd"
        run_dir = member.root / "run"
        shutil.rmtree(run_dir, ignore_errors=True)  # RuntimeDirectory=: made anew for each start
        run_dir.mkdir(parents=True, mode=0o700)
        member.ready_marker_dir.mkdir(parents=True, exist_ok=True)
        script = member.root / "etcd-join"
        text = self.localise(self.rendered(name)[ETCD_JOIN], member)
        leaked = [line for line in text.splitlines() if not line.lstrip().startswith("#") and HOST_PATH.search(line)]
        assert not leaked, f"{name}: etcd-join would touch this machine's own paths: {leaked}"
        write_script(script, text)
        output = []
        for command in unit.commands("ExecStartPre"):
            result = run(self._argv(member, command), env=self._environment(member, unit), timeout=180)
            output.append(result.stdout + result.stderr)
            with member.journal.open("a") as journal:
                journal.write(result.stdout + result.stderr)
            if result.returncode != 0 and not command.ignore_failure:
                shutil.rmtree(run_dir, ignore_errors=True)  # the unit failed: systemd cleans up
                return BootResult(False, "".join(output), result.returncode)
        [exec_start] = unit.commands("ExecStart")
        env = self._environment(member, unit)
        journal = member.journal.open("ab")
        self.processes[name] = spawn(self._argv(member, exec_start), env=env, stdout=journal, stderr=subprocess.STDOUT)
        journal.close()
        return BootResult(True, "".join(output), 0, env)

    def ready(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for what Type=notify waits for (the member serves), then run ExecStartPost=."""
        member = self.members[name]
        health = wait_healthy(self.pki.client, [member.endpoint], timeout_s)
        assert health.returncode == 0, f"{name} never became ready:\n{health.stderr}\n{self.log_tail(name)}"
        unit = self.unit(name)
        for command in unit.commands("ExecStartPost"):
            result = run(self._argv(member, command), env=self._environment(member, unit), timeout=30)
            assert result.returncode == 0 or command.ignore_failure, result.stderr

    def start_cluster(self, role: str, names: Iterable[str] | None = None) -> list[BootResult]:
        """Boot the members at once, as VMs booting together do, and wait until each is ready."""
        names = list(names if names is not None else self.names(role))
        results: dict[str, BootResult | BaseException] = {}

        def boot(name: str) -> None:
            try:
                results[name] = self.boot(name)
            except BaseException as error:  # re-raised below, in the caller's thread
                results[name] = error

        threads = [threading.Thread(target=boot, args=(n,)) for n in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        for name in names:
            result = results.get(name, TimeoutError(f"{name}: ExecStartPre= still running after 120 s"))
            if isinstance(result, BaseException):
                raise result
            assert result.started, f"{name}: {result.output}"
        for name in names:
            self.ready(name)
        return [results[n] for n in names]  # type: ignore[misc]

    def stop(self, name: str, sig: signal.Signals | None = signal.SIGTERM) -> None:
        """Signal the member's etcd by PID (None: already signalled) and wait for it to exit."""
        process = self.processes.pop(name)
        if sig is not None:
            process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        shutil.rmtree(self.members[name].root / "run", ignore_errors=True)

    def stop_all(self) -> None:
        """systemctl stop on every host, one after the other (a clean shutdown, ~2 s each)."""
        for name in list(self.processes):
            self.stop(name)

    def kill_all(self) -> None:
        """The test's own cleanup: SIGKILL to every member still running, by PID, at once."""
        for process in self.processes.values():
            process.send_signal(signal.SIGKILL)
        for name in list(self.processes):
            self.stop(name, None)

    def log_tail(self, name: str, lines: int = 30) -> str:
        journal = self.members[name].journal
        return "\n".join(journal.read_text(errors="replace").splitlines()[-lines:]) if journal.exists() else ""

    # etcd's own view

    def ctl(self, role: str, *args: str, names: Iterable[str] | None = None) -> subprocess.CompletedProcess[str]:
        return etcdctl(self.pki.client, self.endpoints(role, names), *args)

    def member_list(self, role: str, names: Iterable[str] | None = None) -> list[dict[str, object]]:
        listed = self.ctl(role, "member", "list", "-w", "json", names=names)
        assert listed.returncode == 0, listed.stderr
        return json.loads(listed.stdout)["members"]

    def status(self, name: str) -> dict[str, object]:
        member = self.members[name]
        status = etcdctl(self.pki.client, [member.endpoint], "endpoint", "status", "-w", "json")
        assert status.returncode == 0, status.stderr
        [entry] = json.loads(status.stdout)
        return entry["Status"]


def etcdctl(tls: Tls, endpoints: list[str], *args: str, env: dict[str, str] | None = None,
            timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    ca, cert, key = tls
    return run(
        [ETCDCTL, f"--endpoints={','.join(endpoints)}", f"--cacert={ca}", f"--cert={cert}", f"--key={key}",
         "--command-timeout=5s", *args],
        timeout=timeout_s, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin", **(env or {})},
    )


def wait_healthy(
    tls: Tls, endpoints: list[str], timeout_s: float = START_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        health = etcdctl(tls, endpoints, "endpoint", "health")
        if health.returncode == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.3)


# --- a client that keeps its connection: etcd's gRPC gateway (JSON over the client port) ----

class KvError(Exception):
    pass


class Kv:
    """Put and range over etcd's gRPC gateway (/v3/kv/...), one TLS connection kept open: an
    etcdctl process per put would cost more CPU than the puts on 2 cores."""

    def __init__(self, endpoint: str, tls: Tls, timeout_s: float = 5) -> None:
        self.host, port = endpoint.removeprefix("https://").split(":")
        self.port = int(port)
        ca, cert, key = tls
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.load_cert_chain(str(cert), str(key))
        self.timeout_s = timeout_s
        self.connection: http.client.HTTPSConnection | None = None

    def _call(self, path: str, body: dict[str, object]) -> dict[str, object]:
        if self.connection is None:
            self.connection = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                                          timeout=self.timeout_s)
        try:
            self.connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = self.connection.getresponse()
            payload = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as error:
            self.close()
            raise KvError(f"{self.host}: {error!r}") from error
        if response.status != 200 or "error" in payload or "code" in payload:
            raise KvError(f"{self.host}: {response.status} {payload.get('message') or payload.get('error')}")
        return payload

    def put(self, key: str, value: bytes) -> int:
        """The revision the put was committed at: an acknowledged write."""
        reply = self._call("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})
        return int(reply["header"]["revision"])  # type: ignore[index]

    def range_prefix(self, prefix: str) -> dict[str, bytes]:
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        reply = self._call("/v3/kv/range", {"key": _b64(prefix.encode()), "range_end": _b64(end.encode())})
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
                for kv in reply.get("kvs", [])}  # type: ignore[union-attr]

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class WriteLog:
    acknowledged: dict[str, bytes] = field(default_factory=dict)
    ack_times: list[float] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)

    def longest_gap_s(self, start: float, end: float) -> float:
        times = [start, *sorted(t for t in self.ack_times if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(times))


class Writer(threading.Thread):
    """A steady stream of small puts, as an apiserver sends them: each to the next endpoint in
    turn, a failed put tried again on the next endpoint (a client's failover), at most
    `rate` puts a second. Records which keys were acknowledged."""

    def __init__(self, endpoints: list[str], tls: Tls, prefix: str, rate: float = 50.0) -> None:
        super().__init__(daemon=True)
        self.clients = [Kv(e, tls, timeout_s=3) for e in endpoints]
        self.prefix = prefix
        self.interval = 1 / rate
        self.log = WriteLog()
        self.halt = threading.Event()

    def run(self) -> None:
        i = turn = 0
        next_at = time.monotonic()
        while not self.halt.is_set():
            key, value = f"{self.prefix}{i:07d}", os.urandom(512).hex().encode()
            for _attempt in range(len(self.clients)):
                client = self.clients[turn % len(self.clients)]
                turn += 1
                try:
                    client.put(key, value)
                except KvError as error:
                    self.log.errors.append((time.monotonic(), str(error)))
                    continue
                self.log.acknowledged[key] = value
                self.log.ack_times.append(time.monotonic())
                break
            i += 1
            next_at += self.interval
            self.halt.wait(max(0.0, next_at - time.monotonic()))
        for client in self.clients:
            client.close()

    def stop(self) -> WriteLog:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive()
        return self.log


# --- runbooks: the commands of docs/runbooks, run on a member -------------------------------

RUNBOOKS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def runbook_blocks(name: str) -> dict[str, str]:
    """{heading: its one ```sh block} of docs/runbooks/<name>.md, in the document's order."""
    blocks: dict[str, str] = {}
    heading = ""
    for part in re.split(r"^(## .*)$", (RUNBOOKS / name).read_text(), flags=re.M):
        if part.startswith("## "):
            heading = part.removeprefix("## ").strip()
            continue
        found = re.findall(r"```sh\n(.*?)```", part, flags=re.S)
        assert len(found) <= 1, f"{name}, {heading!r}: one command block per step"
        if found:
            blocks[heading] = found[0]
    return blocks


def run_runbook_block(etcd: LocalEtcd, name: str, setup: str, block: str) -> subprocess.CompletedProcess[str]:
    """Run a runbook block, after its setup block, on member `name` as the runbook's root
    shell would: only the paths and addresses are mapped (127.0.0.1 to the member's own)."""
    member = etcd.members[name]
    script = etcd.localise(f"{setup}\n{block}", member).replace("https://127.0.0.1:2379", member.endpoint)
    leaked = HOST_PATH.findall(script)
    assert not leaked, f"the block names this machine's own paths {leaked}:\n{script}"
    return run(["bash", "-eu", "-c", script], timeout=120, env=dict(SYSTEMD_BASE_ENV), cwd=member.root)
