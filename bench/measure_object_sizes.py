"""The per-object sizes `kilonode explain` counts etcd's database with (infra/kilonode/catalog/
limits.yaml, etcd.objectBytes): representative objects of a GPU node of research-7500's shape,
built here as the apiserver would store them, and measured as compact JSON.

The apiserver stores core objects in etcd as protobuf, which is smaller than their JSON (field
names become tags): these JSON sizes are an upper bound, which is the side to err on for a
quota. What each object holds is written out below, with the source of each part:
- a Node: the labels the kubelet, the cloud node manager and kilonode set; kilonode's taints;
  capacity and allocatable of an ND96asr_v4 (8 GPUs, 8 RDMA devices); the kubelet's five
  conditions and the GPU health agent's GPUHealthy; 50 images (the kubelet's nodeStatusMaxImages
  default) each with 2 names (a tag and a digest; the kubelet keeps at most 10 per image,
  kubernetes/kubernetes#32908, where 130-180 KB Nodes with many names per image made etcd OOM);
  and one managedFields entry per writer;
- a Lease in kube-node-lease as the kubelet renews it, with its managedFields entry;
- a Pod: one 8-GPU training container with a dozen environment variables and three volumes, and
  its status.

Run: python bench/measure_object_sizes.py (prints the figures as JSON). tests/plan/test_limits.py
checks that limits.yaml holds what this prints.
"""

from __future__ import annotations

import json
from typing import Any

NODE = "research-7500-a100-ib-000000001"
UID = "4f1c2a8e-6b1d-4c55-9a7e-0d3b9f1e2a77"
TIME = "2026-11-26T08:00:00Z"
RV = "1234567890"


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": UID, "resourceVersion": RV, "creationTimestamp": TIME}
    if namespace:
        meta["namespace"] = namespace
    return {**meta, **extra}


def _managed(manager: str, fields: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
    entry = {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": TIME,
             "fieldsType": "FieldsV1", "fieldsV1": fields}
    if subresource:
        entry["subresource"] = subresource
    return entry


def node() -> dict[str, Any]:
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux", "kubernetes.io/hostname": NODE,
        "node.kubernetes.io/instance-type": "Standard_ND96asr_v4",
        "beta.kubernetes.io/instance-type": "Standard_ND96asr_v4",
        "topology.kubernetes.io/region": "southcentralus", "topology.kubernetes.io/zone": "southcentralus-1",
        "failure-domain.beta.kubernetes.io/region": "southcentralus",
        "failure-domain.beta.kubernetes.io/zone": "southcentralus-1",
        "kilonode.io/pool": "a100-ib", "kilonode.io/fabric": "research-7500-a100-ib-000",
        "kilonode.io/team": "language", "kilonode.io/gpu": "true",
    }
    taints = [{"key": "kilonode.io/team", "value": "language", "effect": "NoSchedule"},
              {"key": "kilonode.io/gpu-health", "value": "pending", "effect": "NoSchedule"}]
    resources = {"cpu": "96", "memory": "928487784Ki", "ephemeral-storage": "6185195144Ki", "hugepages-1Gi": "0",
                 "hugepages-2Mi": "0", "pods": "11", "nvidia.com/gpu": "8", "rdma/ib": "8"}
    conditions = [
        {"type": t, "status": s, "lastHeartbeatTime": TIME, "lastTransitionTime": TIME, "reason": r, "message": m}
        for t, s, r, m in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
            ("GPUHealthy", "True", "ChecksPassed", "8 of 8 GPUs passed the passive and active checks"),
        )]
    images = [{"names": [f"registry.example/research/training-image-{i:02d}@sha256:{'a' * 64}",
                         f"registry.example/research/training-image-{i:02d}:2026-11-{i % 28 + 1:02d}"],
               "sizeBytes": 17_000_000_000 - i} for i in range(50)]
    fields = {f"f:{k}": {} for k in ("metadata", "spec", "status")}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": _meta(NODE, labels=labels, annotations={
            "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            managedFields=[_managed(m, fields, sub) for m, sub in (
                ("kubelet", None), ("kubelet", "status"), ("cloud-node-manager", None),
                ("kube-controller-manager", None), ("kilonode-gpu-health", "status"))]),
        "spec": {"providerID": "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
                               "research-7500/providers/Microsoft.Compute/virtualMachineScaleSets/"
                               "research-7500-a100-ib-000/virtualMachines/1", "taints": taints},
        "status": {"capacity": resources, "allocatable": resources, "conditions": conditions,
                   "addresses": [{"type": "InternalIP", "address": "10.0.128.4"},
                                 {"type": "Hostname", "address": NODE}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                   "nodeInfo": {"machineID": "0" * 32, "systemUUID": UID, "bootID": UID,
                                "kernelVersion": "6.1.0-27-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                "containerRuntimeVersion": "docker://28.0.0", "kubeletVersion": "v1.34.2",
                                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                   "images": images},
    }


def lease() -> dict[str, Any]:
    return {
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": _meta(NODE, "kube-node-lease", ownerReferences=[
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID}],
            managedFields=[_managed("kubelet", {"f:metadata": {"f:ownerReferences": {}},
                                                "f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {},
                                                           "f:renewTime": {}}})]),
        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40, "renewTime": "2026-11-26T08:00:00.000000Z"},
    }


