"""The VM sizes the plan's machines use, with what the quota check needs of each: its vCPUs and
the quota family Azure counts it against (catalogue rows, with their sources)."""

from __future__ import annotations

from kilonode.catalog.vm import vm_size
from kilonode.plan.model import ControlPlanePlan, EtcdClusterPlan, NodePoolPlan, VmSizeFacts


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
