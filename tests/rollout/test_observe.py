"""observe's parsers on the APIs' own payloads: the Azure REST specification's example answers
of VirtualMachineScaleSetVMs_List built into azure-mgmt-compute's model, Kubernetes Nodes and Pods
built into the kubernetes client's models from the API reference's shapes, and a Prometheus
/api/v1/alerts answer as its HTTP API documents it. No cloud and no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kilonode.config import load_stack
from kilonode.plan import checked_plan
from kilonode.rollout import observe
from kilonode.rollout.model import Instance

FIXTURES = Path(__file__).parent / "fixtures"
compute_models = pytest.importorskip("azure.mgmt.compute.models")
k8s = pytest.importorskip("kubernetes.client")


def azure_vms(example: str) -> list[Any]:
    body = json.loads((FIXTURES / "azure" / example).read_text())["responses"]["200"]["body"]
    return [compute_models.VirtualMachineScaleSetVM(entry) for entry in body["value"]]


def test_the_full_example_gives_the_instance_its_computer_name_lower_cased_and_its_model_state() -> None:
    [vm] = observe.vms_from_azure("vmss", azure_vms("VirtualMachineScaleSetVM_List_MaximumSet_Gen.json"))
    # storageProfile.imageReference: its `id` first (a gallery image version's, as kilonode pins)
    assert vm == observe.Vm("aaaaaaaaaaaa", "test000000", True, "a")


def test_the_minimal_example_is_not_at_the_model_and_takes_its_name_from_its_instance_id() -> None:
    # no instanceId, no properties: the ID's last segment, the name Azure derives from it
    [vm] = observe.vms_from_azure("research-7500-h100-ib-003",
                                  azure_vms("VirtualMachineScaleSetVM_List_MinimumSet_Gen.json"))
    assert vm == observe.Vm("0", "research-7500-h100-ib-003000000", False)


@pytest.mark.parametrize(("instance_id", "name"), [("0", "p000000"), ("85", "p00002D"), ("36", "p000010"),
                                                    ("2176782335", "pZZZZZZ")])
def test_computer_names_are_the_prefix_and_six_base_36_digits(instance_id: str, name: str) -> None:
    # Microsoft Learn, "names and instance IDs for Azure Virtual Machine Scale Set VMs": nsgvmss00002D is instance 85
    assert observe.computer_name("p", instance_id) == name


def node(name: str, ready: str = "True", unschedulable: bool | None = None, taints: list[dict[str, str]] | None = None,
         boot_id: str = "b-1") -> Any:
    """A Node as the API returns it (core/v1 Node: spec.unschedulable, spec.taints,
    status.conditions, status.nodeInfo with its required fields)."""
    info = {"bootID": boot_id, "machineID": "m", "systemUUID": "s", "kernelVersion": "6.1.0", "osImage": "Debian",
            "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.34.1", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": "amd64"}
    return k8s.V1Node.from_dict({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kilonode.io/pool": "h100-ib"}},
        "spec": {"unschedulable": unschedulable, "taints": taints},
        "status": {"nodeInfo": info, "conditions": [
            {"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]},
    })


def test_a_node_reads_ready_cordoned_gpu_pending_and_its_boot_id() -> None:
    name, facts = observe.node_facts(node("n1", unschedulable=True, boot_id="b-2", taints=[
        {"key": "kilonode.io/gpu-health", "value": "pending", "effect": "NoSchedule"}]))
    assert name == "n1" and facts == observe.NodeFacts(ready=True, schedulable=False, gpu_pending=True, boot_id="b-2")
    _, fault = observe.node_facts(node("n2", ready="Unknown", taints=[
        {"key": "kilonode.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}]))
    assert fault == observe.NodeFacts(ready=False, schedulable=True, gpu_pending=True, boot_id="b-1")
    _, other = observe.node_facts(node("n3", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    assert not other.gpu_pending


def pod(name: str, node_name: str, phase: str = "Running", group: str | None = "gpt-70b") -> Any:
    labels = {"scheduling.x-k8s.io/pod-group": group} if group else {}
    return k8s.V1Pod.from_dict({"metadata": {"name": name, "namespace": "team-language", "uid": f"uid-{name}",
                                             "labels": labels},
                                "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]},
                                "status": {"phase": phase}})


def test_gang_pods_name_their_group_per_node_and_finished_or_unbound_ones_do_not_count() -> None:
    gangs = observe.gangs_from_pods([pod("a", "n1"), pod("b", "n1", group="other"), pod("c", "n2", phase="Succeeded"),
                                     pod("d", "n3", group=None)])
    assert gangs == {"n1": ("team-language/gpt-70b", "team-language/other")}


def test_alerts_firing_count_for_the_pool_their_pool_label_names() -> None:
    # Prometheus HTTP API, GET /api/v1/alerts (docs: querying/api.md, "Alerts")
    payload = {"status": "success", "data": {"alerts": [
        {"labels": {"alertname": "KilonodeGpuNodesUnhealthy", "pool": "h100-ib", "severity": "warning"},
         "annotations": {}, "state": "firing", "activeAt": "2026-01-01T00:00:00Z", "value": "1e+00"},
        {"labels": {"alertname": "KilonodeGpuHealthPending", "pool": "h100-ib"}, "state": "pending"},
        {"labels": {"alertname": "KilonodeGpuNodesUnhealthy", "pool": "a100-ib"}, "state": "firing"},
        {"labels": {"alertname": "EtcdNoLeader"}, "state": "firing"},
    ]}}
    assert observe.firing_from_alerts(payload, ["h100-ib"]) == {"h100-ib": ("KilonodeGpuNodesUnhealthy",)}
    with pytest.raises(ValueError, match="Prometheus answered 'error'"):
        observe.firing_from_alerts({"status": "error", "error": "bad"}, ["h100-ib"])


def test_instances_join_their_nodes_and_one_not_registered_has_none() -> None:
    target = observe.Target("s", "h100-ib", True)
    vms = [observe.Vm("0", "s000000", True), observe.Vm("1", "s000001", False)]
    nodes = dict([observe.node_facts(node("s000000", boot_id="b-9"))])
    state = observe.scale_set_state(target, vms, nodes)
    assert state.instances == (Instance("0", "s000000", True, ready=True, boot_id="b-9"), Instance("1", None, False))


def test_the_targets_are_the_pools_shards_in_the_plans_order() -> None:
    plan = checked_plan(load_stack("research-7500"))
    sets = observe.targets(plan, "h100-ib")
    assert sets[0] == observe.Target("research-7500-h100-ib-000", "h100-ib", True, gpu=True) and len(sets) == 25
    with pytest.raises(ValueError, match="no pool 'nope'"):
        observe.targets(plan, "nope")


def test_a_recorded_state_reads_back_as_written() -> None:
    text = (FIXTURES / "research-7500-h100-ib.state.json").read_text()
    state = observe.state_from_json(text)
    assert observe.state_to_json(state) == text
    assert state.gangs["research-7500-h100-ib-001000002"] == ("team-language/gpt-70b",)
    with pytest.raises(ValueError, match="has no 'scale_sets'"):
        observe.state_from_json("{}", "x.json")


def test_an_unreachable_prometheus_makes_the_alerts_unknown_never_quiet() -> None:
    # loopback port 9 (discard): nothing listens, the connection is refused at once
    firing, unknown = observe.read_firing(None, "http://127.0.0.1:9", ["h100-ib"])
    assert firing == {} and unknown.startswith("Prometheus at http://127.0.0.1:9: URLError")


def test_the_image_of_an_instance_and_of_the_model() -> None:
    reference = compute_models.ImageReference(id="/Subscriptions/S/.../Versions/1.1.0")
    assert observe.image_name(reference) == "/subscriptions/s/.../versions/1.1.0"
    marketplace = compute_models.ImageReference(publisher="P", offer="O", sku="S", version="latest")
    assert observe.image_name(marketplace) == "p:o:s:latest" and observe.image_name(None) == ""
    vmss = compute_models.VirtualMachineScaleSet(location="x", virtual_machine_profile=(
        compute_models.VirtualMachineScaleSetVMProfile(storage_profile=(
            compute_models.VirtualMachineScaleSetStorageProfile(image_reference=reference)))))
    assert observe.model_image(vmss) == "/subscriptions/s/.../versions/1.1.0"


def test_a_gate_is_held_for_the_longest_for_among_the_pools_alerts() -> None:
    plan = checked_plan(load_stack("research-7500"))
    # KilonodeGpuHealthNotReported's 30m; KilonodeGpuHealthPending's 1h the gate checks itself (the taint)
    assert observe.hold_s(plan, "h100-ib") == 1800 and observe.hold_s(plan, "system") == 600


def test_a_node_reads_its_scale_down_hold_whose_it_is_and_its_gpu_verdicts_time() -> None:
    body = k8s.ApiClient().sanitize_for_serialization(node("n1"))
    body["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                                       "kilonode.io/rollout-held": "true"}
    # as the GPU health agent writes it (kilonode.node.gpu.agent._report)
    body["status"]["conditions"].append({"type": "GPUHealthy", "status": "True", "reason": "Passed",
                                         "lastHeartbeatTime": "2026-01-01T01:00:00Z",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"})
    _, facts = observe.node_facts(k8s.V1Node.from_dict(body))
    assert facts.scale_down_disabled and facts.held and facts.gpu_condition == "True"
    assert facts.gpu_since == 1767225600.0  # 2026-01-01T00:00:00Z, not the heartbeat
    body["metadata"]["annotations"] = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "false"}
    _, other = observe.node_facts(k8s.V1Node.from_dict(body))
    assert not other.scale_down_disabled and not other.held  # only "true" counts (eligibility.go)
