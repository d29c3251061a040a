"""A plan's main etcd cluster as real etcd processes on loopback, each member started from its
own rendered unit, localised: the snapshot-and-restore test's harness.

The pattern of tests/render/test_etcd_real.py, with one difference the restore needs: each
member's localised unit is written to a file, and the process is started from the flags in that
file, so the runbook's steps (which read a member's settings from its unit) and the process
read the very same text. Localised: each member's Azure address becomes its own loopback
address (127.X.Y.11, ...), its data dir and TLS files paths under the test's directory; every
other flag stays as rendered. Everything started here is stopped by PID.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from kilonode.node.ship import ETCD_SNAPSHOT
from kilonode.plan import ClusterPlan, wellknown
from kilonode.plan.model import EtcdMember
from kilonode.render import render_cluster
from kilonode.render.etcd_snapshot import CONFIG_PATH, snapshot_files
from tests.render.local_pki import TestCA

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
ETCD_UNIT = "etc/systemd/system/etcd.service"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
FLAG_LINE = re.compile(r"^(\s*--)([a-z0-9-]+)=(\S+)(.*)$")


def rendered_flags(unit: str) -> list[tuple[str, str]]:
    exec_start = unit.split("ExecStart=", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"--([a-z0-9-]+)=(\S+)", exec_start)


def localise_value(name: str, value: str, addresses: dict[str, str], files: dict[str, str]) -> str:
    for azure, loopback in addresses.items():
        value = value.replace(f"{azure}:", f"{loopback}:")
    for rendered_path, local_path in files.items():
        value = value.replace(rendered_path, local_path)
    if name in {"listen-client-urls", "listen-metrics-urls"}:
        # every member also listens on 127.0.0.1 on a real host; here they share one loopback,
        # so each keeps its own address only
        value = ",".join(dict.fromkeys(u for u in value.split(",") if "127.0.0.1:" not in u))
    return value


def localise_unit(unit: str, addresses: dict[str, str], files: dict[str, str]) -> str:
    """The unit's text with each `--flag=value` line of its ExecStart localised, nothing else."""
    head, sep, tail = unit.partition("ExecStart=")
    block, blank, rest = tail.partition("\n\n")
    lines = []
    for line in block.split("\n"):
        match = FLAG_LINE.match(line)
        if match:
            prefix, name, value, suffix = match.groups()
            line = f"{prefix}{name}={localise_value(name, value, addresses, files)}{suffix}"
        lines.append(line)
    return head + sep + "\n".join(lines) + blank + rest


def etcdctl_env() -> dict[str, str]:
    return {"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"}


