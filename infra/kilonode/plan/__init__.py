"""The cluster plan: every name, address, count and budget, resolved once from the config."""

from kilonode.config.load import Stack, with_lines
from kilonode.plan.model import ClusterPlan
from kilonode.plan.resolve import resolve
from kilonode.problems import PlanError

__all__ = ["ClusterPlan", "plan_stack", "resolve"]


def plan_stack(stack: Stack) -> ClusterPlan:
    """resolve() for a loaded stack; limit problems come back pointing into its file."""
    try:
        return resolve(stack.config, stack.sysctl_profile)
    except PlanError as err:
        raise with_lines(stack, err) from None
