"""The kubelet's per-pod PID limit (CIS 4.2.13) against training pods and against the node's
own PID space: a pod at its limit must be a runaway, never a big job, and every pod of a node at
its limit together must still leave the node PIDs (kilonode.plan.defaults.node POD_PIDS_LIMIT)."""

from __future__ import annotations

import pytest

from kilonode.plan import defaults
from kilonode.plan.model import NodePoolPlan, SysctlSetting
from kilonode.render.pool import KUBELET_CONFIG, kubelet_config
from tests import shared
from tests.shared import SHIPPED_STACKS

# Written by hand, not read from the renderer's data. The kernel's PID_MAX_LIMIT on 64-bit
# (include/linux/threads.h: 4 * 1024 * 1024), which systemd's sysctl.d/50-pid-max.conf sets.
PID_MAX_LIMIT_64BIT = 4 * 1024 * 1024
# One training pod on an ND96 node: 8 ranks x (a trainer of ~64 threads + 12 data-loader
# workers of up to 32 threads + 32 torch.compile workers).
TRAINING_POD_TASKS = 8 * (64 + 12 * 32 + 32)


def pid_max(pool: NodePoolPlan) -> int:
    """kernel.pid_max on the pool's nodes: its sysctls' (the profile's or a stack override's),
    else systemd's default."""
    values = [s.value for s in pool.sysctls if s.name == "kernel.pid_max"]
    return int(values[-1]) if values else defaults.KERNEL_PID_MAX


def pods_at_limit_fit(pool: NodePoolPlan) -> bool:
    return defaults.POD_PIDS_LIMIT * pool.max_pods < pid_max(pool)


def test_the_limit_is_generous_for_training_pods_and_below_the_kernels_ceiling() -> None:
    assert defaults.KERNEL_PID_MAX == PID_MAX_LIMIT_64BIT
    assert defaults.POD_PIDS_LIMIT >= 8 * TRAINING_POD_TASKS
    assert defaults.POD_PIDS_LIMIT < PID_MAX_LIMIT_64BIT


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_pool_renders_the_limit_and_its_pods_at_the_limit_leave_the_node_pids(stack: str) -> None:
    plan = shared.plan(stack)
    rendered = shared.rendered(stack)
    for pool in plan.node_pools:
        config = shared.load_yaml(kubelet_config(plan, pool))
        assert config["podPidsLimit"] == defaults.POD_PIDS_LIMIT, pool.name
        assert all(shared.load_yaml(files[KUBELET_CONFIG].content)["podPidsLimit"] == defaults.POD_PIDS_LIMIT
                   for files in rendered.values() if KUBELET_CONFIG in files)
        assert pods_at_limit_fit(pool), (
            f"{stack}/{pool.name}: {pool.max_pods} pods x podPidsLimit {defaults.POD_PIDS_LIMIT} reach "
            f"kernel.pid_max {pid_max(pool)}: the node, not the pod, would run out first")


def test_a_stack_lowering_pid_max_below_its_pods_at_the_limit_fails() -> None:
    """Seeded break: sysctl.overrides kernel.pid_max = 2^18 on research-7500's system pool (24 pods)."""
    pool = next(p for p in shared.plan("research-7500").node_pools if p.name == "system")
    assert pods_at_limit_fit(pool)
    lowered = pool.model_copy(update={"sysctls": (*pool.sysctls, SysctlSetting(
        name="kernel.pid_max", value=2 ** 18, reason="seeded break"))})
    assert pid_max(lowered) == 2 ** 18
    assert not pods_at_limit_fit(lowered)
