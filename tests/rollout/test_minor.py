"""A Kubernetes minor upgrade as stack changes (kilonode.rollout.minor, `kilonode upgrade`):
the order the version skew policy gives, every step's stack loading, one step applied to the
stack file with its comments kept."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.config.load import stack_from_value
from kilonode.paths import REPO_ROOT
from kilonode.rollout.minor import DELETE, apply, plan_upgrade, refusal
from tests.conftest import shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _config(**changes: object):  # type: ignore[no-untyped-def]
    cluster = shipped_cluster_value(STACK) | changes
    return stack_from_value(STACK, cluster, Path(f"stacks/Pulumi.{STACK}.yaml")).config


def test_the_steps_move_the_control_plane_first_then_each_pool_the_canary_first() -> None:
    plan = plan_upgrade(_config(), STACK, "1.35.4", canary="h100-ib")
    names = [s.name for s in plan.steps]
    assert names == ["pin-pools", "control-plane", "control-plane-done", "raise-emulated-version", "raise-done",
                     "pool-h100-ib", "pool-a100-ib", "pool-monitoring", "pool-system", "cleanup"]
    control = plan.steps[1]
    assert {e.path: e.value for e in control.edits}[("kubernetesVersion",)] == "1.35.4"
    assert {e.path: e.value for e in control.edits}[("controlPlaneImage", "previous")] == "1.0.0"
    canary = plan.steps[5]
    assert {e.path: e.value for e in canary.edits}[("nodeImage", "pools", "h100-ib")] == {
        "version": "1.1.0", "previous": "1.0.0"}
    assert any("kilonode rollout start research-7500 --pool h100-ib --journal .kilonode/rollout/research-7500-h100-ib"
               in c for c in canary.then)
    assert any("--prometheus" in c for c in plan.steps[7].then)  # the pool that runs Prometheus


def test_every_step_stack_loads_within_the_skew_policy_and_the_last_is_the_new_version() -> None:
    raw = copy.deepcopy(shipped_cluster_value(STACK))
    plan = plan_upgrade(_config(), STACK, "1.35.4")
    for step in plan.steps:
        apply(raw, step.edits)
        config = stack_from_value(STACK, copy.deepcopy(raw), Path("x.yaml")).config
        for pool in config.node_pools:
            version = pool.kubernetes_version or config.kubernetes_version
            assert version <= config.kubernetes_version  # a kubelet never newer than the apiservers
    assert config.kubernetes_version == "1.35.4" and all(p.kubernetes_version is None for p in config.node_pools)
    assert config.control_plane_image.previous is None and config.control_plane_image.version == "1.1.0"
    assert all(config.node_image.of_pool(p.name).version == "1.1.0" for p in config.node_pools)


@pytest.mark.parametrize("to,words", [
    ("1.36.0", "one minor at a time"), ("1.33.5", "not an upgrade"),
])
def test_what_cannot_be_planned_is_refused(to: str, words: str) -> None:
    assert words in str(refusal(_config(), to))


def test_an_unfinished_image_rollout_is_refused() -> None:
    cluster = shipped_cluster_value(STACK) | {"nodeImage": {"pools": {"h100-ib": {"version": "1.2.0",
                                                                                "previous": "1.1.0"}}}}
    config = stack_from_value(STACK, cluster, Path("x.yaml")).config
    assert "nodeImage.pools.h100-ib still keep a previous version" in str(refusal(config, "1.35.4"))


def test_an_unfinished_upgrade_is_refused() -> None:
    cluster = shipped_cluster_value(STACK)
    cluster["nodePools"][0] = cluster["nodePools"][0] | {"kubernetesVersion": "1.33.9"}
    config = stack_from_value(STACK, cluster, Path("x.yaml")).config
    assert "finish the last upgrade first" in str(refusal(config, "1.35.4"))


def test_a_delete_prunes_the_maps_it_empties() -> None:
    tree: dict[str, object] = {"nodeImage": {"pools": {"cpu": {"previous": "1.0.0"}}}}
    apply(tree, [type(plan_upgrade(_config(), STACK, "1.35.4").steps[0].edits[0])(
        ("nodeImage", "pools", "cpu", "previous"), DELETE)])
    assert tree == {}


def _stack_copy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
    stack_file = project / "stacks" / f"Pulumi.{STACK}.yaml"
    shutil.copy(REPO_ROOT / "stacks" / f"Pulumi.{STACK}.yaml", stack_file)
    return stack_file


def test_an_upgrade_to_versions_whose_contracts_were_not_read_prints_the_plan_and_applies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A contract (catalog/contracts.yaml) not read at the version a step runs it at: the step would
    break preflight and `pulumi up`'s gate refuse it. Seeded as the catalogue stood before the
    kubelet's and kube-proxy's contracts were read at 1.35.4 (both read at 1.34.2 only)."""
    from kilonode.catalog import contracts as catalogue

    read = dict(catalogue.contracts())
    for name in ("kubelet", "kubeProxy"):
        read[name] = read[name].model_copy(update={"also_read_at": []})
    monkeypatch.setattr("kilonode.preflight.checks.contracts.contracts", lambda: read)
    stack_file = _stack_copy(tmp_path)
    before = stack_file.read_text()
    done = CliRunner().invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", "pin-pools"])
    assert done.exit_code == 2 and stack_file.read_text() == before
    assert "1. Pin every pool at 1.34.2" in done.output
    assert "kubeProxy (read at v1.34.2, run at v1.35.4)" in done.output and "kubelet (read at" in done.output


