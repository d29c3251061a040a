"""A real Prometheus (Debian's 2.42, unpacked by `make test-artefacts`) scrapes the real etcd of the
local rehearsal and the etcd quota alerts fire when the events cluster fills up: the near-quota page for
every events member, and NOSPACE once, for the cluster.

The `local` stack with a 64 MiB events quota (the smallest a stack accepts; about 85 puts of
768 KiB raise NOSPACE) and its control-plane subnets moved (10.0.6/10.0.7 -> 127.0.6.x/127.0.7.x) so these
members never collide with tests/local's rehearsals; `kilonode local up --no-worker` starts both
etcd clusters from their rendered units with the local PKI. Prometheus gets kilonode's rendered
etcd scrape jobs (targets mapped to the members' loopback addresses, nothing else changed) and the
rendered rule file, on 127.0.0.1.

Test-only changes, said plainly: scrape and evaluation every second instead of the rendered 30 s,
and the quota alerts' `for:` set to 0s in a copy of the rule file (their real 10m/5m/1m waits are
promtool's to check: tests/monitoring/alert_cases.py). Everything this test starts is stopped by PID.
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.local import etcd, rehearsal
from kilonode.local.addresses import address_map
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.render import monitoring
from tests.conftest import StackWriter, shipped_cluster_value
from tests.etcd.harness import Kv, KvError
from tests.monitoring.promtool import prometheus_path

pytestmark = pytest.mark.slow

QUOTA = 64 * 1024**2  # kilonode.config's minimum quotaBackendBytes
VALUE = 768 * 1024
MAX_PUTS = 256  # 192 MiB: three times the quota
INTERVAL = "1s"  # test-only: the rendered jobs scrape every 30 s
QUOTA_ALERTS = ("KilonodeEtcdDatabaseNearQuota", "KilonodeEtcdNoSpace")
READY_TIMEOUT_S = 60
ALERT_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def prometheus() -> Path:
    try:
        return prometheus_path()
    except RuntimeError as error:  # `make test` and `make test-fast` unpack it first: never a skip
        pytest.fail(str(error))


@pytest.fixture
def local_small_events(write_stack: StackWriter, tmp_path: Path) -> Iterator[tuple[ClusterPlan, rehearsal.Record]]:
    if not Path("/usr/bin/etcd").exists():
        pytest.fail("etcd missing: run `make setup` (installs Debian's etcd-server and etcd-client)")
    cluster = shipped_cluster_value("local")
    cluster["network"] = {"controlPlaneSubnet": "10.0.6.0/24", "etcdSubnet": "10.0.7.0/24"}
    cluster["etcd"]["events"]["quotaBackendBytes"] = QUOTA
    stack = load_stack(str(write_stack(cluster, name="local")))
    plan = plan_stack(stack)
    state = tmp_path / "state"
    try:
        result = rehearsal.up(stack, plan, state, progress=lambda _: None, worker=False)
        assert all(c.healthy for c in result.clusters), [c.errors for c in result.clusters]
        yield plan, result.record
    finally:
        # whatever happened, stop the members by their PID files, as `kilonode local down` does
        rehearsal.down(state, keep=False, progress=lambda _: None)


def etcd_jobs(plan: ClusterPlan) -> list[dict[str, Any]]:
    """kilonode's rendered etcd scrape jobs, their targets moved to the members' loopback addresses."""
    addresses = address_map(plan)
    jobs = []
    for job in (j.config for j in monitoring.scrape_jobs(plan)):
        if not job["job_name"].startswith(monitoring.ETCD_JOB_PREFIX):
            continue
        job = copy.deepcopy(job)
        job["scrape_interval"] = INTERVAL
        for group in job["static_configs"]:
            hosts = [t.rsplit(":", 1) for t in group["targets"]]
            group["targets"] = [f"{addresses[host]}:{port}" for host, port in hosts]
        jobs.append(job)
    return jobs


def rules_without_waits(plan: ClusterPlan) -> dict[str, Any]:
    document = yaml.safe_load(monitoring.alert_rules(plan))
    for group in document["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in QUOTA_ALERTS:
                rule["for"] = "0s"
    return document


def api(port: int, path: str, **query: str) -> Any:
    url = f"http://127.0.0.1:{port}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=5) as response:
        document = json.loads(response.read())
    assert document["status"] == "success", document
    return document["data"]


def wait_for(what: str, timeout_s: float, probe: Any) -> Any:
    """Call probe() every half second until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as error:  # not listening yet
            last = error
        else:
            if last:
                return last
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def quota_alerts(port: int) -> list[dict[str, Any]]:
    return [a for a in api(port, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] in QUOTA_ALERTS]


