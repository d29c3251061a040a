"""The misjudgements a second independent trace of `kilonode diff` found on research-7500, each on the
stack's recorded snapshot changed by hand as the pull request changes it: scale sets a pool shrink
deletes, a NAT gateway's prefix resized, a team's shards moved under the node-identity policy, a
pool's room against what must run there, a metric the alerts read dropped by the scrape config, and
the kube-proxy rollout of a patch bump."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from kilonode.paths import REPO_ROOT
from kilonode.review import alerting, lifecycle, nodes
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _edit_plan(entry: dict[str, Any], pool: str, **changes: Any) -> dict[str, Any]:
    plan = yaml.safe_load(entry["files"]["plan.yaml"])
    [found] = [p for p in plan["nodePools"] if p["name"] == pool]
    found.update(changes)
    entry["files"]["plan.yaml"] = yaml.safe_dump(plan)
    return plan


# --- 1. scale sets a shrink deletes ----------------------------------------------------------------------------------


def test_a_shrink_that_deletes_scale_sets_is_high_and_says_to_cordon_and_drain_first() -> None:
    # a100-ib 5,000 -> 4,000: the shared scale sets 040-049 go (a fifth of the pool: no pool-shrink line)
    head = snapshot(STACK)
    gone = {f"{STACK}-a100-ib-0{i}" for i in range(40, 50)}
    head["resources"] = [r for r in head["resources"] if r["name"] not in gone]
    found = risks(head)
    [deleted] = rule(found, "nodes-deleted")
    assert deleted.level == HIGH and set(deleted.subjects) == gone
    assert deleted.summary.startswith("pool a100-ib: 10 scale set(s) deleted (a100-ib-040, ")
    assert "1,000 node(s)" in deleted.summary and "no cordon and no drain" in deleted.summary
    assert "every gang with a pod there fails as a whole" in deleted.summary
    assert "`kubectl cordon`" in deleted.summary and "`kubectl drain" in deleted.summary
    assert not rule(found, "pool-shrink")


def test_an_unchanged_stack_deletes_nothing() -> None:
    assert nodes.assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []


# --- 2. the NAT gateway's prefix resized -----------------------------------------------------------------------------


def test_a_nat_prefix_resized_names_both_outcomes() -> None:
    head = snapshot(STACK)
    [prefix] = [r for r in head["resources"] if r["name"] == f"{STACK}-network-pool-a100-ib-nat-ips"]
    prefix["inputs"]["prefixLength"] = prefix["inputs"]["prefixLength"] + 1
    [resized] = rule(risks(head), "nat-prefix-resized")
    assert resized.level == HIGH and "/28 -> /29 (16 -> 8 addresses)" in resized.summary
    assert "`pulumi up` stops there" in resized.summary and "outbound addresses" in resized.summary
    assert "allow-list" in resized.summary


def test_the_prefix_length_row_is_in_the_effects_table_unverified() -> None:
    assert REPO_ROOT is not None
    rows = tomllib.loads((REPO_ROOT / "infra/kilonode/catalog/effects.toml").read_text())["effect"]
    [row] = [r for r in rows if r["type"] == nodes.PUBLIC_IP_PREFIX and r["path"] == "prefixLength"]
    assert row["unverified"] and "publicIpPrefix.json" in row["source"] and "learn.microsoft.com" in row["source"]


# --- 3. a team's shards moved under the node-identity policy --------------------------------------------------------


def _vision_moved() -> dict[str, Any]:
    """teams[vision].firstShard 30 -> 40: 030-039 become shared, 040-049 vision's."""
    head = snapshot(STACK)
    plan = yaml.safe_load(head["files"]["plan.yaml"])
    [pool] = [p for p in plan["nodePools"] if p["name"] == "a100-ib"]
    for shard in pool["shards"]:
        if 30 <= shard["index"] < 40:
            shard["team"] = None
        elif 40 <= shard["index"] < 50:
            shard["team"] = "vision"
    head["files"]["plan.yaml"] = yaml.safe_dump(plan)
    return head


def test_the_rendered_policy_denies_and_checks_the_team_label() -> None:
    assert nodes.identity_policy_denies(snapshot(STACK))


