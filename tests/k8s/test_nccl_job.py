"""The NCCL all-reduce gang `kilonode gpu nccl-job` generates (kilonode.k8s.nccl_job), checked
against what consumes it: the Kubernetes OpenAPI schema of every supported minor and the vendored
PodGroup CRD; the cluster's own admission rules (gang-fabric and team-borrowing CEL, evaluated
with cel-python, and PodSecurity `baseline`, the default of every unlabelled namespace, with the
project's port of its checks); the pool's nodes as the render registers them (labels and
taints); the image's topology file (node-image/binaries.toml), delivered in a ConfigMap; nccl-
tests' bus bandwidth; and docs/nccl-job.md, whose YAML blocks must be the generator's output.
Each check is shown failing on a seeded break.

The topology files are Azure/azhpc-images' and are not in this repository: the tests use a
stand-in XML, pinned by monkeypatching the catalogue's digest where the pin is read."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import shlex
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from kilonode.catalog.binaries import load as load_binaries
from kilonode.catalog.components import components as load_components
from kilonode.cli import app
from kilonode.digest import sha256_text
from kilonode.image import topology
from kilonode.image.binaries import download_cache
from kilonode.image.recipe import load_recipe, read_list
from kilonode.k8s import gang, nccl_allreduce, nccl_job
from kilonode.k8s.capacity import BORROW_RULE
from kilonode.k8s.nccl_job import NcclJobError, NcclJobRequest, NcclTopology
from kilonode.node.gpu import protocol
from kilonode.plan import ClusterPlan, defaults, wellknown
from kilonode.preflight.nodes import KUBELET_CONFIG, KUBELET_UNIT, _pairs, _taints, flags_of, unit_exec_args
from kilonode.preflight.placement import Taint, selector_mismatch, untolerated
from kilonode.render.pool import nccl_conf
from tests import shared
from tests.golden.update import NCCL_JOB_DOC, NCCL_JOB_MARKER, nccl_job_doc
from tests.k8s import pod_security_standards as pss
from tests.k8s.test_scheduling import SUPPORTED_MINORS, fabric_admitted, gang_problems, pod_group_errors

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
SHIPPED_POOLS = ("h100-ib", "a100-ib")
# the variants every structural check runs over: each shipped size, a team's job, a gang across fabrics
REQUESTS = [
    NcclJobRequest(pool="h100-ib", namespace="research"),
    NcclJobRequest(pool="a100-ib", namespace="research"),
    NcclJobRequest(pool="a100-ib", namespace="language", team="language", nodes=4),
    NcclJobRequest(pool="a100-ib", namespace="research", nodes=150, cross_fabric=True, name="wide"),
]


# a stand-in for a family's topology file (the real ones are Azure's, not copied here)
def stand_in_text(family: str) -> str:
    return f'<system version="1"><!-- kilonode test stand-in for {family} --><cpu numaid="0"/></system>\n'


def stand_in(family: str = "ndv4") -> NcclTopology:
    text = stand_in_text(family)
    return NcclTopology(wellknown.nccl_topology_component(family), sha256_text(text), text)


@pytest.fixture(scope="module")
def plan() -> ClusterPlan:
    return shared.plan(STACK)


def build(plan: ClusterPlan, request: NcclJobRequest) -> list[dict[str, Any]]:
    """The generator's objects, with the stand-in topology file of the pool's family."""
    family = nccl_job.gpu_pool(plan, request.pool).nccl_topology
    assert family is not None
    return nccl_job.nccl_job(plan, request, stand_in(family))


def objects_of(plan: ClusterPlan, request: NcclJobRequest) -> dict[str, dict[str, Any]]:
    """By kind; the topology file's ConfigMap as "Topology" (the benchmark's is "ConfigMap")."""
    return {"Topology" if doc["metadata"]["name"] == nccl_job.topology_config_map_name(request) else doc["kind"]: doc
            for doc in build(plan, request)}


def pod_of(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Job's pod as the apiserver's admission sees it: template metadata, the namespace."""
    job = objects["Job"]
    template = job["spec"]["template"]
    return {"metadata": {**template["metadata"], "namespace": job["metadata"]["namespace"]},
            "spec": template["spec"]}


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


# --- docs/nccl-job.md: the generator's output, per shipped size ----------------------------------

def doc_blocks() -> list[tuple[str, list[dict[str, Any]]]]:
    """(command, documents) for each generated block of the page."""
    text = NCCL_JOB_DOC.read_text()
    return [(m.group(2), [d for d in yaml.safe_load_all(m.group(3).removeprefix("\n```yaml\n").removesuffix("```\n"))
                          if d])
            for m in NCCL_JOB_MARKER.finditer(text)]


def test_the_docs_blocks_are_the_commands_output_for_each_shipped_size(plan: ClusterPlan) -> None:
    text = NCCL_JOB_DOC.read_text()
    assert nccl_job_doc(text) == text, "docs/nccl-job.md is stale: run `make golden` (python -m tests.golden.update)"
    blocks = doc_blocks()
    pools = []
    for command, documents in blocks:
        args = shlex.split(command)
        assert args[:3] == ["gpu", "nccl-job", STACK] and "--topology-digest-only" in args
        pool = args[args.index("--pool") + 1]
        pools.append(pool)
        family = nccl_job.gpu_pool(plan, pool).nccl_topology
        assert family is not None
        pin = topology.pinned(family)
        assert documents == nccl_job.nccl_job(plan, NcclJobRequest(pool=pool, namespace="research"),
                                              NcclTopology(pin.component, pin.sha256))
        # the page shows the pinned file's name and digest, never its content
        [shown] = [d for d in documents if d["metadata"]["name"].endswith("-nccl-topology")]
        assert shown["data"][nccl_job.TOPOLOGY_KEY].startswith("<!-- digest-only rendering")
        assert pin.sha256 in shown["data"][nccl_job.TOPOLOGY_KEY]
    # one block for each GPU size the stack ships, and they are its two sizes
    assert sorted(pools) == sorted(SHIPPED_POOLS)
    assert {p.vm_size for p in plan.gpu_pools} == {"Standard_ND96asr_v4", "Standard_ND96isr_H100_v5"}
    # the check can fail: one changed value in a block makes the page stale
    assert nccl_job_doc(text.replace("value: eth0", "value: ib0", 1)) != text.replace("value: eth0", "value: ib0", 1)


