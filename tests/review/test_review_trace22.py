"""The twenty-second independent trace of `kilonode diff` on research-7500: P07 (a per-node label added to
Alertmanager's group_by) and P02 (Docker's live-restore turned off), each on the shipped stack changed in memory,
with a harmless variant beside it that must stay quiet."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def _rules(head: dict[str, Any], rule: str) -> list[Any]:
    from kilonode.review import risks
    return [r for r in risks.assess(compare_stack(STACK, snapshot(STACK), head), {}) if r.rule == rule]


def _group_by(labels: list[str]) -> dict[str, Any]:
    head = snapshot(STACK)
    [(inputs, key)] = [(r["inputs"], k) for r in head["resources"] if r["type"] == CONFIG_MAP
                       for k, v in (r["inputs"].get("data") or {}).items()
                       if isinstance(v, str) and "receivers:" in v and "route:" in v]
    config = yaml.safe_load(inputs["data"][key])
    config["route"]["group_by"] = labels
    inputs["data"][key] = yaml.safe_dump(config, sort_keys=False)
    return head


def test_a_node_label_in_group_by_re_pages_and_floods() -> None:
    [line] = _rules(_group_by(["cluster", "alertname", "node"]), "alert-grouping-split")
    assert line.level == "high" and "added node" in line.summary
    assert "never resolved" in line.summary and "one notification per node" in line.summary


def test_a_label_that_names_no_thing_is_medium_and_the_same_grouping_is_quiet() -> None:
    [line] = _rules(_group_by(["cluster", "alertname", "severity"]), "alert-grouping-split")
    assert line.level == "medium"
    assert _rules(_group_by(["cluster", "alertname"]), "alert-grouping-split") == []


def _live_restore(head: dict[str, Any], value: bool | None) -> None:
    for path in [p for p in head["files"] if p.endswith(("etc/docker/daemon.json", "etc/docker/daemon-nvidia.json"))
                 and p.startswith("pool-h100-ib")]:
        config = json.loads(head["files"][path])
        if value is None:
            config.pop("live-restore", None)
        else:
            config["live-restore"] = value
        head["files"][path] = json.dumps(config, indent=2)


def test_live_restore_off_says_a_dockerd_restart_kills_the_gangs() -> None:
    head = snapshot(STACK)
    _live_restore(head, False)
    [line] = _rules(head, "live-restore-off")
    assert line.level == "medium" and "pool-h100-ib (2,500 nodes)" in line.summary
    assert "stops every container" in line.summary and "new or reimaged" in line.summary
    head = snapshot(STACK)
    _live_restore(head, None)  # absent is Docker's default, off
    assert _rules(head, "live-restore-off")


def test_live_restore_kept_is_quiet() -> None:
    head = snapshot(STACK)
    _live_restore(head, True)
    assert _rules(head, "live-restore-off") == []
