"""What cluster-autoscaler must be told about a node of an empty scale set: its labels, taints
and extended resources, as tags on the scale set.

A scale set of an autoscaled pool that holds no node yet (one kept only for the pool's maxNodes
starts empty: kilonode.plan.resolve.pools.capacity_of) has no node for the autoscaler to copy,
so it builds its template node from the scale set alone: the size's vCPUs, memory and GPUs from
its SKU list, generic labels (instance type, region, a zone, a hostname), and the labels, taints
and resources in the scale set's tags (kubernetes/autoscaler cluster-autoscaler/cloudprovider/
azure/azure_template.go: processVMSSTemplate, extractLabelsFromTags, extractTaintsFromTags,
extractAllocatableResourcesFromScaleSet; azure_util.go nodeLabelTagName, nodeTaintTagName,
nodeResourcesTagName; read in the search index's copy of master, the tag names unchanged since
1.18, not at the pinned tags). Without them, a pending pod that selects the pool's label (every
kilonode workload and gang selects its pool), or asks for rdma/ib, fits no template and the
autoscaler never grows the scale set from zero.

The encoding is upstream's: a tag's name is the prefix and the key with '/' written '_' and '_'
written '~2' (Azure tag names may not hold '/'); a taint's value is `value:Effect`. The GPU
health taints are left out: the autoscaler reads them as startup taints (kilonode.k8s.autoscaler
passes --startup-taint), and a template that carried the startup taint would keep every GPU pod
from fitting it.
"""

from __future__ import annotations

from kilonode.node.gpu.protocol import CHECK_TAINT, FAULT_TAINT, STARTUP_TAINT
from kilonode.plan.model import NodePoolPlan, ScaleSetShard
from kilonode.plan.wellknown import FABRIC_LABEL, RDMA_HCA_MAX, RDMA_RESOURCE

# kilonode's GPU health taints (kilonode.node.gpu.protocol): never in a template
GPU_HEALTH_TAINTS = frozenset({STARTUP_TAINT, FAULT_TAINT, CHECK_TAINT})

LABEL_TAG = "k8s.io_cluster-autoscaler_node-template_label_"
TAINT_TAG = "k8s.io_cluster-autoscaler_node-template_taint_"
RESOURCES_TAG = "k8s.io_cluster-autoscaler_node-template_resources_"


def _encoded(key: str) -> str:
    """A label or taint key as a tag name's tail (extractLabelsFromTags reverses it)."""
    return key.replace("_", "~2").replace("/", "_")


def node_template_tags(pool: NodePoolPlan, shard: ScaleSetShard) -> dict[str, str]:
    """The tags that describe a node of `shard` to the autoscaler; none for a scale set the
    autoscaler does not manage (a fixed pool's, a team's)."""
    groups = {g.shard for g in pool.autoscaling.node_groups} if pool.autoscaling else set()
    if shard.name not in groups:
        return {}
    node = pool.registration(shard.team)
    labels = dict(node.labels)
    if pool.infiniband:
        labels[FABRIC_LABEL] = shard.name  # the fabric-label unit names the node's own scale set
    found = {f"{LABEL_TAG}{_encoded(key)}": value for key, value in sorted(labels.items())}
    for taint in node.taints:
        key_value, _, effect = taint.partition(":")
        key, _, value = key_value.partition("=")
        if key not in GPU_HEALTH_TAINTS:
            found[f"{TAINT_TAG}{_encoded(key)}"] = f"{value}:{effect}"
    if pool.infiniband:
        found[f"{RESOURCES_TAG}{_encoded(RDMA_RESOURCE)}"] = str(RDMA_HCA_MAX)
    return found