# --- the objects validate -------------------------------------------------------------------------

@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.pool}-{r.team or 'shared'}-{r.nodes}")
def test_every_object_validates_for_every_supported_minor_and_is_a_gang(plan: ClusterPlan,
                                                                          request_: NcclJobRequest) -> None:
    documents = build(plan, request_)
    assert [d["kind"] for d in documents] == ["ConfigMap", "ConfigMap", "PodGroup", "Service", "Job"]
    for doc in documents:
        if doc["kind"] == "PodGroup":
            assert doc["apiVersion"] == gang.POD_GROUP_API_VERSION
            assert pod_group_errors(doc) == []
        else:
            for minor in SUPPORTED_MINORS:
                shared.validate_object(doc, f"1.{minor}.0")
    # the gang rules of docs/gang-scheduling.md: schedulerName, label, minMember = its pods
    assert gang_problems(documents) == []
    group = documents[2]
    assert group["spec"]["minMember"] == request_.nodes
    assert group["spec"]["minResources"] == {wellknown.GPU_RESOURCE: request_.nodes * 8}


def test_the_schema_checks_can_fail(plan: ClusterPlan) -> None:
    objects = objects_of(plan, REQUESTS[0])
    job = copy.deepcopy(objects["Job"])
    job["spec"]["template"]["spec"]["subdomian"] = job["spec"]["template"]["spec"].pop("subdomain")
    with pytest.raises(kubernetes_validate.ValidationError, match="subdomian"):
        kubernetes_validate.validate(job, "1.34.0", strict=True)
    assert any("minimum of 1" in e for e in pod_group_errors(
        {**objects["PodGroup"], "spec": {**objects["PodGroup"]["spec"], "minMember": 0}}))


# --- the cluster's admission policies -----------------------------------------------------------

def borrowing_admitted(pod: dict[str, Any], namespace_labels: dict[str, str] | None = None) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(BORROW_RULE))
    namespace = pod["metadata"]["namespace"]
    labels = {"labels": namespace_labels} if namespace_labels else {}
    return bool(program.evaluate({
        "object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": pod["spec"]}),
        "request": celpy.json_to_cel({"namespace": namespace}),
        "namespaceObject": celpy.json_to_cel({"metadata": {"name": namespace, **labels}}),
    }))


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.pool}-{r.team or 'shared'}-{r.nodes}")
def test_the_pods_pass_the_gang_fabric_and_team_borrowing_policies(plan: ClusterPlan,
                                                                   request_: NcclJobRequest) -> None:
    pod = pod_of(objects_of(plan, request_))
    assert fabric_admitted(pod)
    team_label = {wellknown.TEAM_LABEL: request_.team} if request_.team else None
    assert borrowing_admitted(pod, team_label)
    if request_.cross_fabric:
        assert pod["metadata"]["annotations"] == {gang.CROSS_FABRIC_ANNOTATION: "true"}
        assert "affinity" not in pod["spec"]
    else:
        # exactly the affinity the policy names, with the job's own group
        assert pod["spec"]["affinity"] == gang.fabric_affinity(request_.name)


def test_the_admission_checks_can_fail(plan: ClusterPlan) -> None:
    pod = pod_of(objects_of(plan, REQUESTS[0]))
    assert not fabric_admitted({**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "affinity"}})
    # a team's job in a namespace that is not the team's borrows: refused at team priority
    team_pod = pod_of(objects_of(plan, REQUESTS[2]))
    assert not borrowing_admitted(team_pod)
    assert not borrowing_admitted(team_pod, {wellknown.TEAM_LABEL: "vision"})


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.pool}-{r.team or 'shared'}-{r.nodes}")
def test_the_pods_are_admitted_under_pod_security_baseline(plan: ClusterPlan, request_: NcclJobRequest) -> None:
    spec = pod_of(objects_of(plan, request_))["spec"]
    for minor in SUPPORTED_MINORS:
        assert pss.violations(spec, "baseline", minor) == [], minor
    # and nothing beyond it: no added capability at all, no volume from the node
    [container] = spec["containers"]
    assert "securityContext" not in container
    assert {next(k for k in v if k != "name") for v in spec["volumes"]} == {"emptyDir", "configMap"}


