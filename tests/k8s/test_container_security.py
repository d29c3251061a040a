"""Container security contexts of kilonode's kube-system workloads, against what the kubelet
does with them and what each image is: every unprivileged container drops every capability,
cannot escalate and runs on a read-only root filesystem, and none sets runAsNonRoot where the
kubelet would refuse to start it (an image whose user is root, or a user name it cannot check).
checkov (tests/k8s/test_checkov.py) sees the fields; it does not see the images, so the users
below are written by hand from each image's Dockerfile at the pinned tag, not read from
kilonode's code. Seeded breaks show the check refuses."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from tests import shared
from tests.k8s import pod_security_standards as pss
from tests.k8s.test_pod_security import pod_creators, pod_spec

STACKS = list(shared.SHIPPED_STACKS)

# Container name -> the user its image runs as when the pod names none: 0 (root), a UID, a user
# name (which the kubelet cannot resolve), or None where no first-party file was read here (the
# pod must then name its UID itself).
IMAGE_USERS: dict[str, int | str | None] = {
    # kubernetes-sigs/cloud-provider-azure v1.32.20-v1.35.8 Dockerfile: FROM distroless/base, no USER
    "cloud-controller-manager": 0,
    # ... cloud-node-manager.Dockerfile: USER 65532:65532
    "cloud-node-manager": 65532,
    # kubernetes/autoscaler cluster-autoscaler/Dockerfile: FROM gcr.io/distroless/static:nonroot,
    # whose image config was not read here
    "cluster-autoscaler": None,
    # coredns/coredns v1.12.1 Dockerfile: USER nonroot:nonroot
    "coredns": "nonroot",
    # cluster-proportional-autoscaler v1.10.1 Dockerfile.in: USER 65535:65535
    "autoscaler": 65535,
    # kubernetes-sigs/metrics-server v0.8.0 Dockerfile: FROM distroless/static, USER 65534
    "metrics-server": 65534,
    # prometheus/node_exporter v1.12.1 Dockerfile: USER nobody (65534)
    "node-exporter": 65534,
    # kube-state-metrics v2.18.0: examples/standard/deployment.yaml names runAsUser 65534; its image's
    # config was not read here
    "kube-state-metrics": None,
    # NVIDIA/dcgm-exporter 4.5.3-4.8.2 docker/Dockerfile:202 USER root
    "exporter": 0,
    # kubernetes-sigs/scheduler-plugins v0.32.7-v0.34.7 build/{scheduler,controller}/Dockerfile: USER 65532:65532
    "kube-scheduler": 65532,
    "controller": 65532,
    # NVIDIA/k8s-device-plugin v0.17.4 deployments/container/Dockerfile: FROM cuda base-ubi9, no USER
    "nvidia-device-plugin-ctr": 0,
    # its init container, the same image
    "wait-for-nvidia-devices": 0,
    # projectcalico/calico v3.31.7: calico/node privileged, root (podSecurity exceptions); typha/docker-image/
    # Dockerfile:48 USER 999
    "calico-node": None,
    "calico-typha": 999,
    # registry.k8s.io/kube-proxy, Mellanox's RDMA plugin: privileged, root (podSecurity exceptions)
    "kube-proxy": None,
    "k8s-rdma-shared-dp-ds": None,
    # postfinance/kubelet-csr-approver: built with ko, its base image not read here
    "kubelet-csr-approver": None,
    # kubernetes-sigs/azuredisk-csi-driver v1.34.5 pkg/azurediskplugin/Dockerfile: FROM debian-base, no USER
    "azuredisk": 0,
    # the kubernetes-csi sidecars on mcr.microsoft.com: their Dockerfiles not read here (kilonode.k8s.storage
    # leaves the image's user and sets no runAsNonRoot)
    "csi-provisioner": None,
    "csi-attacher": None,
    "csi-resizer": None,
    "liveness-probe": None,
    "node-driver-registrar": None,
}


def kubelet_refusal(pod: dict[str, Any], container: dict[str, Any], image_user: int | str | None) -> str | None:
    """Why the kubelet would refuse to start `container` for runAsNonRoot, or None (kubernetes
    pkg/kubelet/kuberuntime/security_context_others.go verifyRunAsNonRoot: the container's
    fields over the pod's; the image's user where neither names a UID)."""
    own, shared_ = container.get("securityContext") or {}, pod.get("securityContext") or {}
    if not own.get("runAsNonRoot", shared_.get("runAsNonRoot")):
        return None
    uid = own.get("runAsUser", shared_.get("runAsUser"))
    if uid is None and isinstance(image_user, int):
        uid = image_user
    if uid == 0:
        return "container has runAsNonRoot and image will run as root"
    if uid is None:
        return (f"container has runAsNonRoot and image has non-numeric user ({image_user}), "
                "cannot verify user is non-root")
    return None


def kube_system_pods(graph: Graph) -> list[tuple[str, dict[str, Any]]]:
    return [(r.plain()["metadata"]["name"], pod_spec(r)) for r in pod_creators(graph)
            if r.plain()["metadata"].get("namespace") == "kube-system"]


@pytest.mark.parametrize("stack", STACKS)
def test_no_container_sets_run_as_non_root_where_the_kubelet_would_refuse_it(
    graphs: dict[str, Graph], stack: str,
) -> None:
    for name, spec in kube_system_pods(graphs[stack]):
        for container in pss.containers(spec):
            assert container["name"] in IMAGE_USERS, f"{name}: add its image's user to IMAGE_USERS"
            assert kubelet_refusal(spec, container, IMAGE_USERS[container["name"]]) is None, name


@pytest.mark.parametrize("stack", STACKS)
def test_every_unprivileged_kube_system_container_is_read_only_with_no_capability_it_does_not_need(
    graphs: dict[str, Graph], stack: str,
) -> None:
    seen = set()
    for name, spec in kube_system_pods(graphs[stack]):
        for container in pss.containers(spec):
            context = container.get("securityContext") or {}
            if context.get("privileged"):
                continue
            seen.add(container["name"])
            assert context.get("allowPrivilegeEscalation") is False, name
            assert context.get("capabilities", {}).get("drop") == ["ALL"], name
            # CoreDNS's one: port 53 (upstream's manifest); the NVIDIA device plugin's SYS_ADMIN, which
            # upstream's chart adds for the volume-mounts device list (catalog/contracts.yaml devicePlugin),
            # and dcgm-exporter's, which its chart adds (catalog/contracts.yaml dcgmExporter)
            gpu = container["name"] in ("nvidia-device-plugin-ctr", "exporter")
            allowed = {"SYS_ADMIN"} if gpu else {"NET_BIND_SERVICE"}
            assert set(context.get("capabilities", {}).get("add", [])) <= allowed, name
            # dcgm-exporter's root stays writable as upstream's chart leaves it: its embedded DCGM host
            # engine writes its state and log there (not read whether it runs on a read-only root)
            assert context.get("readOnlyRootFilesystem") is True or name == "dcgm-exporter", name
    assert {"cloud-controller-manager", "cloud-node-manager", "coredns", "kube-scheduler", "controller"} <= seen


def _coredns(graphs: dict[str, Graph]) -> dict[str, Any]:
    [spec] = [s for n, s in kube_system_pods(graphs["local"]) if n == "coredns"]
    return copy.deepcopy(spec)


def test_run_as_non_root_without_a_uid_on_a_named_user_image_is_refused(graphs: dict[str, Graph]) -> None:
    """Seeded break: CoreDNS without its runAsUser; its image says `USER nonroot`."""
    spec = _coredns(graphs)
    [container] = spec["containers"]
    del container["securityContext"]["runAsUser"]
    assert "non-numeric user (nonroot)" in str(kubelet_refusal(spec, container, IMAGE_USERS["coredns"]))


def test_run_as_non_root_on_a_root_image_is_refused_unless_a_uid_is_named() -> None:
    """Seeded break: cloud-controller-manager's image runs as root."""
    pod = {"securityContext": {"runAsNonRoot": True}}
    root = IMAGE_USERS["cloud-controller-manager"]
    assert "will run as root" in str(kubelet_refusal(pod, {"name": "c"}, root))
    assert kubelet_refusal(pod, {"name": "c", "securityContext": {"runAsUser": 65532}}, root) is None
    # the container's own field wins over the pod's
    assert "will run as root" in str(kubelet_refusal({"securityContext": {"runAsUser": 65532}},
                                                     {"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}, None))
