"""The twenty-first independent trace of `kilonode diff` on research-7500: Docker's log driver moved
off json-file (kilonode.review.runtime_logs, `container-logs-lost`), each boundary on the shipped
stack changed in memory (tests.review.snapshots), with harmless variants beside it that must stay
quiet."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULE = "container-logs-lost"
DAEMON_FILES = ("etc/docker/daemon.json", "etc/docker/daemon-nvidia.json")


def _risks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, snapshot(STACK), head), {})


def _rules(head: dict[str, Any], rule: str) -> list[Any]:
    return [r for r in _risks(head) if r.rule == rule]


def _edit(head: dict[str, Any], pool: str, change: Any) -> list[str]:
    """Apply `change` to every daemon config of the pool's hosts (its teams' included)."""
    edited = []
    for path in list(head["files"]):
        role, _, rest = path.partition("/")
        if role.split(".", 1)[0] == pool and rest in DAEMON_FILES:
            config = json.loads(head["files"][path])
            change(config)
            head["files"][path] = json.dumps(config, indent=2) + "\n"
            edited.append(path)
    assert edited, f"{pool} has no Docker daemon config in the snapshot"
    return edited


def _driver(name: str) -> Any:
    def change(config: dict[str, Any]) -> None:
        config["log-driver"] = name
    return change


def test_log_driver_local_is_high_and_names_the_pools() -> None:
    head = snapshot(STACK)
    _edit(head, "pool-a100-ib", _driver("local"))
    _edit(head, "pool-system", _driver("local"))
    found = _rules(head, RULE)
    assert [r.level for r in found] == ["high", "high"]
    said = " ".join(r.summary for r in found)
    assert "pool-a100-ib (5,000 nodes)" in said and "pool-system" in said
    assert "pool-a100-ib.team-language" in said  # a team's share of the pool, with its own count
    assert "kubectl logs" in said and "createContainerLogSymlink" in said and "StartLogger" in said
    assert "new and reimaged nodes" in said
    assert "dockerd fails" not in said  # local accepts max-size and max-file


def test_journald_keeping_kilonodes_log_opts_stops_docker() -> None:
    head = snapshot(STACK)
    _edit(head, "pool-monitoring", _driver("journald"))
    [found] = _rules(head, RULE)
    assert "journald" in found.summary and "max-file, max-size" in found.summary
    assert "dockerd fails at start" in found.summary


def test_driver_change_dropping_log_opts_says_so() -> None:
    head = snapshot(STACK)

    def change(config: dict[str, Any]) -> None:
        config["log-driver"] = "local"
        del config["log-opts"]
    _edit(head, "pool-system", change)
    [found] = _rules(head, RULE)
    assert "drops log-opts max-size, max-file" in found.summary


def test_log_opts_change_alone_stays_quiet() -> None:
    head = snapshot(STACK)

    def change(config: dict[str, Any]) -> None:
        config["log-opts"]["max-file"] = "5"
    _edit(head, "pool-a100-ib", change)
    assert not _rules(head, RULE)


def test_json_file_kept_or_spelled_out_stays_quiet() -> None:
    head = snapshot(STACK)
    _edit(head, "pool-h100-ib", _driver("json-file"))
    assert not _rules(head, RULE)
    head = snapshot(STACK)

    def change(config: dict[str, Any]) -> None:
        del config["log-driver"]  # absent is Docker's default, json-file
    _edit(head, "pool-h100-ib", change)
    assert not _rules(head, RULE)
