"""What a gang job names and carries, with no Pulumi in it: the gang scheduler's name, the
PodGroup label and API, and the one InfiniBand-fabric pod affinity. kilonode.k8s.scheduling
deploys the scheduler and its admission policy from these names; kilonode.k8s.nccl_job builds
jobs with them; docs/gang-scheduling.md shows them."""

from __future__ import annotations

from typing import Any

from kilonode.plan.wellknown import FABRIC_LABEL

# What a job names (docs/gang-scheduling.md).
GANG_SCHEDULER_NAME = "kilonode-gang"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # v1alpha1.PodGroupLabel at every pinned tag
POD_GROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
# A gang whose pods may span InfiniBand fabrics (giving up RDMA between them) says so on its
# pods; the admission policy then lets them through without the fabric affinity.
CROSS_FABRIC_ANNOTATION = "kilonode.io/cross-fabric"


def fabric_affinity(group: str) -> dict[str, Any]:
    """A gang pod's affinity that keeps its PodGroup inside one InfiniBand fabric: required pod
    affinity to its own group's pods, topologyKey kilonode.io/fabric (kilonode.k8s.scheduling
    says why, and its GANG_FABRIC_RULE admits exactly this)."""
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {POD_GROUP_LABEL: group}}, "topologyKey": FABRIC_LABEL},
    ]}}