def test_a_seeded_host_path_or_ipc_lock_is_refused_under_baseline(plan: ClusterPlan) -> None:
    spec = pod_of(objects_of(plan, REQUESTS[0]))["spec"]
    host = copy.deepcopy(spec)
    [volume] = [v for v in host["volumes"] if v["name"] == "nccl-topology"]
    del volume["configMap"]
    volume["hostPath"] = {"path": wellknown.nccl_topology_file("ndv5"), "type": "File"}
    assert pss.violations(host, "baseline", 35) == ["hostPath volume nccl-topology"]
    locked = copy.deepcopy(spec)
    locked["containers"][0]["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    assert pss.violations(locked, "baseline", 35) == ["capability IPC_LOCK (allreduce)"]


def test_the_docs_examples_use_the_same_fabric_affinity() -> None:
    text = (NCCL_JOB_DOC.parent / "gang-scheduling.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL):
        for doc in yaml.safe_load_all(block):
            spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Job" else doc.get("spec", {})
            if "affinity" in spec:
                group = (doc["spec"]["template"] if doc["kind"] == "Job" else doc)["metadata"]["labels"][
                    gang.POD_GROUP_LABEL]
                assert spec["affinity"] == gang.fabric_affinity(group)


# --- the pool's nodes, as the render registers them -----------------------------------------------

def registered(stack: str, host: str) -> tuple[dict[str, str], list[Taint]]:
    """A pool role's node labels and taints, from its rendered kubelet flags and config."""
    files = shared.rendered(stack)[host]
    config = yaml.safe_load(files[KUBELET_CONFIG].content) or {}
    flags = flags_of(unit_exec_args(files[KUBELET_UNIT].content))
    return _pairs(flags.get("node-labels", ""), "="), _taints(config, flags)


def placement_problems(pod: dict[str, Any], labels: dict[str, str], taints: list[Taint]) -> list[str]:
    """What keeps the pod off a node once its GPUs passed their checks (the health taint lifted)."""
    problems = [f"untolerated {t}" for t in untolerated(pod["spec"].get("tolerations", []), taints)
                if t.key != protocol.STARTUP_TAINT]
    mismatch = selector_mismatch(pod["spec"], labels)
    return problems + ([mismatch] if mismatch else [])


@pytest.mark.parametrize(("request_", "host"), [
    (REQUESTS[0], "pool-h100-ib"), (REQUESTS[1], "pool-a100-ib"), (REQUESTS[2], "pool-a100-ib.team-language"),
])
def test_the_pod_tolerates_and_selects_the_pools_nodes(plan: ClusterPlan, request_: NcclJobRequest,
                                                       host: str) -> None:
    pod = pod_of(objects_of(plan, request_))
    labels, taints = registered(STACK, host)
    assert placement_problems(pod, labels, taints) == []
    # it waits for the GPU health agent: the startup taint is the one it does not tolerate
    assert [str(t) for t in untolerated(pod["spec"].get("tolerations", []), taints)] == [
        f"{protocol.STARTUP_TAINT}={protocol.STARTUP_VALUE}:NoSchedule"]


def test_the_placement_checks_can_fail(plan: ClusterPlan) -> None:
    team_pod = pod_of(objects_of(plan, REQUESTS[2]))
    labels, taints = registered(STACK, "pool-a100-ib.team-language")
    # a toleration dropped: the team's taint keeps it off its nodes
    bare = copy.deepcopy(team_pod)
    bare["spec"]["tolerations"] = []
    assert placement_problems(bare, labels, taints) == [f"untolerated {wellknown.TEAM_LABEL}=language:NoSchedule"]
    # a shared job's pod does not reach the team's nodes, nor the other team's job
    assert placement_problems(pod_of(objects_of(plan, REQUESTS[1])), labels, taints)
    other_labels, other_taints = registered(STACK, "pool-a100-ib.team-vision")
    assert placement_problems(team_pod, other_labels, other_taints)
    # another pool's nodes are not selected
    h100_labels, h100_taints = registered(STACK, "pool-h100-ib")
    assert placement_problems(team_pod, h100_labels, h100_taints)


def test_every_taint_of_the_pool_is_read_from_the_plan(write_stack: Any) -> None:
    from kilonode.config import load_stack
    from kilonode.plan import plan_stack
    from tests.conftest import shipped_cluster_value

    cluster = shipped_cluster_value(STACK)
    h100 = next(p for p in cluster["nodePools"] if p["name"] == "h100-ib")
    h100["taints"] = ["example.com/dedicated=nccl:NoSchedule", "example.com/maintenance:NoExecute"]
    planned = plan_stack(load_stack(str(write_stack(cluster))))
    pod = pod_of(objects_of(planned, NcclJobRequest(pool="h100-ib")))
    assert pod["spec"]["tolerations"] == [
        {"key": "example.com/dedicated", "operator": "Equal", "effect": "NoSchedule", "value": "nccl"},
        {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoExecute"},
    ]
    taints = [Taint(k, e, v) for k, e, v in (("example.com/dedicated", "NoSchedule", "nccl"),
                                             ("example.com/maintenance", "NoExecute", ""))]
    assert untolerated(pod["spec"]["tolerations"], taints) == []
    assert untolerated(pod["spec"]["tolerations"][:1], taints) == [taints[1]]


# --- resources, RDMA, the NCCL topology and environment ------------------------------------------

def resource_problems(pod: dict[str, Any], gpus: int) -> list[str]:
    [container] = pod["spec"]["containers"]
    resources = container["resources"]
    problems = []
    for name, want in ((wellknown.GPU_RESOURCE, gpus), (wellknown.RDMA_RESOURCE, 1)):
        if resources.get("limits", {}).get(name) != want or resources.get("requests", {}).get(name, want) != want:
            problems.append(f"{name}: {resources}")
    return problems


@pytest.mark.parametrize("pool", SHIPPED_POOLS)
def test_the_pod_asks_for_every_gpu_the_rdma_devices_and_leaves_headroom(plan: ClusterPlan, pool: str) -> None:
    planned = next(p for p in plan.node_pools if p.name == pool)
    pod = pod_of(objects_of(plan, NcclJobRequest(pool=pool)))
    assert resource_problems(pod, planned.gpus_per_node) == []
    # the RDMA resource is the one the RDMA device plugin registers (kilonode.k8s.rdma)
    from kilonode.k8s.rdma import plugin_config

    resource_name = plugin_config()["configList"][0]["resourceName"]  # type: ignore[index]
    assert f"rdma/{resource_name}" == wellknown.RDMA_RESOURCE
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert planned.vcpus and planned.memory_gib
    assert int(requests["cpu"]) <= 0.85 * planned.vcpus and int(requests["memory"].removesuffix("Gi")) <= (
        0.85 * planned.memory_gib)
    # seeded breaks: the RDMA request dropped, one GPU short
    for break_ in ("rdma", "gpu"):
        broken = copy.deepcopy(pod)
        [container] = broken["spec"]["containers"]
        if break_ == "rdma":
            del container["resources"]["limits"][wellknown.RDMA_RESOURCE]
        else:
            container["resources"]["limits"][wellknown.GPU_RESOURCE] = 7
        assert resource_problems(broken, planned.gpus_per_node), break_


def test_memlock_is_unlimited_for_the_containers_of_an_infiniband_pool() -> None:
    """Why the pod adds no IPC_LOCK: the memory RDMA registers is bounded by RLIMIT_MEMLOCK
    only, and the render lifts it for the runtime and (Docker) every container it starts."""
    import json

    from kilonode.preflight.checks.rdma import MEMLOCK_UNLIMITED

    for host in ("pool-h100-ib", "pool-a100-ib"):
        files = shared.rendered(STACK)[host]
        units = [f.content for path, f in files.items() if path.endswith("20-kilonode-memlock.conf")]
        assert len(units) == 1 and MEMLOCK_UNLIMITED.search(units[0]), host
        daemon = json.loads(files["etc/docker/daemon.json"].content)
        assert daemon["default-ulimits"]["memlock"] == {"Name": "memlock", "Hard": -1, "Soft": -1}, host


def topology_problems(objects: dict[str, dict[str, Any]], image_path: str, pinned_sha256: str) -> list[str]:
    """NCCL_TOPO_FILE names a read-only subPath mount, at the path the image installs the file,
    of the job's topology ConfigMap, which names the pinned file and holds exactly it."""
    pod = pod_of(objects)
    [container] = pod["spec"]["containers"]
    topo = env_of(pod).get("NCCL_TOPO_FILE")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mount = mounts.get(topo or "")
    if mount is None:
        return [f"NCCL_TOPO_FILE {topo!r} is not mounted"]
    config_map = objects["Topology"]
    problems = [] if mount.get("readOnly") else ["the topology mount is writable"]
    if volumes[mount["name"]].get("configMap", {}).get("name") != config_map["metadata"]["name"]:
        problems.append(f"{topo} is not mounted from {config_map['metadata']['name']}")
    if list(config_map["data"]) != [mount.get("subPath")]:
        problems.append(f"subPath {mount.get('subPath')!r}, ConfigMap keys {list(config_map['data'])}")
    annotated = config_map["metadata"]["annotations"][nccl_job.TOPOLOGY_SHA256_ANNOTATION]
    held = sha256_text(next(iter(config_map["data"].values())))
    if not annotated == held == pinned_sha256:
        problems.append(f"ConfigMap holds sha256 {held}, says {annotated}, the pin is {pinned_sha256}")
    return problems + ([] if image_path == topo else [f"NCCL_TOPO_FILE {topo}, the image has {image_path}"])


@pytest.mark.parametrize("pool", SHIPPED_POOLS)
def test_nccl_topo_file_names_the_mounted_pinned_file_at_the_image_path(plan: ClusterPlan, pool: str) -> None:
    planned = next(p for p in plan.node_pools if p.name == pool)
    family = planned.nccl_topology
    assert family is not None
    [component] = load_binaries().role(f"nccl-{family}")
    [image_file] = component.files
    objects = objects_of(plan, NcclJobRequest(pool=pool))
    # the stand-in is what this test pins (the real file is not in the repository)
    assert topology_problems(objects, image_file.path, sha256_text(stand_in_text(family))) == []
    assert objects["Topology"]["metadata"]["annotations"][nccl_job.TOPOLOGY_COMPONENT_ANNOTATION] == component.name
    assert pod_of(objects)["spec"]["nodeSelector"][wellknown.NCCL_TOPOLOGY_LABEL] == family
    # seeded breaks: NCCL_TOPO_FILE elsewhere; another family's path; another file in the ConfigMap
    moved = copy.deepcopy(objects)
    for env in moved["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        if env["name"] == "NCCL_TOPO_FILE":
            env["value"] = "/opt/microsoft/topo.xml"
    assert topology_problems(moved, image_file.path, sha256_text(stand_in_text(family)))
    assert topology_problems(objects, wellknown.nccl_topology_file("ndv2"), sha256_text(stand_in_text(family)))
    swapped = copy.deepcopy(objects)
    swapped["Topology"]["data"][nccl_job.TOPOLOGY_KEY] = stand_in_text("ndv2")
    assert topology_problems(swapped, image_file.path, sha256_text(stand_in_text(family)))


def test_the_generator_refuses_a_topology_file_that_is_not_the_pinned_one(plan: ClusterPlan) -> None:
    right = stand_in("ndv5")
    assert build(plan, REQUESTS[0])
    with pytest.raises(NcclJobError, match="not the pinned"):
        nccl_job.nccl_job(plan, REQUESTS[0], NcclTopology(right.component, right.sha256, right.data() + " "))
    with pytest.raises(NcclJobError, match="needs nccl-topology-ndv5, not nccl-topology-ndv4"):
        nccl_job.nccl_job(plan, REQUESTS[0], stand_in("ndv4"))


@pytest.mark.parametrize("pool", SHIPPED_POOLS)
def test_the_pod_carries_every_setting_of_the_hosts_nccl_conf_and_the_pods_own(plan: ClusterPlan, pool: str) -> None:
    planned = next(p for p in plan.node_pools if p.name == pool)
    assert planned.nccl_topology is not None
    env = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool))))
    host = dict(line.split("=", 1) for line in nccl_conf(planned.nccl_topology).splitlines()
                if not line.startswith("#"))
    assert host == {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_TOPO_FILE": f"/opt/microsoft/{planned.nccl_topology}"
                    "/topo.xml", "NCCL_IGNORE_CPU_AFFINITY": "1"}
    assert host.items() <= env.items()
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # GPUDirect RDMA asked for, as Azure's own NCCL runs on these sizes ask (the nodes have it by DMA-BUF)
    assert "NCCL_IB_DISABLE" not in env and env["NCCL_NET_GDR_LEVEL"] == "5"
    # NCCL's own InfiniBand transport, named: no external plugin, no silent fall back to sockets
    assert env["NCCL_NET"] == "IB"
    # the rendered host file is this text (one home: the render and the job read the same pairs)
    files = shared.rendered(STACK)[f"pool-{pool}"]
    assert files[wellknown.NCCL_CONF.lstrip("/")].content == nccl_conf(planned.nccl_topology)


