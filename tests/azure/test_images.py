"""Images are stack configuration: rolling the node image or the control-plane image is a
reviewed change of the stack file, never a code edit or a moving 'latest'."""

from __future__ import annotations

import pytest

from kilonode.azure.mockplan import run_program
from kilonode.config import load_stack
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

VERSION = "azure-native:compute:GalleryImageVersion"
VM = "azure-native:compute:VirtualMachine"


def test_the_node_image_version_comes_from_the_stack() -> None:
    cluster = shipped_cluster_value("local") | {"nodeImage": {"version": "2.3.4", "minReplicas": 1,
                                                              "maxConcurrentVmCreates": 2}}
    graph = run_program("local", cluster)
    [version] = graph.of_type(VERSION)
    assert version.inputs["galleryImageVersionName"] == "2.3.4"


def test_control_plane_vms_use_the_pinned_marketplace_image() -> None:
    graph = run_program("local", shipped_cluster_value("local"))
    references = [vm.plain()["storageProfile"]["imageReference"] for vm in graph.of_type(VM)]
    assert len(references) == 7  # 3 + 3 etcd members, 1 apiserver
    assert all(reference == {"publisher": "Debian", "offer": "debian-12", "sku": "12-gen2",
                             "version": "0.20230612.1409"} for reference in references)
    # the stack's pin, not the code's, is what the VMs boot
    pinned = shipped_cluster_value("local") | {"controlPlaneImage": {"version": "0.20240101.1"}}
    versions = {vm.plain()["storageProfile"]["imageReference"]["version"]
                for vm in run_program("local", pinned).of_type(VM)}
    assert versions == {"0.20240101.1"}


def test_latest_is_refused_as_an_image_version(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local") | {"controlPlaneImage": {"version": "latest"}}
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    [problem] = caught.value.problems
    assert problem.path == "controlPlaneImage.version" and "'latest' is refused: pin a version" in problem.message
