"""Gang scheduling (kilonode.k8s.scheduling): the second scheduler with the Coscheduling plugin,
its controller, the vendored CRDs and their RBAC, recorded under the mock engine and checked
against the references their consumers use: the Kubernetes OpenAPI schema of the stack's version
(kubernetes-validate), scheduler-plugins' own manifests and Go types at the pinned tags (copied
below by hand, with file and line), kube-scheduler's config API (kubernetes/kube-scheduler and
kubernetes/component-base at v0.32.7-v0.35.4), and the vendored CRD's schema for the examples in
docs/gang-scheduling.md."""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.catalog.components import components
from kilonode.catalog.vm import vm_size
from kilonode.config import load_stack
from kilonode.k8s import scheduling
from kilonode.plan import ClusterPlan, plan_stack
from kilonode.render.control_plane import scheduler_config as default_scheduler_config
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value
from tests.graphcache import recorded

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]
SUPPORTED_MINORS = [32, 33, 34, 35]
DOC = Path(__file__).resolve().parents[2] / "docs" / "gang-scheduling.md"

# --- references, copied by hand from upstream at the pinned tags ------------------------------

# git blob ids of the upstream files the CRDs are vendored from: manifests/coscheduling/crd.yaml
# and manifests/capacityscheduling/crd.yaml, the same blobs at v0.32.7, v0.33.5 and v0.34.7
# (`git rev-parse <tag>:<path>` in kubernetes-sigs/scheduler-plugins).
UPSTREAM_CRD_BLOBS = {
    "scheduling.x-k8s.io_podgroups.yaml": "8e6106d36d9daf553195478af21e0e928796b901",
    "scheduling.x-k8s.io_elasticquotas.yaml": "1272d730baf4b37207133518725c36cdd66a1b64",
}
# The releases the brief's minors pair with: README "Compatibility Matrix" (master 903da7df) and
# the tags' go.mod (k8s.io/kubernetes v1.32.7 / v1.33.5 / v1.34.7); 1.35 has only v0.35.4-devel.
RELEASES = {32: "v0.32.7", 33: "v0.33.5", 34: "v0.34.7", 35: "v0.34.7"}
# CoschedulingArgs' JSON fields per release (apis/config/v1/types.go l.28-35 at v0.32.7 and
# v0.33.5, l.28-40 at v0.34.7). The scheduler decodes its config strictly (apis/config/scheme/
# scheme.go: serializer.EnableStrict), so a field the release lacks stops it at start.
COSCHEDULING_ARGS_FIELDS = {
    "v0.32.7": {"permitWaitingTimeSeconds", "podGroupBackoffSeconds"},
    "v0.33.5": {"permitWaitingTimeSeconds", "podGroupBackoffSeconds"},
    "v0.34.7": {"permitWaitingTimeSeconds", "podGroupBackoffSeconds", "podGroupRejectPercentage"},
}
# The extension points Coscheduling implements (pkg/coscheduling/coscheduling.go l.51-55 at
# v0.34.7): multiPoint enables it at each of them.
COSCHEDULING_POINTS = {"QueueSort", "PreFilter", "PostFilter", "Permit", "Reserve"}
# kubescheduler.config.k8s.io/v1 JSON fields, the same at kubernetes/kube-scheduler v0.32.7,
# v0.33.5, v0.34.7 and v0.35.4: config/v1/types.go KubeSchedulerConfiguration l.44 (with
# component-base config/v1alpha1 DebuggingConfiguration l.60 inline), KubeSchedulerProfile
# l.139, Plugins l.179, PluginSet l.239, Plugin l.254, PluginConfig l.264; types_pluginargs.go
# NodeResourcesFitArgs l.64, ResourceSpec l.143, ScoringStrategy l.208; component-base
# config/v1alpha1/types.go LeaderElectionConfiguration l.27.
CONFIG_FIELDS = {
    "config": {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "enableProfiling",
               "enableContentionProfiling", "percentageOfNodesToScore", "podInitialBackoffSeconds",
               "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive"},
    "leaderElection": {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
                       "resourceName", "resourceNamespace"},
    "profile": {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"},
    "plugins": {"preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score", "reserve",
                "permit", "preBind", "bind", "postBind", "multiPoint"},
    "pluginSet": {"enabled", "disabled"},
    "plugin": {"name", "weight"},
    "pluginConfig": {"name", "args"},
    "NodeResourcesFit": {"ignoredResources", "ignoredResourceGroups", "scoringStrategy"},
    "scoringStrategy": {"type", "resources", "requestedToCapacityRatio"},
    "resourceSpec": {"name", "weight"},
}
# The kube-scheduler v1 config's default Lease (pkg/scheduler/apis/config/v1/defaults.go): the
# in-tree scheduler's, which the gang scheduler's replicas must never contend for.
IN_TREE_LEASE = "kube-scheduler"

# Upstream's RBAC at v0.34.7, as written there (manifests/install/charts/as-a-second-scheduler/
# templates/rbac.yaml l.1-89 and l.104-132, the chart's defaults: no NetworkOverhead,
# PreemptionToleration or SySched rules; `{{ .Values.scheduler.name }}` is the Lease's name).
UPSTREAM_SCHEDULER_ROLE = """
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create"]
- apiGroups: ["coordination.k8s.io"]
  resourceNames: ["{{ .Values.scheduler.name }}"]
  resources: ["leases"]
  verbs: ["get", "update"]
- apiGroups: [""]
  resources: ["endpoints"]
  verbs: ["create"]
- apiGroups: [""]
  resourceNames: ["{{ .Values.scheduler.name }}"]
  resources: ["endpoints"]
  verbs: ["get", "update"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["delete", "get", "list", "watch", "update"]
- apiGroups: [""]
  resources: ["bindings", "pods/binding"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch", "update"]
- apiGroups: [""]
  resources: ["replicationcontrollers", "services"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps", "extensions"]
  resources: ["replicasets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims", "persistentvolumes"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
- apiGroups: ["resource.k8s.io"]
  resources: ["deviceclasses", "resourceclaims", "resourceslices"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["storage.k8s.io"]
  resources: ["csinodes", "storageclasses" , "csidrivers" , "csistoragecapacities", "volumeattachments"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["topology.node.k8s.io"]
  resources: ["noderesourcetopologies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups", "elasticquotas", "podgroups/status", "elasticquotas/status"]
  verbs: ["get", "list", "watch", "create", "delete", "update", "patch"]
"""
UPSTREAM_CONTROLLER_ROLE = """
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["create", "get", "update"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["topology.node.k8s.io"]
  resources: ["noderesourcetopologies"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups", "elasticquotas", "podgroups/status", "elasticquotas/status"]
  verbs: ["get", "list", "watch", "create", "delete", "update", "patch"]
"""
# manifests/install/all-in-one.yaml l.1-12 at v0.34.7: what the plugins add to the scheduler.
UPSTREAM_PLUGINS_ROLE = """
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups", "elasticquotas", "podgroups/status", "elasticquotas/status"]
  verbs: ["get", "list", "watch", "create", "delete", "update", "patch"]
"""


# --- helpers ----------------------------------------------------------------------------------

def gang_objects(graph: Graph) -> list[Recorded]:
    """The Kubernetes objects the GangScheduler component creates."""
    [component] = graph.of_type("kilonode:k8s:GangScheduler")
    return [r for r in graph.resources if r.type.startswith("kubernetes:") and r.custom
            and r.parent == component.name]


def by_name(graph: Graph) -> dict[str, dict[str, Any]]:
    """The component's objects by kind/name."""
    return {f"{r.plain()['kind']}/{r.plain()['metadata']['name']}": r.plain() for r in gang_objects(graph)}


def config_of(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = objects[f"ConfigMap/{scheduling.SCHEDULER}"]["data"]
    return yaml.safe_load(data[scheduling.CONFIG_FILE])


def requests_of(rules: list[dict[str, Any]], lease: str) -> set[tuple[str, str, str, str | None]]:
    """Every (group, resource, verb, name) a rule list names; None: any name."""
    out = set()
    for rule in rules:
        names = [n.replace("{{ .Values.scheduler.name }}", lease) for n in rule.get("resourceNames") or []]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out |= {(group, resource, verb, name) for name in (names or [None])}
    return out


def rbac_allows(rules: list[dict[str, Any]], request: tuple[str, str, str, str | None]) -> bool:
    """RBAC's rule match (plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows; no wildcards are
    used here): a rule with resourceNames allows only requests for those names."""
    group, resource, verb, name = request
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
               and (not rule.get("resourceNames") or name in rule["resourceNames"]) for rule in rules)


def uncovered(upstream: str, rules: list[dict[str, Any]]) -> list[tuple[str, str, str, str | None]]:
    return sorted((r for r in requests_of(yaml.safe_load(upstream), scheduling.LEASE) if not rbac_allows(rules, r)),
                  key=str)


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema with unknown fields refused where it lists properties: the apiserver
    prunes them silently, and `kubectl apply` (field validation Strict) refuses them."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def pod_group_schema() -> dict[str, Any]:
    [crd] = [d for d in scheduling.crd_documents() if d["spec"]["names"]["kind"] == "PodGroup"]
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    return strict_schema(version["schema"]["openAPIV3Schema"])


def pod_group_errors(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(pod_group_schema())
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]


def doc_blocks() -> list[list[dict[str, Any]]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return [[d for d in yaml.safe_load_all(block) if d] for block in blocks]


def gang_pods(block: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], int]]:
    """(metadata, pod spec, how many pods) for each Pod and Job of a block."""
    out = []
    for doc in block:
        if doc["kind"] == "Pod":
            out.append((doc["metadata"], doc["spec"], 1))
        elif doc["kind"] == "Job":
            template = doc["spec"]["template"]
            meta = {**template["metadata"], "namespace": doc["metadata"]["namespace"]}
            out.append((meta, template["spec"], doc["spec"]["parallelism"]))
    return out


