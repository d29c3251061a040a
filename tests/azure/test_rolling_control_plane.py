"""Rolling the control plane one machine per `pulumi up --target` (docs/azure.md, "Rolling the
control plane"), on the graphs the mock engine records:

- no in-cluster object depends on an apiserver VM, its NIC or its public IP, directly, through
  the Kubernetes provider or through the readiness check (a dependency on the ControlPlane
  component would stand for all its children: pulumi/pulumi#7732), so a targeted replacement of
  one apiserver never reaches them;
- every control-plane VM is delete-before-replace (its Azure name is fixed), the etcd members
  still protected, and nothing else around them is;
- the restart guard passes an acknowledged group and warns that it cannot hold the run to one
  machine (the program never sees the targets).
"""

from __future__ import annotations

import copy
from typing import Any

import pulumi
import pytest

from kilonode.azure import rollout
from kilonode.azure.graph import Graph, Recorded, _unwrap
from kilonode.azure.mockplan import cluster_value, run_program
from kilonode.config import load_stack
from tests.azure.conftest import LB, NIC, PUBLIC_IP, VM
from tests.graphcache import recorded_program

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

READYZ = "command:local:Command"
IMAGE_VERSION = "azure-native:compute:GalleryImageVersion"
RUNNER_VNET = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/ci/providers/Microsoft.Network/" \
              "virtualNetworks/ci"


def _descendants(graph: Graph, name: str) -> set[str]:
    found, frontier = set(), [name]
    while frontier:
        for child in graph.children(frontier.pop()):
            if child.name not in found:
                found.add(child.name)
                frontier.append(child.name)
    return found


def _waits_for(graph: Graph, record: Recorded) -> set[str]:
    """Everything `record` waits for, transitively: its dependencies (explicit and through its
    inputs), its provider, and a component's children where a component is waited for (what
    the SDK does with a dependency on one)."""
    by_name = {r.name: r for r in graph.resources}
    seen: set[str] = set()
    frontier = [record]
    while frontier:
        current = frontier.pop()
        edges = set(current.depends_on) | ({current.provider} if current.provider else set())
        if not current.custom:
            edges |= _descendants(graph, current.name)
        for name in edges - seen:
            seen.add(name)
            if name in by_name:
                frontier.append(by_name[name])
    return seen


def _apiserver_machines(graph: Graph) -> set[str]:
    """Each apiserver's VM, NIC and public IP: what a targeted replacement of one touches."""
    return {r.name for r in graph.resources if r.type in (VM, NIC, PUBLIC_IP)
            and r.parent == f"{graph.stack}-apiserver" and not r.name.endswith("-public-ip")}


def _in_cluster(graph: Graph) -> list[Recorded]:
    return [graph.named(name) for name in sorted(_descendants(graph, f"{graph.stack}-k8s"))]


@pytest.fixture(scope="module")
def peered_graph() -> Graph:
    """`local` with a deployer over a peering: the readiness check also waits for the peerings."""
    raw = copy.deepcopy(cluster_value(load_stack("local")))
    raw["deployer"] = {"network": "peered", "vnetId": RUNNER_VNET, "cidrs": ["192.168.0.0/24"]}
    return recorded_program("local", raw)


def _all_graphs(graphs: dict[str, Graph], peered: Graph) -> list[Graph]:
    return [*graphs.values(), peered]


def test_no_in_cluster_object_depends_on_any_apiserver_vm_or_nic(graphs: dict[str, Graph],
                                                                  peered_graph: Graph) -> None:
    for graph in _all_graphs(graphs, peered_graph):
        machines = _apiserver_machines(graph)
        assert len([m for m in machines if graph.named(m).type == VM]) >= 1, graph.stack
        in_cluster = _in_cluster(graph)
        assert len(in_cluster) > 50, graph.stack  # the provider, the readiness check, every object
        for record in in_cluster:
            assert not _waits_for(graph, record) & machines, (graph.stack, record.name)


def test_the_readiness_check_waits_for_the_load_balancers_image_and_peerings_only(
    graphs: dict[str, Graph], peered_graph: Graph
) -> None:
    for graph in _all_graphs(graphs, peered_graph):
        stack = graph.stack
        ready = graph.named(f"{stack}-k8s-apiserver-ready-readyz")
        assert ready.type == READYZ
        balancers = {r.name for r in graph.of_type(LB) if r.parent == f"{stack}-apiserver"}
        assert balancers and balancers <= set(ready.depends_on), stack
        [image] = [r.name for r in graph.of_type(IMAGE_VERSION) if r.plain()["galleryImageName"] == "control-plane"]
        assert image in ready.depends_on, stack
        # never the component (it would stand for every VM), never a VM
        assert f"{stack}-apiserver" not in ready.depends_on
        assert not {r.name for r in graph.of_type(VM)} & set(ready.depends_on), stack
        # ... and the provider waits for the check
        assert ready.name in _waits_for(graph, graph.named(f"{stack}-k8s-provider"))
    peerings = {r.name for r in peered_graph.of_type("azure-native:network:VirtualNetworkPeering")}
    assert peerings and peerings <= set(peered_graph.named("local-k8s-apiserver-ready-readyz").depends_on)