@pytest.mark.parametrize(("pool", "expected"), [
    ("h100-ib", {"NCCL_NVLS_ENABLE": "0", "NCCL_NET_FORCE_FLUSH": "0"}),
    ("a100-ib", {}),  # no multicast, and Ampere always flushes (src/graph/paths.cc l.411): nothing to turn off
])
def test_nccl_2_18_3_runs_without_nvls_and_the_hopper_flush_on_h100_only(plan: ClusterPlan, pool: str,
                                                                         expected: dict[str, str]) -> None:
    env = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool))))
    assert {k: v for k, v in env.items() if k in ("NCCL_NVLS_ENABLE", "NCCL_NET_FORCE_FLUSH")} == expected


def test_the_h100_settings_stand_only_while_the_job_images_nccl_lacks_the_fixes() -> None:
    # NVIDIA/nccl 8ed014ba (NVLS graph search) first in v2.18.5-1, f9c3dc25 (no flush on H100) in
    # v2.19.1-1 (wellknown.NCCL_FAMILY_POD_SETTINGS): once the image's NCCL has both, drop them
    # there (NVLS is a feature of these sizes, not a fault) and this test with them
    nccl = tuple(int(n) for n in load_components().nccl_benchmark.provides["nccl"].split("."))
    assert nccl < (2, 19, 1), "the job image's NCCL has both fixes: remove NCCL_FAMILY_POD_SETTINGS['ndv5']"
    assert dict(wellknown.NCCL_FAMILY_POD_SETTINGS["ndv5"]) == {"NCCL_NVLS_ENABLE": "0", "NCCL_NET_FORCE_FLUSH": "0"}


