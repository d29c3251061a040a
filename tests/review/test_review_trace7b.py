"""The misjudgements a seventh independent trace of `kilonode diff` found on research-7500 (part b), each on the
stack's recorded snapshot changed by hand as the pull request changes it: the cluster autoscaler's GPU
scale-down threshold raised, CoreDNS's memory limit cut below its estimate, and AlwaysPullImages added to the
apiservers' admission plugins."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kilonode.review import apiserver_flags, autoscaler, coredns
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
UNIT = "etc/systemd/system/kube-apiserver.service"
SHIPPED_PLUGINS = "NodeRestriction,DenyServiceExternalIPs"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def test_an_unchanged_stack_says_none_of_the_new_rules() -> None:
    found = risks(snapshot(STACK))
    for name in ("autoscaler-scale-down-raised", "coredns-memory-short", "admission-plugins-changed"):
        assert not rule(found, name)


# --- 1. the cluster autoscaler's scale-down flags ------------------------------------------------------------------


def _autoscaler_args(entry: dict[str, Any], **flags: str) -> None:
    container = pod_spec(entry, "Deployment", "cluster-autoscaler")["containers"][0]
    args = [a for a in container["args"] if a.split("=", 1)[0][2:] not in flags]
    container["args"] = args + [f"--{k}={v}" for k, v in flags.items()]


def test_the_gpu_threshold_raised_to_half_drains_h100_ib_nodes_and_their_gangs() -> None:
    head = snapshot(STACK)
    _autoscaler_args(head, **{"scale-down-gpu-utilization-threshold": "0.5"})
    [raised] = rule(risks(head), "autoscaler-scale-down-raised")
    assert raised.level == HIGH and raised.subjects == ("pool h100-ib",)
    assert "--scale-down-gpu-utilization-threshold 1e-06 -> 0.5" in raised.summary
    assert "pool h100-ib: up to 1,250 of its 2,500 nodes (down to its floor of 1,250)" in raised.summary
    # the pinned releases keep a node only above the threshold (eligibility.go isNodeAtOrBelowUtilizationThreshold)
    assert "4 or fewer of its 8 GPUs requested" in raised.summary
    assert "after --scale-down-unneeded-time (30m)" in raised.summary.lower()
    assert "gang pod evicted stops its whole job" in raised.summary and "eligibility.go" in raised.summary


def test_the_flags_read_from_the_rendered_deployment() -> None:
    flags = autoscaler.flags(snapshot(STACK))
    assert flags is not None
    assert flags["scale-down-gpu-utilization-threshold"] == "0.000001" and flags["scale-down-unneeded-time"] == "30m"
    assert "nodes" not in flags  # the node groups are bounds, not scale-down flags


@pytest.mark.parametrize(("flags", "level"), [
    # at the shipped GPU threshold only GPU nodes with no GPU requested go: no gang pod is evicted
    # (independent trace 14, PR 05; tests/review/test_review_trace14.py), so medium
    ({"scale-down-unneeded-time": "5m"}, MEDIUM),
    ({"skip-nodes-with-local-storage": "true", "skip-nodes-with-system-pods": "false"}, MEDIUM),
    # pods below the cutoff are left out of the autoscaler's snapshot: their node looks empty
    ({"expendable-pods-priority-cutoff": "100"}, HIGH),
])
def test_other_moves_that_make_gpu_nodes_removable(flags: dict[str, str], level: str) -> None:
    head = snapshot(STACK)
    _autoscaler_args(head, **flags)
    [raised] = autoscaler.assess(compare_stack(STACK, snapshot(STACK), head))
    assert raised.level == level and raised.subjects == ("pool h100-ib",)


@pytest.mark.parametrize("flags", [
    {"scale-down-unneeded-time": "1h"},  # longer: fewer removals
    {"scale-down-enabled": "false"},
    {"expendable-pods-priority-cutoff": "-100"},
    {"scale-down-utilization-threshold": "0.5"},  # no autoscaled pool without GPUs on research-7500
])
def test_moves_that_remove_no_more_gpu_nodes_say_nothing(flags: dict[str, str]) -> None:
    head = snapshot(STACK)
    _autoscaler_args(head, **flags)
    assert autoscaler.assess(compare_stack(STACK, snapshot(STACK), head)) == []


@pytest.mark.parametrize(("text", "expected"), [("30m", 1800.0), ("1h30m", 5400.0), ("90s", 90.0), ("x", None)])
def test_go_durations(text: str, expected: float | None) -> None:
    assert autoscaler.seconds(text) == expected


# --- 2. CoreDNS's memory limit ----------------------------------------------------------------------------------------


def _coredns_limit(entry: dict[str, Any], limit: str) -> None:
    pod_spec(entry, "Deployment", "coredns")["containers"][0]["resources"]["limits"]["memory"] = limit


def test_80mi_is_below_the_default_settings_estimate_and_the_change_rolls_every_replica() -> None:
    head = snapshot(STACK)
    _coredns_limit(head, "80Mi")
    [short] = rule(risks(head), "coredns-memory-short")
    assert short.level == HIGH and short.subjects == ("Deployment kube-system/coredns",)
    assert "from 170Mi to 80Mi (84 MB)" in short.summary
    found = re.search(r"\(([\d,]+) \+ (\d+)\) / 1000 \+ 54, the default settings' formula[^=]*= (\d+) MB per replica",
                      short.summary)
    assert found and int(found[1].replace(",", "")) > 50_000
    assert int(found[3]) == round((int(found[1].replace(",", "")) + int(found[2])) / 1000 + 54)
    assert "`pods insecure`" in short.summary and "Scaling_CoreDNS.md" in short.summary
    assert "rolls all 31 replicas as a Deployment rollout (maxUnavailable 1, maxSurge 0)" in short.summary
    assert re.search(r"at or above \d+Mi", short.summary)


def test_a_limit_above_the_estimate_or_one_already_short_says_nothing() -> None:
    head = snapshot(STACK)
    _coredns_limit(head, "120Mi")
    assert coredns.memory_short(compare_stack(STACK, snapshot(STACK), head)) == []
    base = snapshot(STACK)
    _coredns_limit(base, "85Mi")
    head = snapshot(STACK)
    _coredns_limit(head, "80Mi")
    assert coredns.memory_short(compare_stack(STACK, base, head)) == []


def test_the_formula_follows_the_corefile() -> None:
    assert coredns.estimate_for("kubernetes cluster.local {\n  pods insecure\n}", 1000, 0)[0] == 55
    assert coredns.estimate_for("kubernetes cluster.local {\n  pods verified\n}", 1000, 0)[0] == 60


# --- 3. the apiservers' admission plugins ----------------------------------------------------------------------------


def _plugins(entry: dict[str, Any], enabled: str, disabled: str = "") -> None:
    for path in [p for p in entry["files"] if p.endswith(UNIT)]:
        text = entry["files"][path].replace(f"--enable-admission-plugins={SHIPPED_PLUGINS}",
                                            f"--enable-admission-plugins={enabled}")
        if disabled:
            text = text.replace(f"--enable-admission-plugins={enabled}",
                                f"--enable-admission-plugins={enabled} --disable-admission-plugins={disabled}")
        entry["files"][path] = text


def test_always_pull_images_added_names_the_registry_dependency() -> None:
    head = snapshot(STACK)
    _plugins(head, f"{SHIPPED_PLUGINS},AlwaysPullImages")
    [changed] = rule(risks(head), "admission-plugins-changed")
    assert changed.level == MEDIUM and len(changed.subjects) == 5
    assert "AlwaysPullImages added" in changed.summary and "asks the registry" in changed.summary
    assert "the field notes' registry lesson undone" in changed.summary
    assert "the pause image, preloaded, is the sandbox's" in changed.summary
    assert "alwayspullimages/admission.go" in changed.summary


def test_always_pull_images_is_high_where_a_pool_preloads_an_image_a_pod_runs() -> None:
    """A bootImageArchives entry lands in the pools' preloadImages: the first pool's, here, by hand."""
    base, head = snapshot(STACK), snapshot(STACK)
    kept = "    imageId: null\n  bootImagesNotPreloaded:\n"
    for entry in (base, head):
        assert kept in entry["files"]["plan.yaml"]
        entry["files"]["plan.yaml"] = entry["files"]["plan.yaml"].replace(kept, (
            "    imageId: null\n  - image: registry.k8s.io/kube-proxy:v1.34.2\n    source: archive\n"
            "    archive: kp.tar\n    bakedPath: /opt/kilonode/preload/kp.tar\n    imageId: sha256:0\n"
            "  bootImagesNotPreloaded:\n"), 1)
    _plugins(head, f"{SHIPPED_PLUGINS},AlwaysPullImages")
    [changed] = apiserver_flags.assess(compare_stack(STACK, base, head))
    assert changed.level == HIGH and "a100-ib: registry.k8s.io/kube-proxy:v1.34.2" in changed.summary
    assert "stop mattering" in changed.summary


def test_a_relied_on_plugin_removed_or_disabled_is_high() -> None:
    head = snapshot(STACK)
    _plugins(head, "DenyServiceExternalIPs")
    [changed] = apiserver_flags.assess(compare_stack(STACK, snapshot(STACK), head))
    assert changed.level == HIGH and "NodeRestriction removed" in changed.summary
    assert "kilonode relies on it" in changed.summary
    head = snapshot(STACK)
    _plugins(head, SHIPPED_PLUGINS, disabled="PodSecurity")
    [changed] = apiserver_flags.assess(compare_stack(STACK, snapshot(STACK), head))
    assert changed.level == HIGH and "PodSecurity removed" in changed.summary


def test_the_plugins_read_from_the_rendered_units() -> None:
    found = apiserver_flags.plugins(snapshot(STACK)["files"])
    assert sorted(found) == [f"apiserver-{i}" for i in range(5)]
    assert found["apiserver-0"] == (frozenset({"NodeRestriction", "DenyServiceExternalIPs"}), frozenset())
