"""Images are stack configuration: rolling the node image or the control-plane image is a
reviewed change of the stack file, never a code edit or a moving 'latest'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import run_program
from kilonode.config import load_stack
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

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
    assert uploads["local-image-etcd-1.0.0-vhd"] == "build/node-image/local-etcd.vhd"
    assert uploads["local-image-control-plane-1.0.0-vhd"] == "build/node-image/local-control-plane.vhd"


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


# --- per-pool versions and the version kept for rollback ---------------------------------------------------------

COMMAND = "command:local:Command"
VMSS = "azure-native:compute:VirtualMachineScaleSet"


def _published(graph: Graph) -> set[tuple[str, str]]:
    return {(v.inputs["galleryImageName"], v.inputs["galleryImageVersionName"]) for v in graph.of_type(VERSION)}


def test_a_pool_may_have_its_own_version_a_canary() -> None:
    cluster = shipped_cluster_value("local") | {
        "nodeImage": {"version": "1.0.0", "pools": {"cpu": {"version": "1.1.0"}}}}
    graph = run_program("local", cluster)
    assert versions_of(graph)["cpu"] == "1.1.0"
    [vmss] = graph.of_type(VMSS)
    assert vmss.plain()["virtualMachineProfile"]["storageProfile"]["imageReference"]["id"].endswith("-cpu-1.1.0")


def test_the_previous_version_stays_published_and_is_never_uploaded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from kilonode.azure import mockplan

    aliases: dict[str, list[object]] = {}
    drop = mockplan._without_aliases

    def recording(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
        if args.type_ == COMMAND and args.opts.aliases:
            aliases[args.name] = list(args.opts.aliases)
        return drop(args)

    monkeypatch.setattr(mockplan, "_without_aliases", recording)
    cluster = shipped_cluster_value("local") | {
        "nodeImage": {"version": "1.1.0", "previous": "1.0.0"}, "etcdImage": {"version": "2.0.0", "previous": "1.0.0"}}
    graph = run_program("local", cluster)
    assert _published(graph) >= {("cpu", "1.1.0"), ("cpu", "1.0.0"), ("etcd", "2.0.0"), ("etcd", "1.0.0"),
                                 ("control-plane", "1.0.0")}
    [vmss] = graph.of_type(VMSS)  # machines boot the current version, never the kept one
    assert vmss.plain()["virtualMachineProfile"]["storageProfile"]["imageReference"]["id"].endswith("-cpu-1.1.0")
    uploads = {c.name: c for c in graph.of_type(COMMAND) if c.name.endswith("-vhd")}
    kept, current = uploads["local-image-cpu-1.0.0-vhd"], uploads["local-image-cpu-1.1.0-vhd"]
    # neither runs again once it ran: the kept one's VHD on disk is the new build now
    assert set(kept.ignore_changes) == set(current.ignore_changes) == {"triggers", "environment"}
    # the oldest version adopts the upload a stack deployed before per-version uploads had
    assert [a.name for a in aliases["local-image-cpu-1.0.0-vhd"]] == ["local-image-cpu-vhd"]  # type: ignore[attr-defined]
    assert "local-image-cpu-1.1.0-vhd" not in aliases
    assert [a.name for a in aliases["local-image-control-plane-1.0.0-vhd"]] == [  # type: ignore[attr-defined]
        "local-image-control-plane-vhd"]


def test_a_bump_without_previous_is_seen_by_the_review_and_one_with_it_is_not() -> None:
    from kilonode.config.load import stack_from_value
    from kilonode.plan import plan_stack
    from kilonode.render.cluster import render_tree
    from kilonode.review import lifecycle
    from kilonode.review.compare import compare_stack
    from kilonode.review.snapshot import entry

    def side(node_image: dict[str, object]) -> dict[str, Any]:
        cluster = shipped_cluster_value("local") | {"nodeImage": node_image}
        stack = stack_from_value("local", cluster, Path("stacks/Pulumi.local.yaml"))
        plan = plan_stack(stack)
        files = {path: f.content for path, f in render_tree(stack.config, plan).items()}
        return entry(plan, files, run_program("local", cluster))

    base = side({"version": "1.0.0"})
    [gone] = lifecycle.image_versions(compare_stack("local", base, side({"version": "1.1.0"})))
    assert "1.0.0 of cpu" in gone.summary and "set `previous` to the old version" in gone.summary
    assert lifecycle.image_versions(compare_stack("local", base, side({"version": "1.1.0", "previous": "1.0.0"}))) == []


@pytest.mark.parametrize("node_image,path,words", [
    ({"version": "1.0.0", "previous": "1.0.0"}, "nodeImage.previous", "same version as version"),
    ({"version": "1.0.0", "pools": {"gpu": {"version": "1.1.0"}}}, "nodeImage.pools.gpu", "names no pool"),
    ({"version": "1.0.0", "pools": {"cpu": {"version": "1.1.0", "previous": "1.1.0"}}}, "nodeImage.pools.cpu",
     "same version as version"),
])
def test_image_versions_that_cannot_be_are_refused(write_stack: StackWriter, node_image: dict[str, object],
                                                  path: str, words: str) -> None:
    cluster = shipped_cluster_value("local") | {"nodeImage": node_image}
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    assert any(p.path.startswith(path) and words in p.message for p in caught.value.problems), caught.value.problems
