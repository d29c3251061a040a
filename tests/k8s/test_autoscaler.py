"""The cluster autoscaler (kilonode.k8s.autoscaler): its objects against the OpenAPI schema of the
stack's minor, its node groups against the plan, its guards by flag name and value, every flag
against its registration in kubernetes/autoscaler at the pinned tag, its RBAC against upstream's
Azure example at that tag, and the azure.json it reads against the struct it decodes it into.

The references below were read from kubernetes/autoscaler at the tags in TAGS (file and line
given); they are written here by hand, so a change to the module is a change this test sees."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.catalog.components import components
from kilonode.config import load_stack
from kilonode.config.model import SUPPORTED_KUBERNETES_MINORS
from kilonode.k8s import autoscaler
from kilonode.plan import ClusterPlan, defaults, plan_stack
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value
from tests.graphcache import recorded

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

# kubernetes/autoscaler: the tag pinned per minor, its commit, and the file its flags are
# registered in (main.go at 1.32; config/flags/flags.go from 1.33).
TAGS: dict[int, tuple[str, str, str]] = {
    32: ("cluster-autoscaler-1.32.7", "f645beb1ec472b785e5c196b3768c0d93195a75a", "cluster-autoscaler/main.go"),
    33: ("cluster-autoscaler-1.33.6", "be4b5a18814a53539d0fe6299c92839152cae54c",
         "cluster-autoscaler/config/flags/flags.go"),
    34: ("cluster-autoscaler-1.34.5", "cb2123ed13148c38fbdb1ede42d8e99761ee2909",
         "cluster-autoscaler/config/flags/flags.go"),
    35: ("cluster-autoscaler-1.35.2", "2d42588803c71fe9b35dcd9e3669ac6bb550ca22",
         "cluster-autoscaler/config/flags/flags.go"),
}

# The flags kilonode passes: (kind of value, the line registering it in TAGS[minor]'s file for
# minors 32, 33, 34, 35). Kinds as Go parses them: duration (time.ParseDuration), float
# (ParseFloat), int, bool (ParseBool), minmax ("<int>:<int>", parseMinMaxFlag), string, and
# multi (flags.MultiStringFlag: repeatable).
FLAGS: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "cloud-provider": ("string", (170, 116, 116, 117)),
    "cloud-config": ("string", (124, 70, 70, 72)),
    "nodes": ("multi", (184, 129, 129, 131)),
    "max-total-unready-percentage": ("float", (177, 122, 122, 123)),
    "ok-total-unready-count": ("int", (178, 123, 123, 124)),
    "max-scale-down-parallelism": ("int", (250, 191, 191, 194)),
    "max-drain-parallelism": ("int", (251, 192, 192, 195)),
    "max-nodes-per-scaleup": ("int", (253, 194, 194, 197)),
    "parallel-scale-up": ("bool", (180, 125, 125, 126)),
    "max-node-provision-time": ("duration", (181, 126, 126, 127)),
    "balance-similar-node-groups": ("bool", (213, 158, 158, 160)),
    "cores-total": ("minmax", (167, 113, 113, 114)),
    "memory-total": ("minmax", (168, 114, 114, 115)),
    "scale-down-utilization-threshold": ("float", (141, 87, 87, 88)),
    "scale-down-gpu-utilization-threshold": ("float", (143, 89, 89, 90)),
    "ignore-daemonsets-utilization": ("bool", (203, 148, 148, 150)),
    "scale-down-unneeded-time": ("duration", (137, 83, 83, 84)),
    "scale-down-delay-after-add": ("duration", (129, 75, 75, 76)),
    "expendable-pods-priority-cutoff": ("int", (218, 161, 161, 163)),
    "skip-nodes-with-local-storage": ("bool", (256, 197, 197, 200)),
    "startup-taint": ("multi", (223, 165, 165, 167)),
    "status-taint": ("multi", (224, 166, 166, 168)),
}
# Registered outside that file, at every pinned tag: --leader-elect by k8s.io/component-base
# config/options/leaderelectionconfig.go l.26 (v0.32.12, v0.33.13, v0.34.9, v0.35.6: the versions
# each tag's go.mod replaces component-base with), bound in main.go (componentopts.
# BindLeaderElectionFlags, l.698 / 320 / 347 / 362); --v by klog v2.130.1 klog.go l.420,
# registered by klog.InitFlags(nil) in main.go (l.687 / 309 / 336 / 351).
OTHER_FLAGS = {"leader-elect": "bool", "v": "int"}
# ... and one kilonode does not pass, registered at 1.32 only (main.go l.174, "DEPRECATED: Use
# --max-scale-down-parallelism instead"): used below to show a flag of another tag is refused.
FLAGS_AT_32_ONLY = {"max-empty-bulk-delete": ("int", (174, 0, 0, 0))}
# ... and one registered at 1.35.2 only (flags.go l.128), which kilonode therefore does not pass
FLAGS_AT_35_ONLY = {"max-node-startup-time": ("duration", (0, 0, 0, 128))}

GO_DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")
GO_BOOL = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}


def _ordered(low: str, high: str) -> bool:
    return int(low) <= int(high)  # validateMinMaxFlag: max must not be below min


def split(arg: str) -> tuple[str, str]:
    assert arg.startswith("--") and "=" in arg, arg
    name, value = arg[2:].split("=", 1)
    return name, value


def flag_problems(args: list[str], minor: int, known: dict[str, tuple[str, tuple[int, int, int, int]]] = FLAGS,
                  ) -> list[str]:
    """Every flag is registered at the tag pinned for `minor`, its value parses as Go parses
    that flag's type, and only repeatable flags repeat."""
    index = minor - 32
    problems, seen = [], set()
    for arg in args:
        name, value = split(arg)
        if name in OTHER_FLAGS:
            kind = OTHER_FLAGS[name]
        elif name in known and known[name][1][index]:
            kind = known[name][0]
        else:
            problems.append(f"--{name} is not registered at {TAGS[minor][0]}")
            continue
        if name in seen and kind != "multi":
            problems.append(f"--{name} given twice")
        seen.add(name)
        valid = {
            "duration": lambda v: GO_DURATION.fullmatch(v) is not None,
            "float": lambda v: re.fullmatch(r"-?\d+(\.\d+)?", v) is not None,
            "int": lambda v: re.fullmatch(r"-?\d+", v) is not None,
            "bool": lambda v: v in GO_BOOL,
            "minmax": lambda v: re.fullmatch(r"\d+:\d+", v) is not None and _ordered(*v.split(":")),
            "string": lambda v: v != "",
            "multi": lambda v: v != "",
        }[kind](value)
        if not valid:
            problems.append(f"--{name}={value} is not a valid {kind}")
    return problems


