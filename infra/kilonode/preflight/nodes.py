"""The nodes a cluster has at bootstrap, as their rendered kubelets register them: one Node
per pool role of the render (pool-<name>, pool-<name>.team-<team>), with the labels and taints
its kubelet's flags and KubeletConfiguration give it, and the taints Kubernetes adds until
the node is Ready and initialised."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from kilonode.plan.model import NodePoolPlan
from kilonode.preflight.model import Inputs
from kilonode.preflight.placement import NOT_READY, UNINITIALIZED, Node, Taint
from kilonode.yamlio import load_yaml

KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"
KUBELET_UNIT = "etc/systemd/system/kubelet.service"
POOL_PREFIX = "pool-"

@dataclass(frozen=True)
class PoolNodes:
    host: str  # the render's role directory
    pool: NodePoolPlan
    node: Node  # how each of its nodes registers
    count: int  # nodes at bootstrap (the plan's node count for the role)
    kubelet_config: Mapping[str, object]
    kubelet_flags: Mapping[str, str]


def unit_exec_args(unit: str) -> list[str]:
    """ExecStart's words of a systemd unit (continuation lines joined)."""
    joined = unit.replace("\\\n", " ")
    for line in joined.splitlines():
        if line.startswith("ExecStart="):
            return shlex.split(line.removeprefix("ExecStart=").lstrip("-@+!"))
    return []


def flags_of(args: list[str]) -> dict[str, str]:
    """--name=value and --name value flags; a bare --name is "true"."""
    flags: dict[str, str] = {}
    i = 1
    while i < len(args):
        word = args[i]
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            if not sep and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            flags[name] = value if (sep or value) else "true"
        i += 1
    return flags


def _pairs(text: str, sep: str) -> dict[str, str]:
    return dict(item.split(sep, 1) if sep in item else (item, "") for item in text.split(",") if item)


def _taints(config: Mapping[str, object], flags: Mapping[str, str]) -> list[Taint]:
    taints = [Taint(str(t.get("key", "")), str(t.get("effect", "")), str(t.get("value") or ""))
              for t in config.get("registerWithTaints") or [] if isinstance(t, dict)]  # type: ignore[union-attr]
    for item in (flags.get("register-with-taints") or "").split(","):
        if item:
            key_value, _, effect = item.partition(":")
            key, _, value = key_value.partition("=")
            taints.append(Taint(key, effect, value))
    return taints


def _pool_of(inputs: Inputs, host: str) -> tuple[NodePoolPlan, int] | None:
    """The plan's pool for a render role, and how many nodes its scale sets start with."""
    for pool in inputs.plan.node_pools:
        for team in (None, *pool.teams):
            if host == pool.role(team):
                return pool, sum(s.capacity for s in pool.shards if s.team == team)
    return None


def bootstrap_nodes(inputs: Inputs) -> list[PoolNodes]:
    """Every pool role's nodes as they register (before cloud-node-manager initialises them
    and before they are Ready)."""
    found = []
    for host in inputs.hosts():
        if not host.startswith(POOL_PREFIX):
            continue
        owner = _pool_of(inputs, host)
        if owner is None:
            continue
        pool, count = owner
        files = inputs.host_files(host)
        config = load_yaml(files.get(KUBELET_CONFIG, "")) or {}  # a safe loader, C or Python
        flags = flags_of(unit_exec_args(files.get(KUBELET_UNIT, "")))
        labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  **_pairs(flags.get("node-labels", ""), "=")}
        taints = [*_taints(config, flags), Taint(NOT_READY, "NoSchedule")]
        if flags.get("cloud-provider") == "external":
            taints.append(Taint(UNINITIALIZED, "NoSchedule", "true"))
        found.append(PoolNodes(host, pool, Node(pool.name, labels, tuple(taints)), count, config, flags))
    return found
