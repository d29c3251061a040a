"""boot-pulls: each pool's pulls before its pods run, counted over its nodes; seeded breaks."""

from __future__ import annotations

from kilonode.imageref import registry_of
from kilonode.preflight import run
from tests.preflight.conftest import artefacts, inputs_of, resource


def pulls(stack: str, **planted: object) -> dict[str, str]:
    return {f.where: f.what for f in run(inputs_of(stack, **planted), ["boot-pulls"])}  # type: ignore[arg-type]


def test_images_go_to_the_registry_their_reference_names() -> None:
    assert registry_of("registry.k8s.io/kube-proxy:v1.34.2") == "registry.k8s.io"
    assert registry_of("nvcr.io/nvidia/k8s-device-plugin:v0.17.4@sha256:00") == "nvcr.io"
    assert registry_of("busybox:1.36") == "docker.io"
    assert registry_of("localhost:5000/pause:3.10") == "localhost:5000"


def test_each_pool_counts_its_daemonsets_images_over_its_nodes() -> None:
    found = pulls("research-7500")
    h100 = found["pool-h100-ib"]
    # kube-proxy, cloud-node-manager, calico-node, node-exporter, the device plugin, dcgm-exporter, the RDMA plugin
    assert h100.startswith("2,500 nodes x 7 image(s) = 17,500 registry pulls")
    assert "DaemonSet kube-system/node-exporter" in h100 and "DaemonSet kube-system/dcgm-exporter" in h100
    assert "DaemonSet kube-system/kube-proxy" in h100 and "nvidia-device-plugin" in h100
    assert "DaemonSet kube-system/calico-node" in h100
    assert "DaemonSet kube-system/rdma-shared-dp-ds" in h100
    # the pause image is preloaded into every image: never pulled
    assert "pause" not in " ".join(found.values())
    # how many pull at a time: one join wave (the plan's), not the pool; a scale set larger
    # than a wave boots whole (research-2500's 834-node scale sets)
    assert "327 nodes at a time (one join wave" in h100
    assert "834 nodes at a time" in pulls("research-2500")["pool-nc-a100"]


def test_a_daemonset_kept_off_a_pool_by_its_taint_adds_no_pull_there() -> None:
    files, graph = artefacts("research-7500")
    proxy = resource(graph, "DaemonSet", "kube-proxy")
    proxy["inputs"]["spec"]["template"]["spec"]["tolerations"] = []  # tolerates nothing of its own now
    found = pulls("research-7500", files=files, graph=graph)
    assert "kube-proxy" not in found["pool-h100-ib"]  # the GPU-health taint keeps it off


def test_a_pause_image_left_out_of_the_image_is_a_pull_on_every_node() -> None:
    files, graph = artefacts("local")
    before = pulls("local")
    from kilonode.preflight.load import from_parts
    from tests import shared

    plan = shared.plan("local")
    pool = plan.node_pools[0]
    stripped = pool.model_copy(update={"preload_images": tuple(i for i in pool.preload_images
                                                               if i.image != pool.pause_image)})
    broken = plan.model_copy(update={"node_pools": (stripped, *plan.node_pools[1:])})
    found = {f.where: f.what for f in run(from_parts(broken, files, graph), ["boot-pulls"])}
    assert pool.pause_image not in before.get(f"pool-{pool.name}", "")
    assert f"{pool.pause_image} (the pause image" in found[f"pool-{pool.name}"]