def test_ndv2_gets_no_relaxed_ordering_as_azure_writes_it() -> None:
    assert dict(wellknown.nccl_host_settings("ndv2")) == {
        "NCCL_TOPO_FILE": "/opt/microsoft/ndv2/topo.xml", "NCCL_IGNORE_CPU_AFFINITY": "1"}


def test_a_gang_across_fabrics_runs_over_tcp_and_says_so(plan: ClusterPlan) -> None:
    pod = pod_of(objects_of(plan, REQUESTS[3]))
    env = env_of(pod)
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_NET"] == "Socket"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert wellknown.RDMA_RESOURCE not in limits and limits[wellknown.GPU_RESOURCE] == 8


# --- the launcher and the benchmark ----------------------------------------------------------------

def test_the_launcher_rendezvous_at_pod_zero_through_the_headless_service(plan: ClusterPlan) -> None:
    objects = objects_of(plan, REQUESTS[0])
    job, service = objects["Job"], objects["Service"]
    spec = job["spec"]["template"]["spec"]
    name = job["metadata"]["name"]
    assert spec["subdomain"] == service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {nccl_job.JOB_NAME_LABEL: name}
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == REQUESTS[0].nodes
    script = spec["containers"][0]["command"][2]
    master = f"{name}-0.{name}"  # the Indexed Job's hostname pattern under its subdomain
    assert f"getent hosts {master}" in script
    assert (f"torchrun --nnodes=2 --nproc_per_node=8 --node_rank=\"$JOB_COMPLETION_INDEX\" --master_addr={master} "
            f"--master_port={defaults.NCCL_JOB_MASTER_PORT} /opt/kilonode-nccl/allreduce.py") in script
    # the script is the ConfigMap's, mounted where the command runs it
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    [volume] = [v for v in spec["volumes"] if v["name"] == "benchmark"]
    assert volume["configMap"]["name"] == objects["ConfigMap"]["metadata"]["name"]
    assert mounts["benchmark"] == nccl_job.SCRIPT_DIR
    assert objects["ConfigMap"]["data"] == {nccl_job.SCRIPT_KEY: nccl_job.SCRIPT.read_text()}
    assert spec["containers"][0]["image"] == plan.components.nccl_benchmark_image


def test_the_benchmark_compiles_and_computes_nccl_tests_bus_bandwidth() -> None:
    compile(nccl_job.SCRIPT.read_text(), str(nccl_job.SCRIPT), "exec")
    # doc/PERFORMANCE.md, AllReduce: busbw = algbw * 2(n-1)/n
    assert nccl_allreduce.bus_bandwidth(100.0, 16) == pytest.approx(187.5)
    assert nccl_allreduce.bus_bandwidth(100.0, 8) == pytest.approx(175.0)
    assert nccl_allreduce.bus_bandwidth(100.0, 2) == pytest.approx(100.0)
    assert nccl_allreduce.bus_bandwidth(100.0, 1) == 0.0
    sizes = list(nccl_allreduce.sizes(defaults.NCCL_JOB_MAX_BYTES))
    assert sizes[0] == 1 << 20 and sizes[-1] == 8 << 30 and len(sizes) == 14
    # 1 GiB in 10 ms over 16 ranks: algbw 107.37 GB/s, busbw 201.33
    assert nccl_allreduce.row(1 << 30, 0.01, 16, 0).split()[-3:] == ["107.37", "201.33", "0"]
    # a wrong formula would not pass: n/(n-1) instead of 2(n-1)/n
    assert nccl_allreduce.bus_bandwidth(100.0, 16) != pytest.approx(100.0 * 16 / 15)