def test_a_team_move_is_high_and_says_to_relabel_with_an_admin_credential() -> None:
    found = risks(_vision_moved())
    assert not rule(found, "labels-until-reimaged"), "the old advice (label just before the upgrade) is wrong here"
    moved = rule(found, "node-identity-denied")
    assert [m.level for m in moved] == [HIGH, HIGH]
    [to_vision] = [m for m in moved if "team (shared) -> vision" in m.summary]
    assert to_vision.subjects[0] == f"{STACK}-a100-ib-040" and len(to_vision.subjects) == 10
    assert "kilonode-node-identity admission policy (failurePolicy Fail, Deny" in to_vision.summary
    assert "every write these nodes' own identities make to their Node is denied" in to_vision.summary
    assert "do not go NotReady for it" in to_vision.summary and "Lease" in to_vision.summary
    assert "with an administrator's credential" in to_vision.summary
    assert "kilonode.io/team=vision --overwrite" in to_vision.summary
    [to_shared] = [m for m in moved if "team vision -> (shared)" in m.summary]
    assert "`kubectl label node <name> kilonode.io/team-`" in to_shared.summary


def test_without_the_policy_a_team_move_stays_labels_until_reimaged() -> None:
    head = _vision_moved()
    head["files"].pop(lifecycle.CAPACITY_FILE)
    found = risks(head)
    assert not rule(found, "node-identity-denied") and rule(found, "labels-until-reimaged")


# --- 4. what must run on a pool against its room --------------------------------------------------------------------


def test_a_system_pool_too_small_for_its_controllers_is_medium() -> None:
    head = snapshot(STACK)
    _edit_plan(head, "system", vmSize="Standard_D2ds_v5", vcpus=2, memoryGib=8.0)
    [room] = [r for r in rule(risks(head), "pool-capacity") if "nowhere else" in r.summary]
    assert room.level == MEDIUM and room.subjects == ("pool-system",)
    assert room.summary.startswith("pool-system (3 x Standard_D2ds_v5): what must run there and nowhere else")
    # what must run there grows with the stack (the disk CSI controller joined): over 80% of 2 vCPUs x 3 either way
    found = re.search(r"asks for CPU [\d.]+ of [\d.]+ cores \((\d+)%, was (\d+)%\)", room.summary)
    assert found and int(found[1]) > 80 and int(found[2]) < 20, room.summary
    assert "Deployment kube-system/cloud-controller-manager x2" in room.summary


def test_an_unchanged_system_pool_says_nothing_of_capacity() -> None:
    assert not rule(risks(snapshot(STACK)), "pool-capacity")


# --- 5. a metric the alerts read dropped by the scrape config -------------------------------------------------------


def test_metric_names_skip_functions_labels_ranges_and_grouping() -> None:
    names = alerting.metric_names(
        'sum by (code) (rate(apiserver_request_total{job="kilonode-apiserver",verb!~"WATCH|CONNECT"}[5m])) '
        '/ on (instance) group_left max(up) > 1e3 and absent(kube_node_info offset 5m)')
    assert names == {"apiserver_request_total": {"kilonode-apiserver"}, "up": {""}, "kube_node_info": {""}}


def test_dropping_a_metric_the_alerts_read_is_high() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == CONFIG_MAP:
            data = r["inputs"].get("data") or {}
            for key, text in data.items():
                data[key] = text.replace("etcd_request_duration_seconds_bucket",
                                         "etcd_request_duration_seconds_bucket|apiserver_request_total")
    assert alerting.dropped_reads(snapshot(STACK)) == {}
    [dropped] = rule(risks(head), "metric-dropped")
    assert dropped.level == HIGH
    assert dropped.summary.startswith("apiserver_request_total is dropped before ingestion by the "
                                      "metric_relabel_configs of kilonode-apiserver")
    # through the recording rule kilonode:apiserver_requests:rate5m
    assert dropped.subjects == ("KilonodeApiserverErrors", "KilonodeApiserverThrottling")


# --- 6. a kubernetesVersion patch bump's kube-proxy rollout ---------------------------------------------------------


def test_a_kube_proxy_image_bump_names_the_rollout_over_every_node() -> None:
    head = snapshot(STACK)
    [container] = pod_spec(head, "DaemonSet", "kube-proxy")["containers"]
    container["image"] = container["image"].replace("v1.34.2", "v1.34.3")
    [rollout] = rule(risks(head), "daemonset-rollout")
    assert rollout.level == MEDIUM
    assert "DaemonSet kube-proxy: image registry.k8s.io/kube-proxy:v1.34.2 -> registry.k8s.io/kube-proxy:v1.34.3" \
        in rollout.summary
    assert "every node it runs on (7,504 nodes: a100-ib " in rollout.summary and "7,504 pulls" in rollout.summary
    assert "not preloaded: registry.k8s.io/kube-proxy:v1.34.3" not in rollout.summary  # the base's list names v1.34.2