def pod() -> dict[str, Any]:
    env = [{"name": f"NCCL_SETTING_{i}", "value": "value-of-a-typical-length"} for i in range(12)]
    image = f"registry.example/research/training-image-01@sha256:{'a' * 64}"
    mounts = [{"name": n, "mountPath": f"/{n}"} for n in ("data", "shm", "token")]
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": _meta("train-language-7b-worker-0042", "language",
                          labels={"app": "train", "scheduling.x-k8s.io/pod-group": "train-language-7b",
                                  "job-name": "train-language-7b"},
                          managedFields=[_managed("kube-controller-manager", {"f:spec": {}}),
                                         _managed("kubelet", {"f:status": {}}, "status")]),
        "spec": {"schedulerName": "kilonode-gang", "nodeName": NODE, "priorityClassName": "kilonode-team",
                 "containers": [{"name": "worker", "image": image,
                                 "command": ["torchrun", "--nnodes=64", "--nproc-per-node=8", "train.py"], "env": env,
                                 "resources": {"limits": {"nvidia.com/gpu": "8", "rdma/ib": "8"}},
                                 "volumeMounts": mounts}],
                 "volumes": [{"name": "data", "hostPath": {"path": "/mnt/local-ssd/data"}},
                             {"name": "shm", "emptyDir": {"medium": "Memory"}},
                             {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                 "tolerations": [{"key": "kilonode.io/team", "operator": "Equal", "value": "language",
                                  "effect": "NoSchedule"}],
                 "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                     {"topologyKey": "kilonode.io/fabric",
                      "labelSelector": {"matchLabels": {"scheduling.x-k8s.io/pod-group": "train-language-7b"}}}]}}},
        "status": {"phase": "Running", "hostIP": "10.0.128.4", "podIP": "10.0.128.5", "startTime": TIME,
                   "qosClass": "BestEffort",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": TIME}
                                  for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                            "PodScheduled")],
                   "containerStatuses": [{"name": "worker", "ready": True, "restartCount": 0, "started": True,
                                          "image": "registry.example/research/training-image-01:2026-11-02",
                                          "imageID": f"docker-pullable://registry.example@sha256:{'a' * 64}",
                                          "containerID": f"docker://{'b' * 64}",
                                          "state": {"running": {"startedAt": TIME}}}]},
    }


def sizes() -> dict[str, int]:
    """kind -> bytes of its compact JSON."""
    return {kind: len(json.dumps(make(), separators=(",", ":")).encode())
            for kind, make in (("node", node), ("lease", lease), ("pod", pod))}


if __name__ == "__main__":
    print(json.dumps(sizes(), indent=2))