# --- refusals and the command --------------------------------------------------------------------

@pytest.mark.parametrize(("stack", "request_", "message"), [
    (STACK, NcclJobRequest(pool="system"), "has no GPUs"),
    ("research-2500", NcclJobRequest(pool="nc-a100"), "has no InfiniBand"),
    (STACK, NcclJobRequest(pool="h200"), "no pool is named 'h200'"),
    (STACK, NcclJobRequest(pool="a100-ib", nodes=101), "do not fit in one InfiniBand fabric"),
    (STACK, NcclJobRequest(pool="a100-ib", nodes=1001, cross_fabric=True), "hold 1000 in all"),
    (STACK, NcclJobRequest(pool="a100-ib", team="research"), "team 'research' has no nodes"),
    (STACK, NcclJobRequest(pool="h100-ib", nodes=0), "at least one node"),
])
def test_what_cannot_run_is_refused_with_the_reason(stack: str, request_: NcclJobRequest, message: str) -> None:
    with pytest.raises(NcclJobError, match=message):
        nccl_job.nccl_job(shared.plan(stack), request_, stand_in())


def test_a_pool_reserved_whole_for_teams_needs_a_team(plan: ClusterPlan) -> None:
    a100 = next(p for p in plan.node_pools if p.name == "a100-ib")
    reserved = a100.model_copy(update={"shards": tuple(s.model_copy(update={"team": s.team or "vision"})
                                                       for s in a100.shards)})
    planned = plan.model_copy(update={"node_pools": tuple(reserved if p.name == "a100-ib" else p
                                                          for p in plan.node_pools)})
    with pytest.raises(NcclJobError, match=r"reserved for a team .*pass --team"):
        build(planned, NcclJobRequest(pool="a100-ib"))
    assert build(planned, NcclJobRequest(pool="a100-ib", team="vision"))


@pytest.fixture
def pinned_stand_ins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """node-image/binaries.toml as read by kilonode.image.topology, each family's topology pin
    the stand-in's digest; the --fetch downloads in an empty cache of the test's own. Returns
    a directory for --binaries."""
    real = load_binaries()
    components = dict(real.components)
    for family in ("ndv2", "ndv4", "ndv5"):
        name = wellknown.nccl_topology_component(family)
        digest = sha256_text(stand_in_text(family))
        pins = tuple(dataclasses.replace(p, digest=digest) for p in real.components[name].pins)
        components[name] = dataclasses.replace(real.components[name], pins=pins)
    monkeypatch.setattr(topology, "load_catalog", lambda: dataclasses.replace(real, components=components))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    given = tmp_path / "binaries"
    given.mkdir()
    return given


def invoke(*args: str) -> Any:  # typer's CliRunner result (click's, bundled or not)
    result = CliRunner().invoke(app, ["gpu", "nccl-job", STACK, *args], env={"COLUMNS": "2000"})
    return result


def flat(output: str) -> str:
    return " ".join(output.split())