class SnapshotCluster:
    """The plan's main cluster, members on their own loopback addresses with a test CA."""

    def __init__(self, plan: ClusterPlan, tmp_path: Path) -> None:
        self.plan = plan
        self.cluster = plan.etcd_main
        self.tmp_path = tmp_path
        # a loopback /24 of this run's own, so parallel runs never meet on 2379/2380
        net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
        self.addresses = {str(m.ip): f"{net}.{11 + m.index}" for m in self.cluster.members}
        self.ca = TestCA(tmp_path / "pki", "etcd-main-ca")
        client_cert, client_key = self.ca.issue("client", ["127.0.0.1"])
        self.tls = (self.ca.ca_file, client_cert, client_key)
        self.endpoints = {m.name: f"https://{self.addresses[str(m.ip)]}:2379" for m in self.cluster.members}
        self.rendered = render_cluster(plan)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.units: dict[str, Path] = {}
        self.member_tls: dict[str, tuple[Path, Path]] = {}
        for member in self.cluster.members:
            self._write_unit(member)

    def member(self, name: str) -> EtcdMember:
        return next(m for m in self.cluster.members if m.name == name)

    def home(self, name: str) -> Path:
        return self.tmp_path / name

    def data_dir(self, name: str) -> Path:
        return self.home(name) / "data"

    def _write_unit(self, member: EtcdMember) -> None:
        local_ip = self.addresses[str(member.ip)]
        cert, key = self.ca.issue(member.name, [local_ip, "127.0.0.1"])
        self.member_tls[member.name] = (cert, key)
        files = {
            self.cluster.data_dir: str(self.data_dir(member.name)),
            wellknown.ETCD_SERVER_CERT: str(cert), wellknown.ETCD_SERVER_KEY: str(key),
            wellknown.ETCD_PEER_CERT: str(cert), wellknown.ETCD_PEER_KEY: str(key),
            wellknown.ETCD_CLIENT_CA: str(self.ca.ca_file), wellknown.ETCD_CA: str(self.ca.ca_file),
        }
        unit = localise_unit(self.rendered[member.name][ETCD_UNIT].content, self.addresses, files)
        path = self.home(member.name) / "etcd.service"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(unit)
        self.units[member.name] = path

    def start(self, name: str) -> None:
        """Start member `name` with the flags of its (localised) rendered unit file."""
        args = [f"--{flag}={value}" for flag, value in rendered_flags(self.units[name].read_text())]
        log = (self.home(name) / "etcd.log").open("ab")
        self.processes[name] = subprocess.Popen([ETCD, *args], stdout=log, stderr=subprocess.STDOUT)

    def start_all(self) -> None:
        for member in self.cluster.members:
            self.start(member.name)

    def stop(self, name: str, signalled: bool = False) -> None:
        process = self.processes.pop(name)
        if not signalled:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def stop_all(self) -> None:
        # SIGTERM to all first, then wait: the members stop in parallel (~2 s, not ~2 s each)
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for name in list(self.processes):
            self.stop(name, signalled=True)

    def close(self) -> None:
        self.stop_all()
        shutil.rmtree(self.tmp_path / "pki", ignore_errors=True)

    def etcdctl(self, *args: str, endpoints: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        ca, cert, key = self.tls
        chosen = endpoints if endpoints is not None else list(self.endpoints.values())
        return subprocess.run(
            [ETCDCTL, f"--endpoints={','.join(chosen)}", f"--cacert={ca}", f"--cert={cert}", f"--key={key}",
             "--command-timeout=5s", *args],
            capture_output=True, text=True, timeout=30, check=False, env=etcdctl_env(),
        )

    def wait_healthy(self) -> subprocess.CompletedProcess[str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            health = self.etcdctl("endpoint", "health")
            if health.returncode == 0 or time.monotonic() > deadline:
                return health
            time.sleep(0.5)

    def statuses(self) -> dict[str, dict[str, Any]]:
        """member name -> `endpoint status` of that member."""
        out = self.etcdctl("endpoint", "status", "-w", "json")
        assert out.returncode == 0, out.stderr
        by_endpoint = {e["Endpoint"]: e["Status"] for e in json.loads(out.stdout)}
        return {name: by_endpoint[url] for name, url in self.endpoints.items()}

    def leader(self) -> str:
        [name] = [n for n, s in self.statuses().items() if s["leader"] == s["header"]["member_id"]]
        return name

    def logs(self) -> str:
        return "\n".join(f"--- {m.name}\n{(self.home(m.name) / 'etcd.log').read_text()[-3000:]}"
                         for m in self.cluster.members if (self.home(m.name) / "etcd.log").exists())

    # --- the snapshot job, as rendered, pointed at this harness ---------------------------

    def snapshot_script(self) -> Path:
        """The script, written as the etcd image carries it (kilonode.node.ship ETCD_SNAPSHOT)."""
        [(_target, data, mode)] = ETCD_SNAPSHOT.files()
        path = self.tmp_path / "etcd_snapshot.py"
        path.write_bytes(data)
        path.chmod(mode)
        return path

    def snapshot_config(self, name: str) -> Path:
        """Member `name`'s rendered config with its host paths localised: its own loopback
        endpoint (127.0.0.1 is shared here), its certificate, Debian's etcdctl (3.4, which has
        no etcdutl), a snapshot directory of its own, and no Azure config (no upload)."""
        member = self.member(name)
        config = json.loads(snapshot_files(self.plan, self.cluster, member)[CONFIG_PATH].content)
        cert, key = self.member_tls[name]
        config |= {
            "endpoint": self.endpoints[name],
            "caFile": str(self.ca.ca_file), "certFile": str(cert), "keyFile": str(key),
            "etcdctl": ETCDCTL, "etcdutl": str(self.tmp_path / "no-etcdutl"),
            "directory": str(self.home(name) / "snapshots"),
            "azureConfig": str(self.tmp_path / "no-azure.json"),
        }
        path = self.home(name) / "etcd-snapshot.json"
        path.write_text(json.dumps(config, indent=2))
        return path