# The autoscaler's Azure Config: the json keys of the structs BuildAzureConfig json.Unmarshals
# azure.json into, with their Go types as JSON types, for the keys kilonode's azure.json uses
# and those the autoscaler needs. json.Unmarshal ignores an unknown key and fails the whole
# config (the autoscaler does not start) on a type it cannot decode.
# 1.32-1.34: cloud-provider-azure v1.29.4 pkg/provider/azure.go Config (resourceGroup l.121,
# location l.123, vnetName l.131, vnetResourceGroup l.133, subnetName l.135, securityGroupName
# l.137, securityGroupResourceGroup l.139, vmType l.152, loadBalancerSku l.173,
# disableAvailabilitySetNodes l.189, useInstanceMetadata l.199, disableOutboundSNAT *bool l.211),
# pkg/provider/config/azure_auth.go (subscriptionId l.52), pkg/azclient v0.0.13 arm_conf.go
# (cloud l.30, tenantId l.37) and auth_conf.go (useManagedIdentityExtension l.36,
# userAssignedIdentityID l.40). 1.35: v1.34.3 pkg/provider/config/azure.go (resourceGroup l.40,
# location l.42, vnetName l.50, vnetResourceGroup l.52, subnetName l.54, securityGroupName l.56,
# securityGroupResourceGroup l.58, vmType l.71, loadBalancerSku l.93, disableAvailabilitySetNodes
# l.109, useInstanceMetadata l.113, disableOutboundSNAT *bool l.125), azure_auth.go
# (subscriptionId l.44), pkg/azclient v0.9.2 arm_conf.go (cloud l.33, tenantId l.40), auth_conf.go
# (useManagedIdentityExtension l.37, userAssignedIdentityID l.41); loadBalancerBackendPoolConfigurationType
# string (v1.29.4 pkg/provider/azure.go l.256, v1.34.3 pkg/provider/config/azure.go l.135: read, and
# unused by the autoscaler, which makes no load balancer). The same names and types in both; the
# autoscaler's own fields (cloudprovider/azure/azure_config.go Config, legacyConfig)
# reuse none of these names.
AUTOSCALER_AZURE_FIELDS: dict[str, type] = {
    "cloud": str, "tenantId": str, "subscriptionId": str, "resourceGroup": str, "location": str, "vmType": str,
    "vnetName": str, "vnetResourceGroup": str, "subnetName": str, "securityGroupName": str,
    "securityGroupResourceGroup": str, "loadBalancerSku": str, "disableAvailabilitySetNodes": bool,
    "useInstanceMetadata": bool, "disableOutboundSNAT": bool, "useManagedIdentityExtension": bool,
    "userAssignedIdentityID": str, "loadBalancerBackendPoolConfigurationType": str,
}
# What it needs for uniform scale sets with a user-assigned identity (azure_config.go validate:
# resourceGroup, subscriptionId, vmType vmss or standard; azure_client.go: the identity; cloud
# picks the ARM endpoint).
AUTOSCALER_AZURE_NEEDS = {"cloud", "subscriptionId", "resourceGroup", "vmType", "useManagedIdentityExtension",
                          "userAssignedIdentityID"}