def gang_problems(block: list[dict[str, Any]]) -> list[str]:
    """What makes a block's pods no gang of kilonode-gang (hand rules from the plugin's code:
    pkg/coscheduling/core/core.go Permit lets every pod through when minMember is 0 or unset;
    the label names the group in the pod's own namespace, util.GetPodGroupFullName)."""
    problems = []
    groups = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in block if d["kind"] == "PodGroup"}
    members: dict[tuple[str, str], int] = {}
    for meta, spec, count in gang_pods(block):
        if spec.get("schedulerName") != scheduling.GANG_SCHEDULER_NAME:
            problems.append(f"{meta.get('name')}: schedulerName {spec.get('schedulerName')!r}")
        key = (meta["namespace"], meta.get("labels", {}).get(scheduling.POD_GROUP_LABEL, ""))
        if key not in groups:
            problems.append(f"{meta.get('name')}: no PodGroup {key}")
        members[key] = members.get(key, 0) + count
    for key, group in groups.items():
        min_member = group.get("spec", {}).get("minMember")
        if not isinstance(min_member, int) or min_member < 1:
            problems.append(f"PodGroup {key}: minMember {min_member!r} makes it no gang")
        elif members.get(key, 0) < min_member:
            problems.append(f"PodGroup {key}: minMember {min_member} > its {members.get(key, 0)} pods")
    return problems


