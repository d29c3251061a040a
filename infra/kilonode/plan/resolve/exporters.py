"""The exporters' sizes that follow the cluster (kilonode.k8s.exporters): kube-state-metrics's
memory and CPU for the Node objects it watches. The exporters on the nodes are sized per node, not
per cluster (kilonode.plan.defaults.exporters)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kilonode.plan import defaults


@dataclass(frozen=True)
class KsmSize:
    nodes: int  # the most nodes the cluster may have (kilonode.plan.resolve.components most_nodes)
    cpu_millis: int
    memory_mib: int

    def describe(self) -> str:
        return (f"kube-state-metrics: one replica (nodes, and kube-system's daemonsets and deployments), "
                f"requesting {self.cpu_millis}m CPU and "
                f"{self.memory_mib:,} MiB (memory limited to that; no CPU limit: upstream warns a low one grows "
                f"its queues) "
                f"for {self.nodes:,} nodes: upstream's 250MiB and 0.1 "
                f"cores plus {defaults.KSM_MEMORY_KIB_PER_NODE} KiB and "
                f"{defaults.KSM_CPU_MILLIS_PER_1000_NODES / 1000:g}m per node (estimates)")


def kube_state_metrics_size(nodes: int) -> KsmSize:
    """Upstream's general rule (README.md "Resource recommendation" at v2.18.0: 250MiB, 0.1 cores)
    and the per-Node estimates of kilonode.plan.defaults.exporters. One replica, not shards: a shard
    would still list and decode every Node (README.md "Horizontal sharding": "all instances ... will
    have the network traffic and the resource consumption for unmarshaling objects for all
    objects"), so sharding saves only the rendered series (~8 KiB a node) and multiplies the
    watches. kube-system's DaemonSets and Deployments, also read (defaults.KSM_RESOURCES), are a
    few dozen objects of some KiB each: inside the 250 MiB base, not a term of their own."""
    memory = defaults.KSM_BASE_MEMORY_MIB + math.ceil(nodes * defaults.KSM_MEMORY_KIB_PER_NODE / 1024)
    cpu = defaults.KSM_BASE_CPU_MILLIS + math.ceil(nodes * defaults.KSM_CPU_MILLIS_PER_1000_NODES / 1000)
    return KsmSize(nodes=nodes, cpu_millis=cpu, memory_mib=memory)
