"""kube-controller-manager's and kube-scheduler's client rates, sized for the joins (kilonode.plan.defaults.controllers
says why upstream's defaults do not hold). Every joining node gets a pod of each of kilonode's DaemonSets that
runs on its pool (kilonode.plan.resolve.pools own_daemonsets): the DaemonSet controller creates it (one POST at its
client's rate) and the default scheduler binds it (one binding POST at its own). At the rate the apiservers are
sized to admit joins (JoinPlan.sized_for_per_min), that is nodes/s x DaemonSets per node requests a second for each;
the plan gives each client CLIENT_HEADROOM times that: upstream's default where that covers it, else that rounded
up to CLIENT_QPS_STEP, its burst CLIENT_BURST_RATIO times it."""

from __future__ import annotations

import math

from kilonode.catalog.limits import limits
from kilonode.config.model import ClusterConfig
from kilonode.plan import defaults
from kilonode.plan.model import ControllerClientsPlan, JoinPlan, NodePoolPlan
from kilonode.plan.resolve.pools import own_daemonsets


def _sized(rate: float, default: int) -> int:
    """Upstream's default where it covers the headroom; else the need rounded up to a step."""
    wanted = rate * defaults.CLIENT_HEADROOM
    if wanted <= default:
        return default
    return math.ceil(wanted / defaults.CLIENT_QPS_STEP) * defaults.CLIENT_QPS_STEP


def _burst(qps: int, default_qps: int, default_burst: int) -> int:
    return default_burst if qps == default_qps else qps * defaults.CLIENT_BURST_RATIO


def clients_plan(config: ClusterConfig, pools: tuple[NodePoolPlan, ...], joins: JoinPlan) -> ControllerClientsPlan:
    k = limits().kubernetes
    per_pool = {pool.name: len(own_daemonsets(pool)) for pool in config.node_pools}
    per_node = max(per_pool.values(), default=0)
    pods = sum(per_pool.get(p.name, 0) * (p.autoscaling.max_nodes if p.autoscaling else p.nodes) for p in pools)
    rate = joins.sized_for_per_min / 60 * per_node
    kcm_default, scheduler_default = int(k.controller_manager_qps.value), int(k.scheduler_qps.value)
    kcm = _sized(rate, kcm_default)
    scheduler = _sized(rate, scheduler_default)

    def minutes(qps: int) -> int:
        return math.ceil(pods / qps / 60) if pods else 0

    return ControllerClientsPlan(
        daemonset_pods_per_node=per_node,
        daemonset_pods=pods,
        daemonset_pods_per_s=round(rate, 1),
        controller_manager_qps=kcm,
        controller_manager_burst=_burst(kcm, kcm_default, int(k.controller_manager_burst.value)),
        scheduler_qps=scheduler,
        scheduler_burst=_burst(scheduler, scheduler_default, int(k.scheduler_burst.value)),
        controller_manager_qps_default=kcm_default,
        scheduler_qps_default=scheduler_default,
        fill_min=minutes(kcm),
        default_fill_min=minutes(kcm_default),
        reason=(f"up to {per_node} of kilonode's DaemonSet pods on each joining node, at the "
                f"{joins.sized_for_per_min} nodes/min the apiservers are sized to admit: {rate:.1f} pods/s for the "
                f"DaemonSet controller to create and the scheduler to bind; {defaults.CLIENT_HEADROOM}x that: "
                f"upstream's default where it covers it, else rounded up to a multiple of {defaults.CLIENT_QPS_STEP} "
                f"(upstream's: {kcm_default} and {scheduler_default}): --kube-api-qps {kcm}, the scheduler's "
                f"{scheduler}. The cluster's {pods:,} DaemonSet pods take {minutes(kcm)} min at {kcm}/s "
                f"({minutes(kcm_default)} min at upstream's {kcm_default}/s)"),
    )