# --- the objects ------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_every_object_is_valid_against_the_openapi_schema_of_the_stacks_version(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    objects = gang_objects(graphs[stack])
    plan = plans[stack]
    # every GPU pool InfiniBand: the fabric and gang-size policies and their bindings
    fabric = bool(plan.gpu_pools) and all(p.infiniband for p in plan.gpu_pools)
    # 2 CRDs; 2 x (ServiceAccount, ClusterRole, binding, Deployment, PDB); the scheduler's 2
    # system-role bindings; the auth-reader RoleBinding; the config ConfigMap
    assert sorted(r.type.rsplit(":", 1)[1] for r in objects) == sorted(
        ["CustomResourceDefinition"] * 2 + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
                                            "PodDisruptionBudget"] * 2
        + ["ClusterRoleBinding"] * 2 + ["RoleBinding", "ConfigMap"]
        + (["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2 if fabric else []))
    assert len(objects) == 16 + (4 if fabric else 0)
    for record in objects:
        shared.validate_object(record.plain(), f"1.{plans[stack].kubernetes_minor}.0")
    # the check can fail: a misspelt field of the CRD is refused
    crd = next(r.plain() for r in objects if r.type.endswith("CustomResourceDefinition"))
    crd["spec"]["versions"][0]["servd"] = crd["spec"]["versions"][0].pop("served")
    with pytest.raises(kubernetes_validate.ValidationError, match="servd"):
        kubernetes_validate.validate(crd, "1.34.0", strict=True)


def test_the_component_is_in_every_stack_behind_the_programs_provider(graphs: dict[str, Graph]) -> None:
    for stack, graph in graphs.items():
        [component] = graph.of_type("kilonode:k8s:GangScheduler")
        assert component.name == f"{stack}-k8s-gang" and component.parent == f"{stack}-k8s"
        assert {r.provider for r in gang_objects(graph)} == {f"{stack}-k8s-provider"}


def test_the_crds_are_upstreams_files_byte_for_byte_and_recorded_as_written() -> None:
    for file, blob in UPSTREAM_CRD_BLOBS.items():
        text = (scheduling.CRD_DIR / file).read_bytes()
        header, body = text.split(b"# --- upstream ---\n", 1)
        assert all(line.startswith(b"#") for line in header.splitlines()), file
        assert blob.encode() in header  # the header names what it vendors
        assert hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest() == blob, file
    # one changed byte would not pass: minMember's minimum edited from 1 to 0
    body = (scheduling.CRD_DIR / "scheduling.x-k8s.io_podgroups.yaml").read_bytes().split(b"# --- upstream ---\n")[1]
    edited = body.replace(b"minimum: 1\n", b"minimum: 0\n")
    assert edited != body
    assert hashlib.sha1(b"blob %d\0" % len(edited) + edited).hexdigest() != UPSTREAM_CRD_BLOBS[
        "scheduling.x-k8s.io_podgroups.yaml"]


def test_the_recorded_crds_are_the_vendored_documents(graphs: dict[str, Graph]) -> None:
    recorded = {r.plain()["metadata"]["name"]: r.plain() for r in gang_objects(graphs["research-7500"])
                if r.type.endswith("CustomResourceDefinition")}
    vendored = {d["metadata"]["name"]: d for d in scheduling.crd_documents()}
    assert set(recorded) == {"podgroups.scheduling.x-k8s.io", "elasticquotas.scheduling.x-k8s.io"}
    for name, document in vendored.items():
        assert recorded[name]["spec"] == document["spec"], name
        assert recorded[name]["metadata"]["annotations"] == document["metadata"]["annotations"]
        assert [v["name"] for v in document["spec"]["versions"]] == ["v1alpha1"]  # what the tags ship


# --- the scheduler's configuration --------------------------------------------------------------

def check_fields(config: dict[str, Any], release: str) -> list[str]:
    """Every field of the config is one kube-scheduler's v1 types (or the release's
    CoschedulingArgs) declare: an unknown field stops the strict decoder at start."""
    problems = []

    def only(obj: dict[str, Any], allowed: set[str], where: str) -> None:
        problems.extend(f"{where}.{key}" for key in set(obj) - allowed)

    only(config, CONFIG_FIELDS["config"], "")
    only(config["leaderElection"], CONFIG_FIELDS["leaderElection"], "leaderElection")
    for profile in config["profiles"]:
        only(profile, CONFIG_FIELDS["profile"], "profile")
        only(profile["plugins"], CONFIG_FIELDS["plugins"], "plugins")
        for point, plugin_set in profile["plugins"].items():
            only(plugin_set, CONFIG_FIELDS["pluginSet"], point)
            for plugin in plugin_set.get("enabled", []) + plugin_set.get("disabled", []):
                only(plugin, CONFIG_FIELDS["plugin"], point)
        for entry in profile["pluginConfig"]:
            only(entry, CONFIG_FIELDS["pluginConfig"], "pluginConfig")
            args = entry["args"]
            if entry["name"] == "Coscheduling":
                only(args, COSCHEDULING_ARGS_FIELDS[release], "Coscheduling")
            elif entry["name"] == "NodeResourcesFit":
                only(args, CONFIG_FIELDS["NodeResourcesFit"], "NodeResourcesFit")
                only(args["scoringStrategy"], CONFIG_FIELDS["scoringStrategy"], "scoringStrategy")
                for spec in args["scoringStrategy"]["resources"]:
                    only(spec, CONFIG_FIELDS["resourceSpec"], "resources")
            else:
                problems.append(f"pluginConfig {entry['name']}: not checked")
    return problems


@pytest.mark.parametrize("stack", STACKS)
def test_the_profile_is_kilonode_gang_with_coscheduling_and_the_default_profiles_packing(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    config = config_of(by_name(graphs[stack]))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    [profile] = config["profiles"]
    assert profile["schedulerName"] == "kilonode-gang"
    plugins = profile["plugins"]
    # queueSort: Coscheduling, PrioritySort off (a profile takes exactly one queue sort)
    assert plugins["queueSort"] == {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "PrioritySort"}]}
    # and at its other points through multiPoint, as upstream's manifests/coscheduling config
    assert plugins["multiPoint"] == {"enabled": [{"name": "Coscheduling"}]}
    # no extension point named apart from multiPoint and queueSort would be one it lacks
    assert {point[0].upper() + point[1:] for point in plugins} - {"MultiPoint", "Score"} <= COSCHEDULING_POINTS
    args = {entry["name"]: entry["args"] for entry in profile["pluginConfig"]}
    # packing kept: MostAllocated, InterPodAffinity 2, no BalancedAllocation, GPUs scored when present
    assert args["NodeResourcesFit"]["scoringStrategy"]["type"] == "MostAllocated"
    scored = {r["name"]: r["weight"] for r in args["NodeResourcesFit"]["scoringStrategy"]["resources"]}
    assert scored == {"cpu": 1, "memory": 1, **({"nvidia.com/gpu": 1} if plans[stack].gpu_pools else {})}
    assert {"name": "InterPodAffinity", "weight": 2} in plugins["score"]["enabled"]
    assert {"name": "NodeResourcesBalancedAllocation"} in plugins["score"]["disabled"]
    # ... exactly as the default scheduler on the apiserver VMs packs
    default = yaml.safe_load(default_scheduler_config(plans[stack]))
    [default_profile] = default["profiles"]
    assert plugins["score"] == default_profile["plugins"]["score"]
    assert [args["NodeResourcesFit"]] == [e["args"] for e in default_profile["pluginConfig"]
                                          if e["name"] == "NodeResourcesFit"]
    # a permit wait that the framework honours (>0; capped at 15 min, framework.go maxTimeout)
    assert 0 < args["Coscheduling"]["permitWaitingTimeSeconds"] <= 15 * 60
    assert config["enableProfiling"] is False


@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_the_config_names_only_fields_its_release_decodes(minor: int) -> None:
    release = RELEASES[minor]
    for gpu in (False, True):
        assert check_fields(scheduling.scheduler_config(gpu), release) == []
    # the check can fail: a field of v0.34 only, a misspelt one
    config = scheduling.scheduler_config(True)
    config["profiles"][0]["pluginConfig"][0]["args"]["podGroupRejectPercentage"] = 10
    config["leaderElection"]["leaseName"] = "x"
    problems = check_fields(config, release)
    assert "leaderElection.leaseName" in problems
    assert ("Coscheduling.podGroupRejectPercentage" in problems) == (release != "v0.34.7")


def test_leader_election_uses_a_lease_of_its_own_which_its_role_may_hold(graphs: dict[str, Graph]) -> None:
    objects = by_name(graphs["research-7500"])
    election = config_of(objects)["leaderElection"]
    assert election["leaderElect"] is True and election["resourceLock"] == "leases"
    assert election["resourceNamespace"] == "kube-system"
    assert election["resourceName"] == "kilonode-gang" != IN_TREE_LEASE
    rules = objects[f"ClusterRole/kilonode:{scheduling.SCHEDULER}"]["rules"]
    lease = election["resourceName"]
    for verb in ("get", "update"):
        assert rbac_allows(rules, ("coordination.k8s.io", "leases", verb, lease))
        assert not rbac_allows(rules, ("coordination.k8s.io", "leases", verb, IN_TREE_LEASE))
    assert rbac_allows(rules, ("coordination.k8s.io", "leases", "create", None))


# --- versions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("minor", SUPPORTED_MINORS)
def test_each_supported_minor_has_its_release_pinned(minor: int) -> None:
    gang = components().scheduler_plugins
    assert gang.release("scheduler-plugins", f"1.{minor}.3") == RELEASES[minor]
    assert (minor in gang.skew) == (minor == 35)


@pytest.mark.parametrize("version", ["1.31.9", "1.36.0"])
def test_a_minor_without_a_pinned_release_is_refused_by_name(version: str) -> None:
    with pytest.raises(ValueError, match=f"no scheduler-plugins release is pinned for Kubernetes {version}"):
        components().scheduler_plugins.release("scheduler-plugins", version)


def images(graph: Graph) -> dict[str, str]:
    return {r.plain()["metadata"]["name"]: r.plain()["spec"]["template"]["spec"]["containers"][0]["image"]
            for r in gang_objects(graph) if r.type.endswith(":Deployment")}


@pytest.mark.parametrize("stack", STACKS)
def test_shipped_stacks_run_their_minors_release(graphs: dict[str, Graph], plans: dict[str, ClusterPlan],
                                                 stack: str) -> None:
    release = RELEASES[plans[stack].kubernetes_minor]
    assert images(graphs[stack]) == {
        "kilonode-gang-scheduler": f"registry.k8s.io/scheduler-plugins/kube-scheduler:{release}",
        "kilonode-gang-controller": f"registry.k8s.io/scheduler-plugins/controller:{release}",
    }


# By hand from registry.k8s.io's promotion manifest (kubernetes/k8s.io@0e8a05ca
# registry.k8s.io/images/k8s-staging-scheduler-plugins/images.yaml): v0.33.5's digests; v0.34.7 is
# not in it, so by tag.
V0_33_5 = {"scheduler": "@sha256:eb2474076eacc7b6ed0663a08ab87383caade288ebee7a4774d89c1bb4a1acee",
           "controller": "@sha256:029701e1adb7630436d340dca403feb8c48e79e4619233a9ce75e42d06a4b2c4"}


@pytest.mark.parametrize(("kubernetes_version", "release", "digests"),
                         [("1.33.5", "v0.33.5", V0_33_5), ("1.35.4", "v0.34.7", {"scheduler": "", "controller": ""})])
def test_a_stack_written_with_another_minor_gets_that_minors_release(
    write_stack: StackWriter, kubernetes_version: str, release: str, digests: dict[str, str]
) -> None:
    cluster = shipped_cluster_value("local")
    cluster["kubernetesVersion"] = kubernetes_version
    path = write_stack(cluster)
    graph = recorded(load_stack(str(path)))
    assert images(graph) == {
        "kilonode-gang-scheduler": f"registry.k8s.io/scheduler-plugins/kube-scheduler:{release}{digests['scheduler']}",
        "kilonode-gang-controller": f"registry.k8s.io/scheduler-plugins/controller:{release}{digests['controller']}",
    }
    for record in gang_objects(graph):
        shared.validate_object(record.plain(), kubernetes_version)
    lines = scheduling.describe(plan_stack(load_stack(str(path))))
    skewed = [line for line in lines if "version skew policy" in line]
    assert len(skewed) == (1 if kubernetes_version.startswith("1.35.") else 0)


# --- RBAC ---------------------------------------------------------------------------------------

def test_the_rbac_grants_exactly_what_upstreams_manifests_grant(graphs: dict[str, Graph]) -> None:
    objects = by_name(graphs["research-7500"])
    scheduler = objects[f"ClusterRole/kilonode:{scheduling.SCHEDULER}"]["rules"]
    controller = objects[f"ClusterRole/kilonode:{scheduling.CONTROLLER}"]["rules"]
    assert uncovered(UPSTREAM_SCHEDULER_ROLE, scheduler) == []
    assert uncovered(UPSTREAM_PLUGINS_ROLE, scheduler) == []
    assert uncovered(UPSTREAM_CONTROLLER_ROLE, controller) == []
    # and no more than upstream's chart
    assert requests_of(scheduler, scheduling.LEASE) == requests_of(yaml.safe_load(UPSTREAM_SCHEDULER_ROLE),
                                                                   scheduling.LEASE)
    assert requests_of(controller, scheduling.LEASE) == requests_of(yaml.safe_load(UPSTREAM_CONTROLLER_ROLE),
                                                                    scheduling.LEASE)
    # the check can fail: without podgroups/status, the controller could not write a status
    without = [{**rule, "resources": [r for r in rule["resources"] if r != "podgroups/status"]} for rule in controller]
    assert ("scheduling.x-k8s.io", "podgroups/status", "update", None) in uncovered(UPSTREAM_CONTROLLER_ROLE,
                                                                                     without)


def test_each_role_is_bound_to_its_service_account_and_the_scheduler_to_the_in_tree_roles(
    graphs: dict[str, Graph],
) -> None:
    objects = by_name(graphs["research-7500"])
    bindings = {name.split("/", 1)[1]: (b["roleRef"]["kind"], b["roleRef"]["name"],
                                        [(s["kind"], s["name"], s.get("namespace")) for s in b["subjects"]])
                for name, b in objects.items() if name.startswith(("ClusterRoleBinding/", "RoleBinding/"))}
    scheduler_sa = ("ServiceAccount", "kilonode-gang-scheduler", "kube-system")
    controller_sa = ("ServiceAccount", "kilonode-gang-controller", "kube-system")
    assert bindings == {
        "kilonode:kilonode-gang-scheduler": ("ClusterRole", "kilonode:kilonode-gang-scheduler", [scheduler_sa]),
        "kilonode:kilonode-gang-controller": ("ClusterRole", "kilonode:kilonode-gang-controller", [controller_sa]),
        # as the kube-scheduler user is bound (all-in-one.yaml; the multiple-schedulers recipe)
        "kilonode:kilonode-gang-scheduler:kube-scheduler": ("ClusterRole", "system:kube-scheduler", [scheduler_sa]),
        "kilonode:kilonode-gang-scheduler:volume-scheduler": ("ClusterRole", "system:volume-scheduler",
                                                              [scheduler_sa]),
        # the chart's sched-plugins::extension-apiserver-authentication-reader, both accounts
        "kilonode:kilonode-gang:extension-apiserver-authentication-reader": (
            "Role", "extension-apiserver-authentication-reader", [scheduler_sa, controller_sa]),
    }
    assert objects["RoleBinding/kilonode:kilonode-gang:extension-apiserver-authentication-reader"]["metadata"][
        "namespace"] == "kube-system"


# --- the Deployments ----------------------------------------------------------------------------

@pytest.mark.parametrize("app", ["kilonode-gang-scheduler", "kilonode-gang-controller"])
def test_two_replicas_on_two_nodes_system_critical_with_requests_after_the_crds(
    graphs: dict[str, Graph], app: str
) -> None:
    graph = graphs["research-7500"]
    objects = by_name(graph)
    deployment = objects[f"Deployment/{app}"]
    assert deployment["metadata"]["namespace"] == "kube-system"
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["serviceAccountName"] == app
    # the default scheduler places them: the gang scheduler must not wait for itself
    assert "schedulerName" not in pod
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    assert spec["selector"]["matchLabels"] == term["labelSelector"]["matchLabels"]
    [container] = pod["containers"]
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert container["securityContext"]["runAsNonRoot"] is True
    pdb = objects[f"PodDisruptionBudget/{app}"]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": spec["selector"]}
    record = next(r for r in gang_objects(graph) if r.type.endswith(":Deployment")
                  and r.plain()["metadata"]["name"] == app)
    assert {"research-7500-k8s-gang-crd-podgroups", "research-7500-k8s-gang-crd-elasticquotas"} <= set(
        record.depends_on)


def test_the_scheduler_reads_the_config_map_at_the_path_its_flag_names(graphs: dict[str, Graph]) -> None:
    objects = by_name(graphs["research-7500"])
    pod = objects["Deployment/kilonode-gang-scheduler"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["/bin/kube-scheduler"]
    [flag] = container["args"]
    path = flag.removeprefix("--config=")
    [mount] = container["volumeMounts"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = objects[f"ConfigMap/{volume['configMap']['name']}"]
    assert path.rsplit("/", 1) == [mount["mountPath"], scheduling.CONFIG_FILE]
    assert scheduling.CONFIG_FILE in config_map["data"]
    # the probes reach the secure port over HTTPS, as upstream's chart probes it
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}


def test_the_controller_runs_with_leader_election_and_probes_on_its_probe_port(graphs: dict[str, Graph]) -> None:
    pod = by_name(graphs["research-7500"])["Deployment/kilonode-gang-controller"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # cmd/controller/app/options.go: --enableLeaderElection (bool), --probeAddr default :8081
    assert container["args"] == ["--enableLeaderElection"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8081}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8081}


# --- the documentation's examples ---------------------------------------------------------------

def test_the_docs_examples_validate_and_are_gangs_of_kilonode_gang() -> None:
    blocks = doc_blocks()
    assert [sorted(d["kind"] for d in block) for block in blocks] == [
        ["Pod", "Pod", "PodGroup"], ["Job", "PodGroup", "Service"]]
    for block in blocks:
        for doc in block:
            if doc["kind"] == "PodGroup":
                assert doc["apiVersion"] == scheduling.POD_GROUP_API_VERSION
                assert pod_group_errors(doc) == [], doc["metadata"]["name"]
            else:
                for minor in SUPPORTED_MINORS:
                    shared.validate_object(doc, f"1.{minor}.0")
        assert gang_problems(block) == []
    # a 2-pod gang and a 100-pod gang, each of whole GPU nodes
    sizes = [sum(count for _, _, count in gang_pods(block)) for block in blocks]
    assert sizes == [2, 100]
    assert [next(d for d in b if d["kind"] == "PodGroup")["spec"]["minMember"] for b in blocks] == [2, 100]


def test_the_docs_examples_ask_for_whole_nodes_and_leave_headroom(plans: dict[str, ClusterPlan]) -> None:
    sizes = [vm_size(pool.vm_size) for pool in plans["research-7500"].gpu_pools]
    assert all(sizes)
    smallest_cpu = min(s.vcpus for s in sizes if s)
    smallest_memory = min(s.memory_gib for s in sizes if s)
    for block in doc_blocks():
        for _, spec, _ in gang_pods(block):
            [container] = spec["containers"]
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert requests["nvidia.com/gpu"] == limits["nvidia.com/gpu"] == 8
            assert all(s.gpus == 8 for s in sizes if s)
            # the race caveat: about 15% of the smallest GPU size left to the default scheduler
            assert float(requests["cpu"]) <= 0.85 * smallest_cpu
            assert float(requests["memory"].removesuffix("Gi")) <= 0.85 * smallest_memory


def test_the_checks_on_the_examples_can_fail() -> None:
    pair, run = doc_blocks()
    group = next(d for d in pair if d["kind"] == "PodGroup")
    for broken, match in (({"minMember": "2"}, "is not of type 'integer'"),
                          ({"minMember": 0}, "less than the minimum of 1"),
                          ({"minMember": 2, "minMembers": 2}, "Additional properties")):
        errors = pod_group_errors({**group, "spec": broken})
        assert any(match in e for e in errors), (broken, errors)
    # upstream's schema does not require minMember (`json:"minMember,omitempty"`): a PodGroup
    # without it is accepted by the apiserver and gangs nothing; the examples' own check refuses it
    assert pod_group_errors({**group, "spec": {}}) == []
    assert gang_problems([{**group, "spec": {}}, *pair[1:]]) == [
        "PodGroup ('research', 'allreduce-pair'): minMember None makes it no gang"]
    # a pod of the default scheduler, a label naming no group, a gang larger than its pods
    stray = copy.deepcopy(pair)
    stray[1]["spec"]["schedulerName"] = "default-scheduler"
    stray[2]["metadata"]["labels"][scheduling.POD_GROUP_LABEL] = "other"
    problems = gang_problems(stray)
    assert "allreduce-pair-0: schedulerName 'default-scheduler'" in problems
    assert "allreduce-pair-1: no PodGroup ('research', 'other')" in problems
    assert "PodGroup ('research', 'allreduce-pair'): minMember 2 > its 1 pods" in problems
    # the OpenAPI check refuses a misspelt field of the Job
    job = copy.deepcopy(next(d for d in run if d["kind"] == "Job"))
    job["spec"]["template"]["spec"]["schedulerNmae"] = job["spec"]["template"]["spec"].pop("schedulerName")
    with pytest.raises(kubernetes_validate.ValidationError, match="schedulerNmae"):
        kubernetes_validate.validate(job, "1.34.0", strict=True)


def test_the_doc_names_every_pinned_release_and_the_components_names() -> None:
    text = DOC.read_text()
    for minor, release in RELEASES.items():
        assert re.search(rf"\| 1\.{minor} \| {re.escape(release)}", text), minor
    for name in (scheduling.GANG_SCHEDULER_NAME, scheduling.POD_GROUP_LABEL, scheduling.SCHEDULER,
                 scheduling.CONTROLLER, f"permitWaitingTimeSeconds: {scheduling.PERMIT_WAITING_TIME_SECONDS}"):
        assert name in text, name


# --- what `kilonode explain` says ---------------------------------------------------------------

def test_describe_names_the_scheduler_its_release_and_what_a_job_sets(plans: dict[str, ClusterPlan]) -> None:
    lines = scheduling.describe(plans["research-7500"])
    text = "\n".join(lines)
    assert "schedulerName kilonode-gang" in lines[0]
    assert "scheduler-plugins v0.34.7 (registry.k8s.io/scheduler-plugins/kube-scheduler:v0.34.7)" in lines[0]
    assert "NodeResourcesFit MostAllocated on cpu, memory, nvidia.com/gpu" in text
    assert "scheduling.x-k8s.io/pod-group: <PodGroup name>" in text and "spec.minMember" in text
    assert "permit wait 300 s" in text
    assert "largest fabric (100 nodes, 800 GPUs) is refused (kilonode-gang-size)" in text
    assert "kilonode-gang-size" not in "\n".join(scheduling.describe(plans["research-2500"]))
    assert "NodeResourcesFit MostAllocated on cpu, memory;" in "\n".join(scheduling.describe(plans["local"]))


def fabric_admitted(pod: dict[str, Any]) -> bool:
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(scheduling.GANG_FABRIC_RULE))
    return bool(program.evaluate({"object": celpy.json_to_cel(pod)}))


def test_a_gangs_gpu_pods_keep_to_one_fabric(graphs: dict[str, Graph]) -> None:
    # research-7500 (every GPU pool InfiniBand) has the policy; research-2500's GPU pool has no
    # InfiniBand (no fabric label), where the rule would strand every gang: none there
    policies = {stack: [r.plain() for r in gang_objects(graph) if r.type.endswith(":ValidatingAdmissionPolicy")]
                for stack, graph in graphs.items()}
    [policy] = [p for p in policies["research-7500"] if p["metadata"]["name"] == "kilonode-gang-fabric"]
    assert policy["spec"]["validations"][0]["expression"] == scheduling.GANG_FABRIC_RULE
    assert policies["research-2500"] == [] and policies["local"] == []
    # the docs' examples pass it, as written
    for block in doc_blocks():
        for meta, spec, _ in gang_pods(block):
            assert fabric_admitted({"metadata": meta, "spec": spec}), meta
    meta, spec, _ = gang_pods(doc_blocks()[0])[0]
    # without the affinity: refused; with it to another group: refused
    bare = {**spec, "affinity": {}}
    assert not fabric_admitted({"metadata": meta, "spec": bare})
    other = copy.deepcopy(spec)
    other["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"][
        "matchLabels"]["scheduling.x-k8s.io/pod-group"] = "someone-else"
    assert not fabric_admitted({"metadata": meta, "spec": other})
    # an explicit opt-in to crossing fabrics, a gang pod without GPUs, a pod of no gang: admitted
    crossing = {**meta, "annotations": {"kilonode.io/cross-fabric": "true"}}
    assert fabric_admitted({"metadata": crossing, "spec": bare})
    cpu_only = {**bare, "containers": [{"name": "c", "image": "x", "resources": {"limits": {"cpu": "1"}}}]}
    assert fabric_admitted({"metadata": meta, "spec": cpu_only})
    assert fabric_admitted({"metadata": {"name": "solo"}, "spec": bare})


def gang_size_admitted(rule: str, pod_group: dict[str, Any]) -> bool:
    import celpy

    env = celpy.Environment()
    return bool(env.program(env.compile(rule)).evaluate({"object": celpy.json_to_cel(pod_group)}))


def test_a_pod_group_larger_than_the_largest_fabric_is_refused_up_front(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    policies = {stack: {r.plain()["metadata"]["name"]: r.plain() for r in gang_objects(graph)
                        if r.type.endswith(":ValidatingAdmissionPolicy")} for stack, graph in graphs.items()}
    policy = policies["research-7500"]["kilonode-gang-size"]
    [match] = policy["spec"]["matchConstraints"]["resourceRules"]
    # the group and version the CRD serves (the vendored CRD), podgroups, creates and updates
    assert (match["apiGroups"], match["apiVersions"], match["resources"]) == (
        ["scheduling.x-k8s.io"], ["v1alpha1"], ["podgroups"])
    crd = yaml.safe_load((Path(scheduling.__file__).parent / "crds" / "scheduling.x-k8s.io_podgroups.yaml").read_text())
    assert (crd["spec"]["group"], [v["name"] for v in crd["spec"]["versions"]]) == ("scheduling.x-k8s.io",
                                                                                   ["v1alpha1"])
    # research-7500's largest fabric: h100-ib's scale sets of 100 VMs x 8 GPUs (the autoscaler's
    # ceiling for its shared shards), read from the plan, not restated
    ib = [p for p in plans["research-7500"].gpu_pools if p.infiniband]
    nodes = max(max(s.capacity for s in p.shards) for p in ib)
    assert scheduling.largest_fabric(plans["research-7500"]) == (100, 800) and nodes <= 100
    rule = policy["spec"]["validations"][0]["expression"]
    assert "800" in rule and "100" in rule
    assert "kilonode-gang-size" not in policies["research-2500"] and not policies["local"]

    def group(spec: dict[str, Any], **annotations: str) -> dict[str, Any]:
        return {"metadata": {"name": "g", "annotations": annotations}, "spec": spec}

    # the docs' PodGroups pass it, as written
    for block in doc_blocks():
        for doc in block:
            if doc["kind"] == "PodGroup":
                assert gang_size_admitted(rule, doc), doc["metadata"]
    assert gang_size_admitted(rule, group({"minMember": 100}))
    # one node more than a fabric holds: refused; stated as GPUs of shared nodes: judged by them
    assert not gang_size_admitted(rule, group({"minMember": 101}))
    assert gang_size_admitted(rule, group({"minMember": 200, "minResources": {"nvidia.com/gpu": 200}}))
    assert gang_size_admitted(rule, group({"minMember": 200, "minResources": {"nvidia.com/gpu": "800"}}))
    assert not gang_size_admitted(rule, group({"minMember": 2, "minResources": {"nvidia.com/gpu": "801"}}))
    assert not gang_size_admitted(rule, group({"minMember": 2, "minResources": {"nvidia.com/gpu": "1k"}}))
    # the opt-in to crossing fabrics: admitted at any size
    assert gang_size_admitted(rule, group({"minMember": 1000}, **{"kilonode.io/cross-fabric": "true"}))
    assert not gang_size_admitted(rule, group({"minMember": 1000}, **{"kilonode.io/cross-fabric": "yes"}))