def test_the_command_prints_the_objects_with_the_pinned_file_and_refuses_with_exit_2(pinned_stand_ins: Path) -> None:
    (pinned_stand_ins / "topo.xml").write_text(stand_in_text("ndv5"))
    result = invoke("--pool", "h100-ib", "--nodes", "3", "--binaries", str(pinned_stand_ins))
    assert result.exit_code == 0, result.output
    documents = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert documents == nccl_job.nccl_job(shared.plan(STACK), NcclJobRequest(pool="h100-ib", nodes=3),
                                          stand_in("ndv5"))
    # the ConfigMap carries exactly the pinned file, byte for byte
    [config_map] = [d for d in documents if d["metadata"]["name"] == "nccl-allreduce-nccl-topology"]
    assert config_map["data"] == {nccl_job.TOPOLOGY_KEY: stand_in_text("ndv5")}
    refused = invoke("--pool", "a100-ib", "--nodes", "101", "--binaries", str(pinned_stand_ins))
    assert refused.exit_code == 2
    assert "--cross-fabric" in refused.output and "holds 100" in refused.output
    shown = CliRunner().invoke(app, ["gpu", "nccl-job", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    for word in ("--pool", "--nodes", "--team", "--cross-fabric", "rdma/ib", "NCCL_TOPO_FILE", "docs/nccl-job.md",
                 "--binaries", "--topology-digest-only", "baseline"):
        assert word in shown.output, word


def test_the_topology_file_is_taken_by_its_download_name_or_from_the_fetch_downloads(pinned_stand_ins: Path) -> None:
    (pinned_stand_ins / "ndv4-topo.xml").write_text(stand_in_text("ndv4"))
    given = invoke("--pool", "a100-ib", "--binaries", str(pinned_stand_ins))
    assert given.exit_code == 0, given.output
    assert stand_in_text("ndv4").strip() in given.stdout
    # no --binaries: the verified download `kilonode image build --fetch` keeps
    item = load_binaries().resolve_component(load_binaries().components["nccl-topology-ndv5"], "")
    cached = download_cache() / f"{sha256_text(stand_in_text('ndv5'))[:16]}-{Path(item.url).name}"
    assert cached.parent.is_relative_to(Path(os.environ["XDG_CACHE_HOME"]))
    cached.parent.mkdir(parents=True)
    cached.write_text(stand_in_text("ndv5"))
    fetched = invoke("--pool", "h100-ib")
    assert fetched.exit_code == 0, fetched.output
    assert stand_in_text("ndv5").strip() in fetched.stdout


def test_a_missing_or_wrong_topology_file_is_refused_with_exit_2_naming_both_ways(pinned_stand_ins: Path) -> None:
    missing = invoke("--pool", "h100-ib", "--binaries", str(pinned_stand_ins))
    assert missing.exit_code == 2 and not missing.stdout
    for words in ("nccl-topology-ndv5", f"sha256 {sha256_text(stand_in_text('ndv5'))}) not found",
                  "--binaries DIR holding `topo.xml` or `ndv5-topo.xml`", "kilonode image build --fetch"):
        assert words in flat(missing.output), words
    # another family's file is not the pinned one: refused, not taken as given
    (pinned_stand_ins / "topo.xml").write_text(stand_in_text("ndv4"))
    wrong = invoke("--pool", "h100-ib", "--binaries", str(pinned_stand_ins))
    assert wrong.exit_code == 2 and not wrong.stdout
    assert "is not the pinned nccl-topology-ndv5" in flat(wrong.output)
    assert "kilonode image build --fetch" in flat(wrong.output)
    # the digest-only rendering needs no file
    assert invoke("--pool", "h100-ib", "--topology-digest-only").exit_code == 0


def test_a_run_below_the_floor_or_with_a_wrong_element_fails_and_a_good_one_passes() -> None:
    # the H100 pool's figures: 8 x 400 Gb/s = 400 GB/s ceiling, a 240 GB/s floor
    ok, line = nccl_allreduce.verdict(350.0, 0, 240.0, 400.0)
    assert ok and line.startswith("# PASS: peak busbw 350.00 GB/s (88% of the ceiling)")
    staged, line = nccl_allreduce.verdict(190.0, 0, 240.0, 400.0)  # host staging: about half
    assert not staged and "below the floor" in line and "GPU Direct RDMA Disabled" in line
    wrong, line = nccl_allreduce.verdict(350.0, 3, 240.0, 400.0)
    assert not wrong and "3 elements of the check all-reduce were wrong" in line
    assert nccl_allreduce.verdict(5.0, 0, None, None)[0]  # nothing to judge against: only correctness


# NCCL 2.18.3's channel lines, its own format strings (NVIDIA/nccl v2.18.3-1 src/transport/net.cc:186-190,
# 227-228) filled in as its INFO log prints them, with the log's prefix (src/debug.cc)
NET_SEND = "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s"
NET_SEND_PROXY = "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)%s%s"
NET_RECEIVE = "Channel %02d/%d : %d[%d] -> %d[%d] [receive] via NET/%s/%d%s%s"


def logged(text: str) -> str:
    return f"nccl-allreduce-0:1234:1290 [0] NCCL INFO {text}"


def test_nccls_channel_lines_are_read_as_nccl_2_18_3_writes_them() -> None:
    lines = [
        logged(NET_SEND % (0, 0, 0, 0, 8, 0, "IB", 0, "/GDRDMA", "")),
        logged(NET_RECEIVE % (0, 0, 8, 0, 0, 0, "IB", 0, "/GDRDMA", "/Shared")),
        logged(NET_SEND_PROXY % (1, 0, 1, 1, 9, 1, "IB", 1, 0, "/GDRDMA", "")),
        logged(NET_SEND % (2, 0, 2, 2, 10, 2, "IB", 2, "", "")),  # staged through host memory
        logged(NET_RECEIVE % (3, 0, 11, 3, 3, 3, "IB", 3, "", "/Shared")),
        # within the node: not the network, not counted
        logged("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"),
        logged("Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct"),
        logged("GPU Direct RDMA Enabled for HCA 0 'mlx5_ib0'"),
    ]
    assert nccl_allreduce.net_channels(lines) == (5, 3)
    assert nccl_allreduce.net_channels([]) == (0, 0)


def test_a_gang_whose_channels_lack_gdrdma_fails_even_above_the_floor() -> None:
    ok, line = nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, (64, 64))
    assert ok and line.startswith("# PASS")
    staged, line = nccl_allreduce.verdict(300.0, 0, 240.0, 400.0, (64, 48))  # above the floor
    assert not staged and line.startswith("# FAIL: 16 of 64 NCCL channels via NET lack /GDRDMA")
    assert "rdma-core older than 34" in line
    silent, line = nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, (0, 0))
    assert not silent and "names no channel via NET" in line
    # not asked (a gang across fabrics, one node): the channels are not judged
    assert nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, None)[0]


# NCCL 2.18.3's list of the HCAs it opened, its own format strings (NVIDIA/nccl v2.18.3-1
# src/transport/net_ib.cc:259-260 per port, 264-265 the line)
IB_PORT = " [%d]%s:%d/%s"
IB_USING = "NET/IB : Using%s %s; OOB %s:%s"


def ib_using(devices: list[str], links: str = "IB", relaxed: str = "[RO]") -> str:
    ports = "".join(IB_PORT % (d, name, 1, links) for d, name in enumerate(devices))
    return logged(IB_USING % (ports, relaxed, "eth0", "10.244.1.7<0>"))


