"""The whole rendered tree of a cluster: one directory per host role instance and pool."""

from __future__ import annotations

from kilonode.config.model import ClusterConfig
from kilonode.plan.model import ClusterPlan
from kilonode.render.common import GENERATED
from kilonode.render.control_plane import render_apiserver
from kilonode.render.etcd import render_etcd_member
from kilonode.render.files import HostFiles, RenderedFile
from kilonode.render.pool import render_pool
from kilonode.yamlio import block_yaml

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.yaml"


def render_cluster(plan: ClusterPlan) -> dict[str, HostFiles]:
    """{"etcd-main-0": files, ..., "etcd-events-0": ..., "etcd-leases-0" (where the stack has that
    cluster): ..., "apiserver-0": ..., "pool-<name>": ...,
    "pool-<name>.team-<team>": ... for each team with scale sets in the pool}"""
    hosts: dict[str, HostFiles] = {}
    for cluster in plan.etcd_clusters:
        for member in cluster.members:
            hosts[member.name] = render_etcd_member(plan, cluster, member)
    for instance in plan.control_plane.instances:
        hosts[instance.name] = render_apiserver(plan, instance)
    for pool in plan.node_pools:
        hosts[pool.role()] = render_pool(plan, pool)
        for team in pool.teams:
            hosts[pool.role(team)] = render_pool(plan, pool.registration(team))
    return hosts


def render_tree(config: ClusterConfig, plan: ClusterPlan) -> dict[str, RenderedFile]:
    """Every file `kilonode render` writes, keyed by its path under --out."""
    tree = {
        CONFIG_FILE: RenderedFile(
            f"# The fully defaulted config. {GENERATED}\n"
            + block_yaml(config.model_dump(mode="json", by_alias=True))
        ),
        PLAN_FILE: RenderedFile(
            f"# The resolved plan. {GENERATED}\n" + block_yaml(plan.model_dump(mode="json", by_alias=True))
        ),
    }
    for host, files in render_cluster(plan).items():
        for path, file in files.items():
            tree[f"{host}/{path}"] = file
    return dict(sorted(tree.items()))