def azure_config_problems(config: dict[str, Any]) -> list[str]:
    problems = [f"{key}: not a field of the autoscaler's Azure config" for key in config
                if key not in AUTOSCALER_AZURE_FIELDS]
    problems += [f"{key}: {value!r} does not decode into {AUTOSCALER_AZURE_FIELDS[key].__name__}"
                 for key, value in config.items()
                 if key in AUTOSCALER_AZURE_FIELDS and type(value) is not AUTOSCALER_AZURE_FIELDS[key]]
    problems += [f"{key}: missing" for key in sorted(AUTOSCALER_AZURE_NEEDS - set(config))]
    return problems


# Upstream's RBAC: cloudprovider/azure/examples/cluster-autoscaler-vmss-msi.yaml, copied rule by
# rule. ClusterRole l.18-65 at 1.34.5 and 1.35.2 (file at commit 12e6e2e1); at 1.32.7 and 1.33.6
# (715e1fdb) the storage.k8s.io rule lacks volumeattachments.
def upstream_cluster_rules(minor: int) -> list[dict[str, Any]]:
    storage = ["storageclasses", "csinodes", "csidrivers", "csistoragecapacities"]
    if minor >= 34:
        storage.append("volumeattachments")
    return [
        {"apiGroups": [""], "resources": ["events", "endpoints"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["endpoints"], "resourceNames": ["cluster-autoscaler"],
         "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["watch", "list", "get", "update"]},
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "replicationcontrollers",
                                          "persistentvolumeclaims", "persistentvolumes"],
         "verbs": ["watch", "list", "get"]},
        {"apiGroups": ["extensions"], "resources": ["replicasets", "daemonsets"], "verbs": ["watch", "list", "get"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["watch", "list"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets", "replicasets", "daemonsets"],
         "verbs": ["watch", "list", "get"]},
        {"apiGroups": ["storage.k8s.io"], "resources": storage, "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["watch", "list", "get"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resourceNames": ["cluster-autoscaler"], "resources": ["leases"],
         "verbs": ["get", "update"]},
    ]


# ... and its Role in kube-system, l.69-85 (the same at the four tags).
UPSTREAM_NAMESPACE_RULES = [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "list", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"],
     "resourceNames": ["cluster-autoscaler-status", "cluster-autoscaler-priority-expander"],
     "verbs": ["delete", "get", "update", "watch"]},
]

AUTOSCALED = "research-7500"
H100_SHARDS = [f"research-7500-h100-ib-{i:03d}" for i in range(25)]
# The stack at its planned maximum, by hand from the sizes' published figures: 5,000
# ND96asr_v4 (96 vCPUs, 900 GiB), 2,500 ND96isr_H100_v5 (96, 1,900), 3 system D16ds_v5 (16, 64)
# and the monitoring pool's one E16ds_v5 (16, 128).
CORES_TOTAL = 5_000 * 96 + 2_500 * 96 + 3 * 16 + 1 * 16
MEMORY_TOTAL = 5_000 * 900 + 2_500 * 1_900 + 3 * 64 + 1 * 128


def autoscaler_objects(graph: Graph) -> list[Recorded]:
    parents = {r.name for r in graph.resources if r.type == "kilonode:k8s:ClusterAutoscaler"}
    return [r for r in graph.resources if r.parent in parents and r.custom]


def one(graph: Graph, kind: str) -> dict[str, Any]:
    [record] = [r for r in autoscaler_objects(graph) if r.type.endswith(f":{kind}")]
    return record.plain()


def container(graph: Graph) -> dict[str, Any]:
    [c] = one(graph, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def args_of(graph: Graph) -> list[str]:
    return list(container(graph)["args"])


def values(args: list[str], name: str) -> list[str]:
    return [v for n, v in map(split, args) if n == name]


def stack_with(write_stack: StackWriter, base: str, name: str, **changes: Any) -> Path:
    cluster = shipped_cluster_value(base)
    for pool in changes.pop("autoscale", ()):
        next(p for p in cluster["nodePools"] if p["name"] == pool)["autoscaling"] = {}
    cluster.update(changes)
    return write_stack(cluster, name)


@pytest.fixture(scope="module")
def minor_graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Graph]:
    """`local` with autoscaling on its pool, at each supported minor but research-7500's."""
    graphs = {}
    # patch releases every machine's binaries are pinned for (node-image/binaries.toml)
    for minor, version in ((32, "1.32.8"), (33, "1.33.5"), (35, "1.35.4")):
        cluster = shipped_cluster_value("local")
        cluster["nodePools"][0]["autoscaling"] = {}
        cluster["kubernetesVersion"] = version
        path = tmp_path_factory.mktemp(f"v{minor}") / f"Pulumi.local-{minor}.yaml"
        path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
        graphs[minor] = recorded(load_stack(str(path)))
    return graphs


def test_the_pinned_releases_are_the_tags_read_one_per_supported_minor() -> None:
    assert set(components().cluster_autoscaler.versions) == set(SUPPORTED_KUBERNETES_MINORS) == set(TAGS)
    for minor, (tag, _commit, _file) in TAGS.items():
        assert components().cluster_autoscaler.versions[minor] == "v" + tag.removeprefix("cluster-autoscaler-")
        # the autoscaler's minor is Kubernetes' (its README, "Releases")
        assert components().cluster_autoscaler.versions[minor].startswith(f"v1.{minor}.")


@pytest.mark.parametrize("stack", ["local", "research-2500"])
def test_stacks_without_autoscaled_pools_get_no_autoscaler(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    assert plans[stack].autoscaled_pools == ()
    graph = graphs[stack]
    assert not graph.of_type("kilonode:k8s:ClusterAutoscaler")
    names = {r.plain().get("metadata", {}).get("name") for r in graph.resources if r.type.startswith("kubernetes:")}
    assert not names & {"cluster-autoscaler", "kilonode:cluster-autoscaler"}
    assert autoscaler.describe(plans[stack]) == [
        "no pool has autoscaling: no cluster autoscaler; every scale set keeps its planned capacity"]


def test_research_7500_gets_seven_objects_valid_against_its_minors_schema(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    objects = autoscaler_objects(graphs[AUTOSCALED])
    # ServiceAccount, ClusterRole + binding, Role + binding, Deployment, PodDisruptionBudget
    assert sorted(r.type.rsplit(":", 1)[1] for r in objects) == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding",
        "ServiceAccount"]
    minor = plans[AUTOSCALED].kubernetes_minor
    for record in objects:
        shared.validate_object(record.plain(), f"1.{minor}.0")


@pytest.mark.parametrize("minor", [32, 33, 35])
def test_the_objects_validate_at_the_other_minors_too(minor_graphs: dict[int, Graph], minor: int) -> None:
    objects = autoscaler_objects(minor_graphs[minor])
    assert len(objects) == 7
    for record in objects:
        shared.validate_object(record.plain(), f"1.{minor}.0")


def test_the_node_groups_are_the_h100_shards_with_the_planned_bounds_and_no_team_shard(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    args = args_of(graphs[AUTOSCALED])
    # by hand: pool h100-ib, 2,500 nodes in 25 shards of 100, no team: each 50..100 (half of 2,500
    # over 25 shards), so the pool never goes below 1,250
    assert values(args, "nodes") == [f"50:100:{shard}" for shard in H100_SHARDS]
    # ... which is what the plan says
    plan = plans[AUTOSCALED]
    [pool] = plan.autoscaled_pools
    assert pool.autoscaling is not None
    assert values(args, "nodes") == [f"{g.min_size}:{g.max_size}:{g.shard}" for g in pool.autoscaling.node_groups]
    named = {v.split(":", 2)[2] for v in values(args, "nodes")}
    team_shards = {shard for team in plan.teams for shard in team.shards}
    assert len(team_shards) == 40 and not named & team_shards
    assert not any("a100-ib" in shard for shard in named)
    # the plan is the source of the bounds: no discovery by tags
    assert "node-group-auto-discovery" not in {split(a)[0] for a in args}


def test_a_second_autoscaled_pool_gets_its_shared_shards_as_node_groups(write_stack: StackWriter) -> None:
    path = stack_with(write_stack, AUTOSCALED, "two-pools", autoscale=["a100-ib"])
    graph = recorded(load_stack(str(path)))
    args = args_of(graph)
    # by hand: a100-ib holds 50 shards of 100; language has 0-29, vision 30-39 (4,000 nodes,
    # fixed), so shards 40-49 are its node groups. Half of 5,000 is below the teams' 4,000,
    # so they may go to 0, and up to 100 each: the pool stays between 4,000 and 5,000 nodes.
    a100 = [f"0:100:research-7500-a100-ib-{i:03d}" for i in range(40, 50)]
    assert values(args, "nodes") == a100 + [f"50:100:{shard}" for shard in H100_SHARDS]
    plan = plan_stack(load_stack(str(path)))
    for pool in plan.autoscaled_pools:
        assert pool.autoscaling is not None
        floor = sum(g.min_size for g in pool.autoscaling.node_groups) + sum(
            s.capacity for s in pool.shards if s.team is not None)
        assert floor >= math.ceil(pool.nodes / 2)  # the 2,500-node guard, per pool
    assert ("pool a100-ib: node groups (--nodes min:max:scale set) 10 x 0..100 (research-7500-a100-ib-040 ... "
            "research-7500-a100-ib-049); the pool between 4,000 and 5,000 nodes; 40 teams' scale sets are not node "
            "groups") in autoscaler.describe(plan)
    # the ceiling did not move: neither pool may grow past its nodes (no maxNodes)
    assert values(args, "cores-total") == [f"0:{CORES_TOTAL}"]
    # the autoscaler prefers nodes it will not remove: neither autoscaled pool
    pod = one(graph, "Deployment")["spec"]["template"]["spec"]
    # after the system pool's preference (kilonode.k8s.pods.prefer_system_pool)
    system, term = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert system["preference"]["matchExpressions"][0]["key"] == "kilonode.io/system"
    assert term["preference"]["matchExpressions"] == [
        {"key": "kilonode.io/pool", "operator": "NotIn", "values": ["a100-ib", "h100-ib"]}]


def test_the_guards_by_flag_name_and_value(graphs: dict[str, Graph]) -> None:
    args = args_of(graphs[AUTOSCALED])
    given = {name: value for name, value in map(split, args) if name not in ("nodes", "startup-taint", "status-taint")}
    assert given == {
        "cloud-provider": "azure",
        "cloud-config": "/etc/kubernetes/cloud-config/azure.json",
        "leader-elect": "true",
        # halt everything well before an outage: upstream's 45% is far too late
        "max-total-unready-percentage": "10",
        "ok-total-unready-count": "3",
        # how much one loop removes
        "max-scale-down-parallelism": "10",
        "max-drain-parallelism": "1",
        # gradual scale-up (one wave of joins at most: 327 nodes here), one pool per scale-up,
        # and time for a GPU VM to come up
        "max-nodes-per-scaleup": "100",
        "parallel-scale-up": "false",
        "max-node-provision-time": "30m",
        # h100-ib is autoscaled InfiniBand: its scale sets are fabrics, never balanced
        "balance-similar-node-groups": "false",
        # by hand: a100-ib 5,000 x 96 vCPUs + h100-ib 2,500 x 96 = 720,000; 5,000 x 900 GiB +
        # 2,500 x 1,900 GiB = 9,250,000 GiB (the VM-size catalogue). Upstream's defaults,
        # 320,000 and 6,400,000 (config/const.go), would refuse every scale-up.
        "cores-total": f"0:{CORES_TOTAL}",  # 720,064
        "memory-total": f"0:{MEMORY_TOTAL}",
        # a node with any GPU pod is full; one with DaemonSets only is empty (and removable: a node
        # goes only while its utilization is below the threshold, so not 0: eligibility.go)
        "scale-down-utilization-threshold": "0.000001",
        "scale-down-gpu-utilization-threshold": "0.000001",
        "ignore-daemonsets-utilization": "true",
        "scale-down-unneeded-time": "30m",
        "scale-down-delay-after-add": "30m",
        "expendable-pods-priority-cutoff": "-10",
        "skip-nodes-with-local-storage": "false",
        "v": "1",
    }
    assert float(given["max-total-unready-percentage"]) < 45  # stricter than upstream's default
    # an empty node's utilization (0) is below both thresholds; one GPU of eight is not
    assert 0 < float(given["scale-down-gpu-utilization-threshold"]) < 1 / 8
    # the balloons (priority at the cutoff) are not expendable: they keep their nodes
    assert int(given["expendable-pods-priority-cutoff"]) <= defaults.PRIORITY_BALLOON
    # kilonode's GPU taints, as the autoscaler must read them (kilonode.gpu.protocol)
    assert values(args, "startup-taint") == ["kilonode.io/gpu-health", "kilonode.io/gpu-unhealthy"]
    assert values(args, "status-taint") == ["kilonode.io/gpu-check"]


def test_a_cluster_without_gpu_node_groups_gets_no_gpu_taint_flags(minor_graphs: dict[int, Graph]) -> None:
    args = args_of(minor_graphs[33])
    assert values(args, "nodes") == ["1:2:local-cpu-000"]  # by hand: 2 nodes, never below 1
    assert not values(args, "startup-taint") and not values(args, "status-taint")
    # by hand: 2 x Standard_D4ds_v5 (4 vCPUs, 16 GiB)
    assert values(args, "cores-total") == ["0:8"] and values(args, "memory-total") == ["0:32"]


@pytest.mark.parametrize("minor", [32, 33, 34, 35])
def test_every_flag_passed_is_registered_at_the_pinned_tag(
    graphs: dict[str, Graph], minor_graphs: dict[int, Graph], minor: int
) -> None:
    graph = graphs[AUTOSCALED] if minor == 34 else minor_graphs[minor]
    args = args_of(graph)
    assert flag_problems(args, minor) == []
    # the same list every minor, so one table of registrations serves all four tags
    assert {split(a)[0] for a in args} <= set(FLAGS) | set(OTHER_FLAGS)


def test_a_misspelt_flag_a_flag_of_another_tag_and_a_bad_value_are_caught(graphs: dict[str, Graph]) -> None:
    args = args_of(graphs[AUTOSCALED])
    misspelt = [a.replace("--max-nodes-per-scaleup=", "--max-node-per-scaleup=") for a in args]
    assert flag_problems(misspelt, 34) == ["--max-node-per-scaleup is not registered at cluster-autoscaler-1.34.5"]
    # registered at 1.32 (deprecated), gone at 1.33
    known = {**FLAGS, **FLAGS_AT_32_ONLY}
    assert flag_problems([*args, "--max-empty-bulk-delete=10"], 32, known) == []
    assert flag_problems([*args, "--max-empty-bulk-delete=10"], 34, known) == [
        "--max-empty-bulk-delete is not registered at cluster-autoscaler-1.34.5"]
    # registered at 1.35 only: refused at every earlier tag
    newer = {**FLAGS, **FLAGS_AT_35_ONLY}
    assert flag_problems([*args, "--max-node-startup-time=30m"], 35, newer) == []
    assert flag_problems([*args, "--max-node-startup-time=30m"], 34, newer) == [
        "--max-node-startup-time is not registered at cluster-autoscaler-1.34.5"]
    bad = [a.replace("--max-node-provision-time=30m", "--max-node-provision-time=30 minutes") for a in args]
    assert flag_problems(bad, 34) == ["--max-node-provision-time=30 minutes is not a valid duration"]
    assert flag_problems([*args, "--leader-elect=yes"], 34) == ["--leader-elect given twice",
                                                                  "--leader-elect=yes is not a valid bool"]


def test_the_azure_config_it_reads_is_the_cloud_providers_with_its_own_identity_and_vmss(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan]
) -> None:
    graph = graphs[AUTOSCALED]
    c = container(graph)
    pod = one(graph, "Deployment")["spec"]["template"]["spec"]
    # follow --cloud-config: its directory is a mount of a volume that is a ConfigMap
    path = Path(values(c["args"], "cloud-config")[0])
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    [config_map] = [r.plain() for r in graph.of_type("kubernetes:core/v1:ConfigMap")
                    if r.plain()["metadata"]["name"] == volume["configMap"]["name"]
                    and r.plain()["metadata"]["namespace"] == "kube-system"]
    config = json.loads(config_map["data"][path.name])
    assert config["vmType"] == "vmss"
    cluster = plans[AUTOSCALED].cluster
    # its own user-assigned identity, not cloud-controller-manager's (the mock engine's client ID
    # for it), read from the instance metadata service; otherwise the cloud provider's azure.json
    assert config["useManagedIdentityExtension"] is True
    assert config["userAssignedIdentityID"] == f"mock-client-id:{cluster}-controllers-autoscaler-identity"
    [ccm] = [json.loads(r.plain()["data"]["azure.json"]) for r in graph.of_type("kubernetes:core/v1:ConfigMap")
             if r.plain()["metadata"]["name"] == "azure-cloud-provider"]
    assert config == ccm | {"userAssignedIdentityID": config["userAssignedIdentityID"]}
    # where the scale sets are: the pools' resource group
    assert config["resourceGroup"] == plans[AUTOSCALED].node_resource_group
    assert {vmss.plain()["resourceGroupName"] for vmss in graph.of_type("azure-native:compute:VirtualMachineScaleSet")
            } == {plans[AUTOSCALED].node_resource_group}
    assert azure_config_problems(config) == []


def test_a_key_the_autoscaler_cannot_decode_or_lacks_is_caught() -> None:
    good = {key: ("x" if kind is str else True) for key, kind in AUTOSCALER_AZURE_FIELDS.items()}
    assert azure_config_problems(good) == []
    assert azure_config_problems({**good, "disableOutboundSNAT": "yes"}) == [
        "disableOutboundSNAT: 'yes' does not decode into bool"]
    assert azure_config_problems({**good, "cloudProviderRatelimit": True}) == [
        "cloudProviderRatelimit: not a field of the autoscaler's Azure config"]
    del good["userAssignedIdentityID"]
    assert azure_config_problems(good) == ["userAssignedIdentityID: missing"]


@pytest.mark.parametrize("minor", [32, 33, 34, 35])
def test_the_rbac_is_upstreams_azure_example_at_the_tag(
    graphs: dict[str, Graph], minor_graphs: dict[int, Graph], minor: int
) -> None:
    graph = graphs[AUTOSCALED] if minor == 34 else minor_graphs[minor]
    assert one(graph, "ClusterRole")["rules"] == upstream_cluster_rules(minor)
    role = one(graph, "Role")
    assert role["metadata"]["namespace"] == "kube-system" and role["rules"] == UPSTREAM_NAMESPACE_RULES
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(graph, kind)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                      "name": "kilonode:cluster-autoscaler"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cluster-autoscaler",
                                        "namespace": "kube-system"}]
    assert one(graph, "ServiceAccount")["metadata"]["name"] == one(graph, "Deployment")["spec"]["template"][
        "spec"]["serviceAccountName"] == "cluster-autoscaler"