def test_a_real_prometheus_fires_the_etcd_quota_alert_when_the_events_cluster_fills(
    prometheus: Path, local_small_events: tuple[ClusterPlan, rehearsal.Record], tmp_path: Path
) -> None:
    plan, record = local_small_events
    events = next(c for c in record.clusters if c.role == "events")
    assert events.quota_bytes == QUOTA  # the rendered unit's --quota-backend-bytes, as the member runs it
    addresses = address_map(plan)
    events_instances = {f"{addresses[str(m.ip)]}:2381" for m in plan.etcd_events.members}

    rules = tmp_path / monitoring.RULES_FILE
    rules.write_text(yaml.safe_dump(rules_without_waits(plan), sort_keys=False))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules)],
        "scrape_configs": etcd_jobs(plan),
    }, sort_keys=False))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [str(prometheus), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        # every member of both clusters scraped, and the quota ratio recorded for each
        def all_up() -> list[Any]:
            up = api(port, "/api/v1/query", query=f'up{{job=~"{monitoring.ETCD_JOBS}"}} == 1')["result"]
            return up if len(up) == 6 else []

        wait_for("all six etcd members scraped", READY_TIMEOUT_S, all_up)

        def ratios() -> dict[str, float]:
            found = api(port, "/api/v1/query", query=monitoring.ETCD_QUOTA_RATIO)["result"]
            by = {r["metric"]["instance"]: float(r["value"][1]) for r in found}
            return by if len(by) == 6 else {}

        before = wait_for("the quota ratio of every member", READY_TIMEOUT_S, ratios)
        # control: an empty events cluster (well under a MiB of 64) raises no quota alert
        assert all(ratio < monitoring.ETCD_QUOTA_WARNING for ratio in before.values()), before
        time.sleep(3)  # three more evaluations
        assert quota_alerts(port) == []

        # fill the events cluster until etcd refuses (NOSPACE), bounded
        kv = Kv(events.endpoints[0], (events.tls.ca, events.tls.cert, events.tls.key), timeout_s=10)
        refused = None
        puts = 0
        try:
            for puts in range(1, MAX_PUTS + 1):
                try:
                    kv.put(f"/registry/events/default/fill-{puts}", bytes(VALUE))
                except KvError as error:
                    refused = str(error)
                    break
        finally:
            kv.close()
        assert refused is not None and "database space exceeded" in refused, (puts, refused)
        assert any("NOSPACE" in alarm for alarm in etcd.alarms(events.endpoints, events.tls))

        # the alert fires, for the events members only
        def firing() -> list[dict[str, Any]]:
            alerts = [a for a in quota_alerts(port) if a["state"] == "firing"]
            near = {(a["labels"]["instance"], a["labels"]["severity"]) for a in alerts
                    if a["labels"]["alertname"] == "KilonodeEtcdDatabaseNearQuota"}
            wanted = {(i, s) for i in events_instances for s in ("warning", "critical")}
            nospace = [a for a in alerts if a["labels"]["alertname"] == "KilonodeEtcdNoSpace"]
            return alerts if wanted <= near and nospace else []

        alerts = wait_for("KilonodeEtcdDatabaseNearQuota for every events member and KilonodeEtcdNoSpace",
                          ALERT_TIMEOUT_S, firing)
        assert {a["labels"]["cluster_role"] for a in alerts} == {"events"}, alerts
        # the alarm is the cluster's: one NoSpace alert, for the events cluster, whichever member crossed
        [nospace] = [a for a in alerts if a["labels"]["alertname"] == "KilonodeEtcdNoSpace"]
        assert "instance" not in nospace["labels"], nospace
        after = ratios()
        assert all(after[i] > monitoring.ETCD_QUOTA_CRITICAL for i in events_instances), after
        print(f"NOSPACE after {puts} puts of {VALUE} B; events ratios {sorted(after[i] for i in events_instances)}; "
              f"firing: {sorted({(a['labels']['alertname'], a['labels']['severity']) for a in alerts})}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
        log.close()
