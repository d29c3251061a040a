"""The VM sizes the plan's machines use, with what the quota check needs of each: its vCPUs and
the quota family Azure counts it against (catalogue rows, with their sources)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kilonode.catalog.vm import vm_size
from kilonode.plan.model import ControlPlanePlan, EtcdClusterPlan, NodePoolPlan, VcpuNeed, VmSizeFacts

# the Compute Usage API's name of Total Regional vCPUs (preflight's quota check reads it too)
REGIONAL = "cores"


def vm_size_facts(etcd: tuple[EtcdClusterPlan, ...], control_plane: ControlPlanePlan,
                  pools: tuple[NodePoolPlan, ...]) -> dict[str, VmSizeFacts]:
    """Every size a machine of the plan is created with -> its facts (None where the catalogue
    does not know the size: preflight says the quota cannot be counted)."""
    names = {m.vm_size for cluster in etcd for m in cluster.members} | {control_plane.vm_size}
    names |= {pool.vm_size for pool in pools}
    facts = {}
    for name in sorted(names):
        size = vm_size(name)
        facts[name] = VmSizeFacts(vcpus=size.vcpus if size else None,
                                  quota_family=size.quota_family if size else None,
                                  encryption_at_host=size.encryption_at_host if size else None)
    return facts


def vcpu_quota(etcd: tuple[EtcdClusterPlan, ...], control_plane: ControlPlanePlan,
               pool_machines: Iterable[tuple[str, int]],
               facts: Mapping[str, VmSizeFacts]) -> tuple[VcpuNeed, ...]:
    """vCPUs per quota family at the size the cluster may reach, then the region's total:
    `pool_machines` is (VM size, its most nodes) of each pool. Quota is the subscription's, not a
    fixed limit: `kilonode explain` shows this, and preflight's quota check compares it with
    what Azure's Compute Usage API says is free."""
    machines: dict[str, int] = {}
    for cluster in etcd:
        for member in cluster.members:
            machines[member.vm_size] = machines.get(member.vm_size, 0) + 1
    machines[control_plane.vm_size] = machines.get(control_plane.vm_size, 0) + len(control_plane.instances)
    for size, count in pool_machines:
        machines[size] = machines.get(size, 0) + count
    per_family: dict[str, list[int]] = {}
    for size, count in machines.items():
        known = facts.get(size)
        if known is None or known.quota_family is None or known.vcpus is None:
            family, vcpus = f"{size} (family unknown)", 0
        else:
            family, vcpus = known.quota_family, known.vcpus
        entry = per_family.setdefault(family, [0, 0])
        entry[0] += count
        entry[1] += count * vcpus
    needs = [VcpuNeed(family=f, machines=m, vcpus=v) for f, (m, v) in sorted(per_family.items())]
    total = VcpuNeed(family=REGIONAL, machines=sum(n.machines for n in needs), vcpus=sum(n.vcpus for n in needs))
    return (*needs, total)
