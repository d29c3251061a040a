"""Who may reach each port the cluster's machines listen on, for one plan: the catalogue's
listeners (kilonode.catalog.listeners) with their numbers, the address the cluster's Prometheus
scrapes from, and the pools where users' pods can run.

The scraper's source. Prometheus runs as a pod on the plan's Prometheus pool and, with Azure CNI,
has an address of that pool's subnet (kilonode.render.cni: pod addresses are the NIC's own, no
SNAT inside the virtual network). That subnet also holds the pool's nodes and every other pod
placed there, so "the Prometheus pool's subnet" means "the scraper" only where nothing but the
cluster's own workloads can run: a reserved pool.

Reserved pools: the system pools and the Prometheus pool, each where it keeps pods off with a
NoSchedule or NoExecute taint of its own (CriticalAddonsOnly on system pools, the stack's taint on
a `monitoring: true` pool) and the reserved-pools admission policy (kilonode.k8s.reserved_pools)
refuses every pod outside SYSTEM_NAMESPACES that tolerates all of them or names one of their
nodes. A taint alone is not enough: any pod may tolerate any taint. The GPU health startup
taint and team taints do not reserve a pool: the first goes once a node is checked, the second
is for a team's own pods (kilonode.k8s.capacity). On every other pool users' pods run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from ipaddress import IPv4Network

from kilonode.catalog.listeners import Bind, Guard, Hosts, Reacher, catalogue
from kilonode.node.gpu.protocol import STARTUP_TAINT
from kilonode.plan import defaults, wellknown
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.problems import Problem

# The effects that keep a pod off a node; PreferNoSchedule only discourages.
KEEPING_EFFECTS = ("NoSchedule", "NoExecute")
# Taints on a pool that do not make it the cluster's alone (the module docstring says why).
TRANSIENT_TAINT_KEYS = (STARTUP_TAINT, wellknown.TEAM_LABEL)


@dataclass(frozen=True)
class PlannedListener:
    """A catalogue row with its port number (0: one the kernel picks)."""

    id: str
    program: str
    hosts: tuple[Hosts, ...]
    port: int
    bind: Bind
    authenticated: bool
    reached_by: tuple[Reacher, ...]
    guard: Guard


def _number(port: int | str) -> int:
    """A catalogue port: a number, or the name of the kilonode constant that decides it."""
    if isinstance(port, int):
        return port
    for home in (wellknown, defaults):
        value = getattr(home, port, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"catalog listeners.yaml: port {port!r} names no constant of kilonode.plan.wellknown or defaults")


@cache
def listeners() -> tuple[PlannedListener, ...]:
    return tuple(PlannedListener(
        id=row.id, program=row.program, hosts=tuple(row.hosts), port=_number(row.port), bind=row.bind,
        authenticated=row.authenticated, reached_by=tuple(row.reached_by), guard=row.guard,
    ) for row in catalogue().listeners)


def listener(listener_id: str) -> PlannedListener:
    [found] = [item for item in listeners() if item.id == listener_id]
    return found


def pool_hosts(plan: ClusterPlan, pool: NodePoolPlan) -> set[Hosts]:
    """The catalogue's host kinds a pool's nodes are."""
    kinds: set[Hosts] = {"pools"}
    if pool.gpus_per_node:
        kinds.add("gpu-pools")
    if pool.name in {p.name for p in plan.controller_pools}:
        kinds.add("controller-pools")
    return kinds


def on_pool(plan: ClusterPlan, pool: NodePoolPlan) -> tuple[PlannedListener, ...]:
    """The host listeners a pool's nodes have (not a pod's)."""
    kinds = pool_hosts(plan, pool)
    return tuple(item for item in listeners() if kinds & set(item.hosts))


def firewalled_ports(plan: ClusterPlan, pool: NodePoolPlan) -> tuple[int, ...]:
    """The node firewall's ports on a pool: its unauthenticated listeners on the node's addresses,
    which the node admits from the scraper and loopback alone (kilonode.render.node_ports)."""
    return tuple(sorted({item.port for item in on_pool(plan, pool) if item.guard == "node-firewall"}))


def prometheus_pool(plan: ClusterPlan) -> NodePoolPlan | None:
    if plan.prometheus is None:
        return None
    [pool] = [p for p in plan.node_pools if p.name == plan.prometheus.pool]
    return pool


def scraper_subnet(plan: ClusterPlan) -> IPv4Network | None:
    """Where the cluster's Prometheus scrapes from: its pool's subnet; None without one."""
    pool = prometheus_pool(plan)
    return IPv4Network(pool.subnet) if pool is not None else None


def keeping_taints(pool: NodePoolPlan) -> tuple[str, ...]:
    """The pool's own taints that keep pods off its nodes for good (`key[=value]:effect`)."""
    return tuple(t for t in pool.taints if t.rpartition(":")[2] in KEEPING_EFFECTS
                 and t.partition(":")[0].partition("=")[0] not in TRANSIENT_TAINT_KEYS)


def reserved_pools(plan: ClusterPlan) -> tuple[NodePoolPlan, ...]:
    """The pools kept to SYSTEM_NAMESPACES' pods: the system pools and the Prometheus pool, each
    where it has a taint that keeps pods off (the admission policy keeps users from tolerating it)."""
    prometheus = prometheus_pool(plan)
    return tuple(p for p in plan.node_pools
                 if (p.system or (prometheus is not None and p.name == prometheus.name)) and keeping_taints(p))


def users_run_on(plan: ClusterPlan, pool: NodePoolPlan) -> bool:
    return pool.name not in {p.name for p in reserved_pools(plan)}


def scraper_pool_problems(plan: ClusterPlan) -> list[Problem]:
    """The Prometheus pool's subnet is "the scraper" to the node firewall and the NSGs (etcd's and
    the controllers' metrics, the node programs' ports): a pool where users' pods run there would
    make every such pod a scraper. With more than one pool the stack can keep it to the system
    namespaces (a taint that keeps pods off, which the reserved-pools admission policy then holds
    users to). Refused where the stack names the pool for Prometheus (`monitoring: true`) without
    such a taint: a PreferNoSchedule taint, none, or a GPU pool's transient ones. Where the planner
    placed Prometheus on a shared pool itself (the `local` rehearsal, which has one pool, and stacks
    grown from it), preflight's `listeners` check says so as a warning."""
    pool = prometheus_pool(plan)
    if pool is None or not pool.monitoring or not users_run_on(plan, pool):
        return []
    index = [p.name for p in plan.node_pools].index(pool.name)
    return [Problem(("nodePools", index), (
        f"Prometheus runs on pool {pool.name}, where users' pods run too: its subnet is what the node firewall and "
        "the NSGs admit to etcd's and the controllers' metrics and the node programs' ports, so every pod there "
        "would reach them; give this pool a taint that keeps pods off (e.g. taints: "
        "[\"dedicated=monitoring:NoSchedule\"]), or run Prometheus on the system pool"
    ))]

