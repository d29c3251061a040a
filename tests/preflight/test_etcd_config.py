"""etcd-config: the shipped stacks' etcd units pass etcd's start-up validation; the trace 12a flags
(heartbeat 300 ms, election timeout 1000 ms: under 5 x) and the other rules of etcd's Config.Validate
are breaks, on each member whose unit carries them."""

from __future__ import annotations

from kilonode.preflight import run
from kilonode.preflight.checks.etcd_config import problems, unit_flags
from tests.preflight.conftest import artefacts, inputs_of

CHECK = "etcd-config"
UNIT = "etc/systemd/system/etcd.service"


def found(files: dict[str, str] | None = None, stack: str = "local") -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, files=files), [CHECK])]


def with_flags(files: dict[str, str], hosts_prefix: str, extra: str) -> dict[str, str]:
    """The render with `extra` flags added to the etcd command line of the hosts named so."""
    for path in [p for p in files if p.startswith(hosts_prefix) and p.endswith(UNIT)]:
        files[path] = files[path].replace("--name=", f"{extra} \\\n    --name=", 1)
    return files


def test_the_shipped_stacks_etcd_flags_pass(shipped: str) -> None:
    assert found(stack=shipped) == []


def test_the_shipped_unit_reads_as_etcd_reads_it() -> None:
    files, _ = artefacts("local")
    flags = unit_flags(files[f"etcd-main-0/{UNIT}"])
    assert flags["name"] == "etcd-main-0" and flags["auto-compaction-mode"] == "periodic"
    assert problems(flags) == []


def test_the_trace_flags_stop_every_member_that_carries_them() -> None:
    files, _ = artefacts("local")
    findings = found(with_flags(files, "etcd-main-", "--heartbeat-interval=300 --election-timeout=1000"))
    assert {(level, where) for level, where, _ in findings} == {
        ("break", "etcd-main-0"), ("break", "etcd-main-1"), ("break", "etcd-main-2")}
    assert all("--election-timeout[1000ms] should be at least as 5 times as --heartbeat-interval[300ms]" in what
               for _, _, what in findings)


def test_a_heartbeat_alone_is_judged_against_the_default_election_timeout() -> None:
    assert problems({"heartbeat-interval": "250"}) == [
        "--election-timeout[1000ms] should be at least as 5 times as --heartbeat-interval[250ms]"]
    assert problems({"heartbeat-interval": "200"}) == []


def test_the_other_validate_rules() -> None:
    assert problems({"election-timeout": "60000", "heartbeat-interval": "10000"}) == [
        "--election-timeout[60000ms] is too long, and should be set less than 50000ms"]
    assert problems({"election-timeout": "50000", "heartbeat-interval": "500"}) == []
    assert problems({"heartbeat-interval": "0"}) == ["--heartbeat-interval must be >0 (set to 0ms)"]
    assert "no whole number" in problems({"election-timeout": "1s"})[0]
    assert problems({"auto-compaction-mode": "hourly"}) == ["unknown auto-compaction-mode 'hourly'"]


def test_the_events_cluster_is_read_too() -> None:
    files, _ = artefacts("local")
    findings = found(with_flags(files, "etcd-events-0/", "--election-timeout=60000"))
    assert [(level, where) for level, where, _ in findings] == [("break", "etcd-events-0")]
