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
    assert sorted(p.name for p in (tmp_path / "steps").iterdir())[:2] == ["01-pin-pools.yaml", "02-control-plane.yaml"]
    refused = runner.invoke(app, ["upgrade", str(stack_file), "--to", "1.35.4", "--step", "nope"])
    assert refused.exit_code == 2 and "the steps are pin-pools, control-plane" in refused.output