def test_every_control_plane_vm_is_delete_before_replace_and_etcd_stays_protected(
    graphs: dict[str, Graph],
) -> None:
    for graph in graphs.values():
        stack = graph.stack
        vms = graph.of_type(VM)
        apiservers = [v for v in vms if v.parent == f"{stack}-apiserver"]
        members = [v for v in vms if (v.parent or "").startswith(f"{stack}-etcd-")]
        assert apiservers and members and len(apiservers) + len(members) == len(vms)
        assert all(v.delete_before_replace for v in vms), stack
        assert all(v.protect for v in members) and not any(v.protect for v in apiservers), stack
        # the replacement still comes from a new custom data or image, as before
        assert all({"osProfile.customData", "storageProfile.imageReference"} <= set(v.replace_on_changes)
                   for v in vms)
        # the NIC (static IP, backend pools) is the VM's dependency and is not replaced with it
        assert not any(n.delete_before_replace for n in graph.of_type(NIC)), stack


def test_a_teardown_stack_keeps_delete_before_replace_on_its_unprotected_members() -> None:
    raw = copy.deepcopy(cluster_value(load_stack("local")))
    raw["teardown"] = True
    graph = recorded_program("local", raw)
    members = [v for v in graph.of_type(VM) if "etcd" in (v.parent or "")]
    assert members and all(v.delete_before_replace and not v.protect for v in members)


# --- the guard: an acknowledged group passes, with a warning the program cannot make a check --------------


def _keys(n: int, prefix: str, digest: str = "d") -> dict[str, dict[str, str]]:
    return {f"{prefix}-{i}": rollout.restart_key("Standard_D16ds_v5", "1", "img", f"{digest}{i}") for i in range(n)}


def test_acknowledged_warns_for_more_than_one_machine_of_an_acknowledged_group_only() -> None:
    previous = {rollout.APISERVERS: _keys(5, "a"), rollout.ETCD_MAIN: _keys(5, "m")}
    every = {rollout.APISERVERS: _keys(5, "a", "new"), rollout.ETCD_MAIN: _keys(5, "m")}
    one = {rollout.APISERVERS: {**_keys(5, "a"), "a-0": rollout.restart_key("Standard_D16ds_v5", "1", "img", "x")},
           rollout.ETCD_MAIN: _keys(5, "m")}
    acked = frozenset({rollout.APISERVERS})
    # refused without the acknowledgement, passed with it ...
    assert rollout.disruptions(previous, every)
    assert rollout.disruptions(previous, every, acked) == []
    # ... and warned about: the program cannot tell whether this run is the targeted one
    [warned] = rollout.acknowledged(previous, every, acked)
    assert (warned.group, warned.machines, warned.members) == (rollout.APISERVERS, tuple(f"a-{i}" for i in range(5)), 5)
    message = warned.message()
    assert "cannot tell a targeted run from a plain one" in message
    assert "a plain `pulumi up` replaces every one of them at once" in message
    assert "`pulumi up --target <one machine's VM urn>` per run" in message
    # one machine, an unacknowledged group, a first deployment: nothing to warn of
    assert rollout.acknowledged(previous, one, acked) == []
    assert rollout.acknowledged(previous, every, frozenset()) == []
    assert rollout.acknowledged(None, every, acked) == []


def test_the_refusal_and_the_warning_tell_the_same_procedure_as_the_docs() -> None:
    refusal = rollout.Disruption(rollout.APISERVERS, ("a-0", "a-1"), 2, "no apiserver would be left").message()
    assert rollout.ROLL_STEP in refusal and "Rolling the control plane" in refusal
    assert "delete" in rollout.ROLL_STEP and "pulumi destroy" not in refusal
    docs = (pytest.importorskip("pathlib").Path(__file__).parents[2] / "docs" / "azure.md").read_text()
    section = docs.split("### Rolling the control plane", 1)[1].split("\n## ", 1)[0]
    for said in ("acknowledgeRestart", "pulumi up --target", "deleteBeforeReplace", "One plain `pulumi up`",
                 "cannot\ntell a targeted run from a plain one", "Never `pulumi destroy --target` an apiserver VM"):
        assert said in section, said


@pytest.fixture(scope="module")
def deployed(graphs: dict[str, Graph]) -> dict[str, Any]:
    return _unwrap(graphs["local"].outputs)


def test_the_program_passes_an_acknowledged_resize_and_warns_naming_the_members(
    deployed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    warnings: list[str] = []
    original = pulumi.log.warn

    def warn(message: str, *args: Any, **kwargs: Any) -> None:
        warnings.append(message)
        original(message, *args, **kwargs)

    monkeypatch.setattr(pulumi.log, "warn", warn)
    raw = copy.deepcopy(cluster_value(load_stack("local")))
    raw.setdefault("etcd", {}).setdefault("main", {})["vmSize"] = "Standard_D8ds_v5"
    raw["acknowledgeRestart"] = ["etcd-main"]
    graph = run_program("local", raw, None, deployed)
    assert graph.count(VM) == 7
    [said] = [w for w in warnings if w.startswith("acknowledgeRestart lists etcd-main")]
    assert "3 of its 3 machines differ" in said and "local-etcd-main-0, local-etcd-main-1, local-etcd-main-2" in said
    assert not [w for w in warnings if "acknowledgeRestart lists etcd-events" in w]