def test_a_step_is_applied_to_the_stack_file_with_its_comments(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.preflight.checks import contracts

    monkeypatch.setattr(contracts, "unread", lambda plan: {})  # as if every contract were read at 1.35.4
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
    stack_file = project / "stacks" / f"Pulumi.{STACK}.yaml"
    shutil.copy(REPO_ROOT / "stacks" / f"Pulumi.{STACK}.yaml", stack_file)
    before = stack_file.read_text()
    runner = CliRunner()
    done = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", "pin-pools"])
    assert done.exit_code == 0, done.output
    after = stack_file.read_text()
    assert after.count("kubernetesVersion: 1.34.2") == 4
    # every comment line of the file is still there
    assert [line for line in before.splitlines() if line.strip().startswith("#")] == [
        line for line in after.splitlines() if line.strip().startswith("#")]
    written = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--out", str(tmp_path / "steps")])
    assert written.exit_code == 0, written.output
    # pin-pools is in the stack file already: the written steps start after it
    assert sorted(p.name for p in (tmp_path / "steps").iterdir())[:2] == ["02-control-plane.yaml",
                                                                          "03-control-plane-done.yaml"]
    refused = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", "nope"])
    assert refused.exit_code == 2 and "the steps are pin-pools, control-plane" in refused.output


STEPS = ["pin-pools", "control-plane", "control-plane-done", "raise-emulated-version", "raise-done",
         "pool-h100-ib", "pool-a100-ib", "pool-monitoring", "pool-system", "cleanup"]


def _rolled(stack_file: Path, done_but: str = "", only: str = "", pools: tuple[str, ...] = ()) -> None:
    """Each pool's rollout journal where the pool steps name it, at the pool's image version, every
    scale set of the pool done (but the last of `done_but`'s pool; `only`'s pool: its canary alone)."""
    from kilonode.config import load_stack
    from kilonode.plan import checked_plan
    from kilonode.rollout import journal as journals
    from kilonode.rollout.model import Journal, Policy, Progress

    plan = checked_plan(load_stack(str(stack_file)))
    for pool in (p for p in plan.node_pools if not pools or p.name in pools):
        order = tuple(s.name for s in pool.shards)[: 1 if pool.name == only else None]
        progress = {n: Progress(phase="done") for n in order}
        if pool.name == done_but:
            progress[order[-1]] = Progress(phase="gating")
        journals.save(Journal(STACK, f"{pool.name} image {plan.image_version_of(pool.name)}", Policy(order=order),
                              progress=progress),
                      stack_file.parent.parent / ".kilonode" / "rollout" / f"{STACK}-{pool.name}.json")


def _cluster_of(stack_file: Path) -> dict:
    import yaml

    return yaml.safe_load(stack_file.read_text())["config"]["kilonode:cluster"]


def test_every_step_applied_in_turn_with_step_on_the_stack_the_last_one_left(tmp_path: Path) -> None:
    """The trace's sequence: each `--step` on the stack file as the previous step left it (the
    control plane already at 1.35.4 from step 2 on is an upgrade under way, not a downgrade), each
    result valid, a step asked again changing nothing, and the end the plain 1.35.4 stack."""
    stack_file = _stack_copy(tmp_path)
    comments = [line for line in stack_file.read_text().splitlines() if line.strip().startswith("#")]
    runner = CliRunner()
    early = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", "control-plane"])
    assert early.exit_code == 2 and "step 1 (pin-pools) is not applied yet" in " ".join(early.output.split())
    for number, name in enumerate(STEPS, 1):
        if name == "pool-a100-ib":  # the canary pool (h100-ib) goes first and alone
            early = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
            assert early.exit_code == 2 and "the canary pool goes first" in " ".join(early.output.split())
            _rolled(stack_file, pools=("h100-ib",))
        if name == "cleanup":
            refused = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
            assert refused.exit_code == 2 and "no rollout journal" in " ".join(refused.output.split())
            _rolled(stack_file, done_but="h100-ib")
            half = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
            assert half.exit_code == 2 and "pool h100-ib: 1 of 25 scale sets not done" in " ".join(half.output.split())
            _rolled(stack_file, only="a100-ib")  # a canary-only (--only) rollout covers 1 of 50
            canary = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
            assert canary.exit_code == 2 and "49 of its 50 scale sets not in its rollout" in " ".join(
                canary.output.split())
            _rolled(stack_file)
        done = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
        assert done.exit_code == 0, (name, done.output)
        assert f"step {number} (" in done.output and "applied" in done.output, done.output
        valid = runner.invoke(app, ["validate", str(stack_file)])
        assert valid.exit_code == 0 and "valid" in valid.output, (name, valid.output)
        assert "reaches no pool" not in valid.output, (name, valid.output)
        before = stack_file.read_text()
        again = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", name])
        assert again.exit_code == 0 and "nothing changed" in " ".join(again.output.split()), (name, again.output)
        assert stack_file.read_text() == before
    cluster = _cluster_of(stack_file)
    assert cluster["kubernetesVersion"] == "1.35.4"
    assert all("kubernetesVersion" not in pool for pool in cluster["nodePools"])
    assert not {"controlPlaneEmulatedVersion", "acknowledgeRestart"} & set(cluster)
    assert cluster["nodeImage"] == {"version": "1.1.0"}  # the pools' entries folded back
    assert cluster["controlPlaneImage"] == {"version": "1.1.0"}
    shipped = shipped_cluster_value(STACK)
    assert {k: v for k, v in cluster.items() if k not in ("kubernetesVersion", "nodeImage", "controlPlaneImage")} \
        == {k: v for k, v in shipped.items() if k not in ("kubernetesVersion", "nodeImage", "controlPlaneImage")}
    assert [line for line in stack_file.read_text().splitlines() if line.strip().startswith("#")] == comments
    finished = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4"])
    assert finished.exit_code == 0 and "every step of the upgrade is applied" in finished.output


def _at(*names: str) -> dict:
    """research-7500's cluster value with these steps applied."""
    raw = copy.deepcopy(shipped_cluster_value(STACK))
    for name in names:
        config = stack_from_value(STACK, copy.deepcopy(raw), Path("x.yaml")).config
        plan = plan_upgrade(config, STACK, "1.35.4")
        apply(raw, next(s for s in plan.steps if s.name == name).edits)
    return raw


def _plan_at(*names: str):  # type: ignore[no-untyped-def]
    return plan_upgrade(stack_from_value(STACK, _at(*names), Path("x.yaml")).config, STACK, "1.35.4")


def test_the_stack_tells_which_steps_are_applied_and_the_values_the_upgrade_started_from() -> None:
    plan = _plan_at("pin-pools", "control-plane", "control-plane-done", "raise-emulated-version", "raise-done",
                    "pool-h100-ib")
    assert [s.name for s in plan.steps if s.done] == STEPS[:6]
    assert plan.start == "1.34.2" and plan.next is not None and plan.next.name == "pool-a100-ib"
    control = {e.path: e.value for e in plan.steps[1].edits}
    assert control[("controlPlaneImage", "version")] == "1.1.0"  # from previous, not 1.1.0 + one minor
    edits = {e.path: e.value for e in plan.steps[6].edits}  # a100-ib, not moved: from the stack-wide 1.0.0
    assert edits[("nodeImage", "pools", "a100-ib")] == {"version": "1.1.0", "previous": "1.0.0"}


@pytest.mark.parametrize("applied,step,words", [
    ((), "control-plane", "step 1 (pin-pools) is not applied yet"),
    (("pin-pools", "control-plane"), "raise-emulated-version", "step 3 (control-plane-done) is not applied yet"),
    (("pin-pools", "control-plane", "control-plane-done"), "pool-h100-ib", "step 4 (raise-emulated-version)"),
    (tuple(STEPS[:6]), "cleanup", "step 7 (pool-a100-ib) is not applied yet"),
])
def test_a_step_before_its_turn_is_refused(applied: tuple[str, ...], step: str, words: str) -> None:
    plan = _plan_at(*applied)
    chosen = next(s for s in plan.steps if s.name == step)
    first = plan.first_unapplied_before(chosen)
    assert first is not None and words.startswith(f"step {plan.steps.index(first) + 1} ({first.name})")


def test_the_pools_may_move_in_another_order_than_the_canary_first() -> None:
    plan = _plan_at(*STEPS[:5])
    assert plan.first_unapplied_before(next(s for s in plan.steps if s.name == "pool-system")) is None


def test_an_upgrade_under_way_names_its_version() -> None:
    config = stack_from_value(STACK, _at("pin-pools", "control-plane"), Path("x.yaml")).config
    assert refusal(config, "1.35.4") is None
    assert "give --to 1.35.4" in str(refusal(config, "1.35.5"))
    assert "one minor at a time" in str(refusal(config, "1.37.0"))


def test_an_unmoved_pool_with_its_own_image_rollout_waits() -> None:
    raw = _at(*STEPS[:5])
    raw["nodeImage"] = {"pools": {"system": {"version": "1.0.5", "previous": "1.0.0"}}}
    plan = plan_upgrade(stack_from_value(STACK, raw, Path("x.yaml")).config, STACK, "1.35.4")
    system = next(s for s in plan.steps if s.name == "pool-system")
    assert system.waits is not None and "nodeImage.pools.system keeps a previous version (1.0.0)" in system.waits
    assert {e.path: e.value for e in system.edits}[("nodeImage", "pools", "system")] == {
        "version": "1.1.0", "previous": "1.0.5"}


def test_a_pool_step_rolls_back_with_its_kubelet_and_its_image_together() -> None:
    raw = _at(*STEPS[:6])
    plan = plan_upgrade(stack_from_value(STACK, copy.deepcopy(raw), Path("x.yaml")).config, STACK, "1.35.4")
    canary = next(s for s in plan.steps if s.name == "pool-h100-ib")
    assert {e.path: e.value for e in canary.rollback} == {
        ("nodePools", 1, "kubernetesVersion"): "1.34.2",
        ("nodeImage", "pools", "h100-ib"): {"version": "1.0.0", "previous": "1.1.0"}}
    apply(raw, canary.rollback)
    config = stack_from_value(STACK, raw, Path("x.yaml")).config
    assert config.node_pools[1].kubernetes_version == "1.34.2"
    assert config.node_image.of_pool("h100-ib").version == "1.0.0"
    # rolled back, the pool step is not applied any more and can run again
    again = plan_upgrade(config, STACK, "1.35.4")
    assert not next(s for s in again.steps if s.name == "pool-h100-ib").done


def test_the_plan_prints_each_pool_steps_rollback_and_the_fresh_snapshot(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["upgrade", str(_stack_copy(tmp_path)), "--to", "1.35.4"])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "rollback (both keys in one change" in text
    assert "nodePools[1].kubernetesVersion: 1.34.2; nodeImage.pools.h100-ib: {'version': '1.0.0', 'previous': " \
           "'1.1.0'}" in text
    assert "systemctl start kilonode-etcd-snapshot.service" in text and "lifecycle rule" in text
    assert "snapshot taken at pin-pools" not in text
    assert "kubectl -n kube-system rollout status daemonset/kube-proxy" in text
    assert "Prometheus' history stays on its disk" in text


def test_cleanup_keeps_pool_entries_of_different_versions_and_says_so() -> None:
    raw = _at(*STEPS[:9])
    raw["nodeImage"]["pools"]["system"]["version"] = "1.1.1"  # re-rolled after its step
    plan = plan_upgrade(stack_from_value(STACK, copy.deepcopy(raw), Path("x.yaml")).config, STACK, "1.35.4")
    cleanup = plan.steps[-1]
    assert not any(e.path == ("nodeImage", "pools") for e in cleanup.edits)
    assert any("versions differ" in line and "system: 1.1.1" in line for line in cleanup.then)
    apply(raw, cleanup.edits)
    assert raw["nodeImage"]["pools"]["system"] == {"version": "1.1.1"}
    from kilonode.plan import plan_stack

    warnings = plan_stack(stack_from_value(STACK, raw, Path("x.yaml"))).warnings
    assert any("nodeImage.version 1.0.0 reaches no pool" in w for w in warnings)


def test_validate_warns_when_the_stack_wide_image_reaches_no_pool() -> None:
    from kilonode.plan import plan_stack

    def warned(node_image: dict) -> bool:
        cluster = shipped_cluster_value(STACK) | {"nodeImage": node_image}
        warnings = plan_stack(stack_from_value(STACK, cluster, Path("x.yaml"))).warnings
        return any("reaches no pool" in w for w in warnings)

    entries = {name: {"version": "1.1.0"} for name in ("a100-ib", "h100-ib", "system", "monitoring")}
    assert warned({"version": "1.2.0", "pools": entries})  # the raise that rolls nothing
    assert not warned({"version": "1.1.0", "pools": entries})
    assert not warned({"version": "1.2.0", "pools": {"h100-ib": {"version": "1.1.0"}}})  # the others boot 1.2.0
