"""System pools: the label and zone spread the plan gives them, and validate's refusal of a
stack whose system workloads could not schedule at bootstrap."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.plan.resolve.pools import system_pool_problems
from tests.conftest import StackWriter, shipped_cluster_value

runner = CliRunner()


def test_a_system_pool_registers_with_the_system_label_and_taint() -> None:
    plan = plan_stack(load_stack("research-7500"))
    [system] = plan.system_pools
    # ... and its taint, AKS's for system pools, so that only the cluster's own workloads land there
    assert system.labels["kilonode.io/system"] == "true" and system.taints == ("CriticalAddonsOnly=true:NoSchedule",)
    assert all("kilonode.io/system" not in pool.labels for pool in plan.gpu_pools)
    assert system_pool_problems(plan) == []


def test_validate_refuses_a_stack_whose_every_pool_carries_the_gpu_health_taint(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["nodePools"] = [pool for pool in cluster["nodePools"] if not pool.get("system")]
    path = write_stack(cluster)
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert re.search(r"Pulumi\.test\.yaml:\d+: nodePools: no pool has untainted nodes at bootstrap \(a100-ib: "
                     r"kilonode\.io/gpu-health=pending:NoSchedule", result.output)
    assert "add a small CPU pool with `system: true`" in " ".join(result.output.split())


def test_a_pool_with_a_taint_of_its_own_does_not_count(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-2500")
    system = next(pool for pool in cluster["nodePools"] if pool.get("system"))
    system["taints"] = ["example.com/dedicated=infra:NoSchedule"]
    problems = system_pool_problems(plan_stack(load_stack(str(write_stack(cluster)))))
    assert "system: example.com/dedicated=infra:NoSchedule" in problems[0].message