def test_the_hcas_nccl_opened_are_read_as_nccl_2_18_3_lists_them() -> None:
    eight = [f"ibP{257 + n}p0s0" for n in range(8)]  # rdma-core's persistent names on ND H100 v5
    assert nccl_allreduce.ib_hcas([logged("NCCL version 2.18.3+cuda12.2"), ib_using(eight)]) == 8
    assert nccl_allreduce.ib_hcas([ib_using(eight[:6], relaxed="")]) == 6
    assert nccl_allreduce.ib_hcas([ib_using(["mlx5_ib0", "mlx5_ib1"])]) == 2  # Azure's own images' names
    assert nccl_allreduce.ib_hcas([ib_using(["roceP2p0s0"], links="RoCE")]) == 0, "an Ethernet port is no link"
    # the line where NCCL found none (net_ib.cc:252), or no line at all
    assert nccl_allreduce.ib_hcas([logged("NET/IB : No device found.")]) == 0
    assert nccl_allreduce.ib_hcas([]) == 0


def test_a_gang_whose_nccl_opened_fewer_hcas_than_the_size_has_fails_even_above_the_floor() -> None:
    assert nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, (64, 64), (8, 8))[0]
    short, line = nccl_allreduce.verdict(300.0, 0, 240.0, 400.0, (64, 64), (6, 8))
    assert not short and line.startswith("# FAIL: a rank's NCCL opened 6 InfiniBand HCAs")
    assert "the size has 8 links" in line and "RDMA device plugin" in line
    none, _ = nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, (64, 64), (0, 8))
    assert not none, "a rank whose log names no HCA fails"
    # not asked (a gang across fabrics, one node, a size without recorded links): not judged
    assert nccl_allreduce.verdict(350.0, 0, 240.0, 400.0, (64, 64), None)[0]


@pytest.mark.parametrize("pool", SHIPPED_POOLS)
def test_a_gang_over_infiniband_must_open_every_link_of_its_size(plan: ClusterPlan, pool: str) -> None:
    planned = nccl_job.gpu_pool(plan, pool)
    assert planned.infiniband_links is not None
    env = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool))))
    assert env["REQUIRE_IB_HCAS"] == str(planned.infiniband_links.count) == "8"
    across = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool, cross_fabric=True, nodes=2))))
    one = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool, nodes=1))))
    assert "REQUIRE_IB_HCAS" not in across and "REQUIRE_IB_HCAS" not in one


def test_each_rank_logs_to_its_own_file_and_echoes_it_even_when_the_run_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(nccl_allreduce, "NCCL_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.setenv("RANK", "3")
    # what NCCL 2.18.3 says where NCCL_NET=IB finds no HCA (src/net.cc:285), and only in its log
    warning = logged("Error: network IB not found.").replace("INFO", "WARN")

    def fails(log: nccl_allreduce.NcclLog) -> None:
        assert os.environ["NCCL_DEBUG_FILE"] == str(tmp_path / "kilonode-nccl-rank3.log") == log.path
        Path(log.path).write_text(logged(NET_SEND % (0, 0, 3, 3, 11, 3, "IB", 3, "/GDRDMA", "")) + "\n")
        log.echo()
        with open(log.path, "a") as more:
            more.write(warning + "\n")
        raise RuntimeError("NCCL error")

    monkeypatch.setattr(nccl_allreduce, "_benchmark", fails)
    with pytest.raises(RuntimeError):
        nccl_allreduce.main()
    out = capsys.readouterr().out.splitlines()
    assert out == [logged(NET_SEND % (0, 0, 3, 3, 11, 3, "IB", 3, "/GDRDMA", "")), warning], "each line once"


def test_the_docs_say_what_nccl_does_under_the_jobs_environment_and_how_the_images_name_hcas(
        plan: ClusterPlan) -> None:
    doc = " ".join(NCCL_JOB_DOC.read_text().split())
    env = env_of(pod_of(objects_of(plan, NcclJobRequest(pool="h100-ib"))))
    # NCCL_NET=IB names the network: without HCAs NCCL 2.18.3 fails its init (src/net.cc l.285),
    # it does not fall back to sockets
    assert env["NCCL_NET"] == "IB" and "`NCCL WARN Error: network IB not found.`" in doc
    assert "NET/Socket : Using" not in doc and "does not fall back to sockets" in doc
    # the InfiniBand images carry Debian's rdma-core, whose udev rule renames every RDMA device
    assert "rdma-core" in read_list(load_recipe().extras["infiniband"].package_file)
    assert "`rdma_rename %k NAME_FALLBACK`" in doc and "[0]mlx5_0:1/IB" not in doc


def test_only_a_gang_over_infiniband_must_use_gpudirect_rdma(plan: ClusterPlan) -> None:
    assert env_of(pod_of(objects_of(plan, NcclJobRequest(pool="h100-ib"))))["REQUIRE_GDRDMA"] == "1"
    across = env_of(pod_of(objects_of(plan, NcclJobRequest(pool="h100-ib", cross_fabric=True, nodes=2))))
    one = env_of(pod_of(objects_of(plan, NcclJobRequest(pool="h100-ib", nodes=1))))
    assert "REQUIRE_GDRDMA" not in across and "REQUIRE_GDRDMA" not in one, "sockets, or no network at all"


@pytest.mark.parametrize(("pool", "ceiling", "floor"), [("h100-ib", "400", "240"), ("a100-ib", "200", "120")])
def test_the_job_judges_its_peak_against_the_pools_infiniband_links(
        plan: ClusterPlan, pool: str, ceiling: str, floor: str) -> None:
    env = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool))))
    assert (env["NETWORK_CEILING_GBPS"], env["BUSBW_FLOOR_GBPS"]) == (ceiling, floor)
    # across fabrics (sockets) no InfiniBand figure holds: nothing to judge the peak against
    across = env_of(pod_of(objects_of(plan, NcclJobRequest(pool=pool, cross_fabric=True, nodes=2))))
    assert "BUSBW_FLOOR_GBPS" not in across and "NETWORK_CEILING_GBPS" not in across