@pytest.mark.parametrize("minor", [32, 33, 34, 35])
def test_the_deployment_runs_on_pool_nodes_as_cloud_controller_manager_does(
    graphs: dict[str, Graph], minor_graphs: dict[int, Graph], minor: int
) -> None:
    graph = graphs[AUTOSCALED] if minor == 34 else minor_graphs[minor]
    deployment = one(graph, "Deployment")
    assert deployment["metadata"]["namespace"] == "kube-system"
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    c = container(graph)
    # by hand, from the tags read: registry.k8s.io/autoscaling/cluster-autoscaler:v<tag's version>
    version = {32: "v1.32.7", 33: "v1.33.6", 34: "v1.34.5", 35: "v1.35.2"}[minor]
    assert c["image"] == f"registry.k8s.io/autoscaling/cluster-autoscaler:{version}"
    assert c["command"] == ["/cluster-autoscaler"]  # cluster-autoscaler/Dockerfile: COPY ... /cluster-autoscaler
    # two replicas, one active (leader election), on different nodes
    assert spec["replicas"] == 2 and values(c["args"], "leader-elect") == ["true"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["priorityClassName"] == "system-cluster-critical"
    # host network (instance metadata for the identity's token), on nodes not yet initialized
    assert pod["hostNetwork"] is True
    assert {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}  # its FAQ: a full core at scale
    # --address is not passed: its default ":8085" (flags.go l.64 at 1.34.5) serves /health-check
    assert "address" not in {split(a)[0] for a in c["args"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health-check", "port": 8085}
    assert c["ports"] == [{"name": "metrics", "containerPort": 8085, "protocol": "TCP"}]
    pdb = one(graph, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"] == spec["selector"]


# A size the catalogue lacks: the plan carries no vCPUs or memory for it.
UNCATALOGUED = {"vm_size": "Standard_Unknown_v9", "vcpus": None, "memory_gib": None}


def test_the_ceilings_need_every_pools_size_in_the_catalogue(plans: dict[str, ClusterPlan]) -> None:
    plan = plans[AUTOSCALED]
    assert autoscaler.resource_ceilings(plan) == (CORES_TOTAL, MEMORY_TOTAL)
    pools = tuple(p.model_copy(update=UNCATALOGUED) if p.name == "a100-ib" else p
                  for p in plan.node_pools)
    with pytest.raises(ValueError, match="Standard_Unknown_v9 is not in kilonode's VM-size catalogue"):
        autoscaler.resource_ceilings(plan.model_copy(update={"node_pools": pools}))


def test_explain_names_the_version_the_node_groups_and_the_guards(plans: dict[str, ClusterPlan]) -> None:
    lines = autoscaler.describe(plans[AUTOSCALED])
    text = "\n".join(lines)
    assert lines[0].startswith("cluster-autoscaler v1.34.5: Deployment kube-system/cluster-autoscaler, 2 replicas")
    assert ("pool h100-ib: node groups (--nodes min:max:scale set) 25 x 50..100 "
            "(research-7500-h100-ib-000 ... research-7500-h100-ib-024); the pool between 1,250 and 2,500 nodes"
            ) in lines
    assert "a100-ib" not in text
    assert "more than 10% (and more than 3) of the cluster's nodes are unready" in text
    assert "at most 100 nodes per scale-up" in text
    assert f"cluster ceiling: {CORES_TOTAL:,} vCPUs, {MEMORY_TOTAL:,} GiB" in text
    assert "at most 10 nodes deleted at once, 1 drained" in text


def test_explain_says_so_when_a_pools_size_is_not_in_the_catalogue(plans: dict[str, ClusterPlan]) -> None:
    plan = plans[AUTOSCALED]
    pools = tuple(p.model_copy(update=UNCATALOGUED) if p.name == "h100-ib" else p
                  for p in plan.node_pools)
    lines = autoscaler.describe(plan.model_copy(update={"node_pools": pools}))
    assert lines[-1].startswith("cannot be deployed as planned: pool h100-ib: Standard_Unknown_v9 is not in")


def test_similar_node_groups_are_balanced_unless_they_are_fabrics(minor_graphs: dict[int, Graph]) -> None:
    # `local` autoscales a CPU pool: its zone shards are balanced; research-7500 (above) does not
    for graph in minor_graphs.values():
        assert values(args_of(graph), "balance-similar-node-groups") == ["true"]
