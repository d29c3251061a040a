"""controlPlaneEmulatedVersion: --emulated-version (KEP-4330) on the control-plane programs while a
minor upgrade's binaries move first, and `kilonode upgrade`'s steps that set it and raise it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kilonode.config.load import stack_from_value
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.render.control_plane import render_apiserver
from kilonode.rollout.minor import DELETE, apply, plan_upgrade
from tests.conftest import shipped_cluster_value

STACK = "research-7500"


def _cluster(version: str = "1.35.4", emulated: str | None = "1.34", pin: str | None = "1.34.2") -> dict:
    cluster = copy.deepcopy(shipped_cluster_value(STACK))
    cluster["kubernetesVersion"] = version
    if emulated is not None:
        cluster["controlPlaneEmulatedVersion"] = emulated
    for pool in cluster["nodePools"]:
        if pin is not None:
            pool["kubernetesVersion"] = pin
    return cluster


def _load(cluster: dict):  # type: ignore[no-untyped-def]
    return stack_from_value(STACK, cluster, Path(f"stacks/Pulumi.{STACK}.yaml"))


def test_the_minor_below_with_every_pool_pinned_loads() -> None:
    assert _load(_cluster()).config.control_plane_emulated_version == "1.34"


@pytest.mark.parametrize("emulated", ["1.33", "1.35", "1.32", "1.34.0", "1.34.2", "v1.34", "kube=1.34"])
def test_only_the_one_minor_below_as_major_minor_is_taken(emulated: str) -> None:
    with pytest.raises(StackError, match="controlPlaneEmulatedVersion"):
        _load(_cluster(emulated=emulated))


def test_not_without_the_minor_above() -> None:
    """At 1.34 (no upgrade under way) 1.33 would be the minor below, but 1.34 is refused: equal to the
    binary is no emulation, and kilonode sets it only in an upgrade's binaries-first step."""
    with pytest.raises(StackError, match="controlPlaneEmulatedVersion"):
        _load(_cluster(version="1.34.2", emulated="1.34", pin=None))


def test_a_pool_newer_than_the_emulated_version_is_refused() -> None:
    """KEP-4330 "Skew": a kubelet must not be newer than the apiservers' emulated version."""
    cluster = _cluster()
    del cluster["nodePools"][0]["kubernetesVersion"]  # that pool would run 1.35.4
    with pytest.raises(StackError, match=r"not pinned at 1\.34"):
        _load(cluster)


def test_unset_it_is_not_written_and_nothing_changes() -> None:
    stack = _load(copy.deepcopy(shipped_cluster_value(STACK)))
    assert "controlPlaneEmulatedVersion" not in stack.config.model_dump(by_alias=True)
    plan = plan_stack(stack)
    assert "controlPlaneEmulatedVersion" not in plan.model_dump(by_alias=True)
    files = render_apiserver(plan, plan.control_plane.instances[0])
    assert not any("emulated-version" in f.content for f in files.values() if isinstance(f.content, str))


def test_set_it_renders_the_flag_on_the_three_control_plane_programs() -> None:
    plan = plan_stack(_load(_cluster()))
    files = render_apiserver(plan, plan.control_plane.instances[0])
    for unit in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        text = files[f"etc/systemd/system/{unit}.service"].content
        assert "--emulated-version=1.34" in text, unit
    assert plan.kubernetes_version == "1.35.4"  # the binaries: the new minor


def test_set_it_keeps_the_in_cluster_components_at_the_pools_version() -> None:
    emulating = plan_stack(_load(_cluster()))
    before = plan_stack(_load(_cluster(version="1.34.2", emulated=None, pin=None)))
    assert emulating.components.kube_proxy_image == before.components.kube_proxy_image
    assert emulating.components.cloud_controller_manager_image == before.components.cloud_controller_manager_image
    assert emulating.kubernetes_minor == 34


def test_the_plan_sets_it_with_the_binaries_and_raises_it_before_the_pools() -> None:
    config = _load(copy.deepcopy(shipped_cluster_value(STACK))).config
    plan = plan_upgrade(config, STACK, "1.35.4")
    names = [s.name for s in plan.steps]
    edits = {s.name: {e.path: e.value for e in s.edits} for s in plan.steps}
    assert edits["control-plane"][("controlPlaneEmulatedVersion",)] == "1.34"
    assert edits["control-plane"][("kubernetesVersion",)] == "1.35.4"
    raise_at = names.index("raise-emulated-version")
    assert edits["raise-emulated-version"][("controlPlaneEmulatedVersion",)] is DELETE
    assert edits["raise-emulated-version"][("acknowledgeRestart",)] == ["apiservers"]
    assert "point of no return" in plan.steps[raise_at].title
    assert names.index("control-plane") < names.index("control-plane-done") < raise_at
    assert raise_at < min(i for i, n in enumerate(names) if n.startswith("pool-"))
    assert names[-1] == "cleanup"
    assert any("--emulated-version=1.34" in note and "point of no return" in note for note in plan.notes)


def test_every_step_loads_and_only_the_soak_steps_emulate() -> None:
    raw = copy.deepcopy(shipped_cluster_value(STACK))
    plan = plan_upgrade(_load(copy.deepcopy(raw)).config, STACK, "1.35.4")
    emulating = []
    for step in plan.steps:
        apply(raw, step.edits)
        if _load(copy.deepcopy(raw)).config.control_plane_emulated_version is not None:
            emulating.append(step.name)
    assert emulating == ["control-plane", "control-plane-done"]


def test_from_the_emulating_stack_the_plan_goes_on_and_the_snapshot_comes_right_before_the_raise() -> None:
    """The stack after control-plane (binaries 1.35.4, emulating 1.34) is an upgrade under way: the
    plan goes on from it. The way back after the raise is a snapshot taken right before it, kept
    outside the backup account's 7-day lifecycle rule (kilonode.azure.backup), not step 1's."""
    config = _load(_cluster() | {"controlPlaneImage": {"version": "1.1.0", "previous": "1.0.0"}}).config
    plan = plan_upgrade(config, STACK, "1.35.4")
    assert [s.name for s in plan.steps if s.done] == ["pin-pools", "control-plane", "control-plane-done"]
    assert plan.start == "1.34.2"
    raise_step = next(s for s in plan.steps if s.name == "raise-emulated-version")
    assert "fresh etcd snapshot" in raise_step.then[0]
    assert "systemctl start kilonode-etcd-snapshot.service" in raise_step.then[0]
    assert "lifecycle rule deletes a blob 7 days" in raise_step.then[0]
    note = " ".join(plan.notes)
    assert "snapshot taken immediately before raise-emulated-version" in note and "loses every write" in note


def test_the_way_back_before_the_raise_loads() -> None:
    """The control-plane step undone as the note says: 1.34.2, no emulation, the old image with the
    new one kept published while the apiservers move back, acknowledgeRestart [apiservers]."""
    cluster = _cluster(version="1.34.2", emulated=None) | {
        "controlPlaneImage": {"version": "1.0.0", "previous": "1.1.0"}, "acknowledgeRestart": ["apiservers"]}
    config = _load(cluster).config
    assert config.kubernetes_version == "1.34.2" and config.control_plane_image.previous == "1.1.0"
