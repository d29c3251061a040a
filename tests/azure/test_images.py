"""Images are stack configuration: rolling the node image or the control-plane image is a
reviewed change of the stack file, never a code edit or a moving 'latest'."""

from __future__ import annotations

import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import run_program
from kilonode.config import load_stack
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

VERSION = "azure-native:compute:GalleryImageVersion"
VM = "azure-native:compute:VirtualMachine"


def versions_of(graph: Graph) -> dict[str, str]:
    """gallery image name -> the version published of it"""
    return {v.inputs["galleryImageName"]: v.inputs["galleryImageVersionName"] for v in graph.of_type(VERSION)}


def test_every_image_version_comes_from_the_stack_each_on_its_own() -> None:
    cluster = shipped_cluster_value("local") | {
        "nodeImage": {"version": "2.3.4", "minReplicas": 1, "maxConcurrentVmCreates": 2},
        "etcdImage": {"version": "3.0.1"},
        "controlPlaneImage": {"version": "4.5.6"},
    }
    assert versions_of(run_program("local", cluster)) == {"cpu": "2.3.4", "etcd": "3.0.1", "control-plane": "4.5.6"}


def test_control_plane_vms_boot_their_roles_image_from_the_gallery(graphs: dict[str, Graph]) -> None:
    graph = graphs["local"]  # the shipped stack's images
    booted = {vm.plain()["vmName"]: vm.plain()["storageProfile"]["imageReference"] for vm in graph.of_type(VM)}
    assert len(booted) == 7  # 3 + 3 etcd members, 1 apiserver
    etcd = f"mock:{VERSION}::local-image-etcd-1.0.0"
    apiserver = f"mock:{VERSION}::local-image-control-plane-1.0.0"
    assert {name: ref["id"] for name, ref in booted.items()} == {
        name: apiserver if "apiserver" in name else etcd for name in booted
    }
    # each role image is uploaded from its own VHD, built by `kilonode image build --role`
    uploads = {c.name: c.plain()["environment"]["VHD"] for c in graph.of_type("command:local:Command")
               if c.name.endswith("-vhd")}
    assert uploads["local-image-etcd-vhd"] == "build/node-image/local-etcd.vhd"
    assert uploads["local-image-control-plane-vhd"] == "build/node-image/local-control-plane.vhd"


def test_a_marketplace_image_for_the_control_plane_is_refused_saying_what_replaced_it(
    write_stack: StackWriter,
) -> None:
    cluster = shipped_cluster_value("local") | {"controlPlaneImage": {
        "publisher": "Debian", "offer": "debian-12", "sku": "12-gen2", "version": "0.20230612.1409"}}
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    [problem] = caught.value.problems
    assert problem.path == "controlPlaneImage"
    assert "kilonode image build STACK --role etcd|control-plane" in problem.message
    assert "Keep only `version`" in problem.message


@pytest.mark.parametrize("reserved", ["etcd", "control-plane"])
def test_a_pool_may_not_take_a_role_images_name(write_stack: StackWriter, reserved: str) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"] = [cluster["nodePools"][0] | {"name": reserved}]
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    assert any(p.path == "nodePools[0].name" and "give the pool another name" in p.message
               for p in caught.value.problems)


def test_latest_is_refused_as_an_image_version(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local") | {"controlPlaneImage": {"version": "latest"}}
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    [problem] = caught.value.problems
    assert problem.path == "controlPlaneImage.version" and "'latest' is refused: pin a version" in problem.message
