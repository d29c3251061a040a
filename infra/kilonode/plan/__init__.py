"""The cluster plan: every name, address, count and budget, resolved once from the config."""

from kilonode.config.checks import pid_max_problems
from kilonode.config.load import Stack, with_lines
from kilonode.plan import defaults
from kilonode.plan.listeners import scraper_pool_problems
from kilonode.plan.model import ClusterPlan
from kilonode.plan.resolve import resolve
from kilonode.plan.resolve.pools import max_pods, system_pool_problems
from kilonode.problems import PlanError

__all__ = ["ClusterPlan", "checked_plan", "plan_stack", "resolve"]


def plan_stack(stack: Stack) -> ClusterPlan:
    """resolve() for a loaded stack; limit problems come back pointing into its file."""
    try:
        return resolve(stack.config, stack.sysctl_profile)
    except PlanError as err:
        raise with_lines(stack, err) from None


def checked_plan(stack: Stack) -> ClusterPlan:
    """plan_stack() and the checks of the whole plan that a cluster needs to come up (a pool the
    system workloads can schedule on at bootstrap): what every command (kilonode.cli.common.
    load_and_plan), `kilonode diff`'s snapshots and the Pulumi program plan a stack file with,
    so that none accepts what another refuses. plan_stack alone is for plans of parts (the
    fleet's bisection, tests of one resolver)."""
    plan = plan_stack(stack)
    problems = system_pool_problems(plan) + scraper_pool_problems(plan)
    # kernel.pid_max against the pods' PIDs at the kubelet's podPidsLimit (a config rule, the plan's numbers)
    problems += pid_max_problems(stack.config, stack.sysctl_profile, defaults.POD_PIDS_LIMIT, max_pods,
                                 defaults.KERNEL_PID_MAX)
    if problems:
        raise with_lines(stack, PlanError(problems))
    return plan
