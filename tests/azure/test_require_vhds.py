"""`pulumi up` refuses before anything is created when an image's VHD is neither built here nor
published: an image whose current version is in the gallery already (its upload ran when the
version was new and never runs again) needs no VHD on the machine running `pulumi up`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pulumi
import pytest

from kilonode.azure.deployer import Answer
from kilonode.azure.graph import Graph
from kilonode.azure.node_image import image_gallery
from kilonode.azure.program import require_vhds
from kilonode.config import load_stack
from kilonode.plan import checked_plan

GALLERY = "azure-native:compute:Gallery"


def test_the_gallery_asked_is_the_one_the_program_creates(graphs: dict[str, Graph]) -> None:
    for stack, graph in graphs.items():
        [gallery] = graph.of_type(GALLERY)
        cluster = checked_plan(load_stack(stack)).cluster
        assert gallery.inputs["galleryName"] == image_gallery(cluster)


def _az(published: set[tuple[str, str]], calls: list[Sequence[str]]):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str]) -> Answer:
        calls.append(argv)
        image = argv[argv.index("--gallery-image-definition") + 1]
        version = argv[argv.index("--gallery-image-version") + 1]
        if (image, version) in published:
            return Answer(0, "Succeeded\n", "")
        return Answer(3, "", "ResourceNotFound")
    return run


def test_an_image_published_in_the_gallery_needs_no_vhd_here(tmp_path: Path) -> None:
    plan = checked_plan(load_stack("local"))
    images = {i.name: i.version for i in plan.boot_images}
    vhds = {name: str(tmp_path / f"{name}.vhd") for name in images}
    built = next(iter(images))
    Path(vhds[built]).write_bytes(b"vhd")
    calls: list[Sequence[str]] = []
    published = {(name, version) for name, version in images.items() if name != built}
    require_vhds("local", vhds, plan, _az(published, calls))  # every other one published: goes on
    assert len(calls) == len(images) - 1  # the built one is not asked about
    assert all(c[:4] == ["az", "sig", "image-version", "show"] and image_gallery(plan.cluster) in c for c in calls)
    one = next(name for name in images if name != built)
    with pytest.raises(pulumi.RunError, match=rf"1 of the {len(images)} disk images .* not published") as refused:
        require_vhds("local", vhds, plan, _az(published - {(one, images[one])}, []))
    assert vhds[one] in str(refused.value) and "nothing was created" in str(refused.value)


def test_without_a_login_every_missing_vhd_is_required(tmp_path: Path) -> None:
    plan = checked_plan(load_stack("local"))
    vhds = {i.name: str(tmp_path / f"{i.name}.vhd") for i in plan.boot_images}
    with pytest.raises(pulumi.RunError, match=rf"{len(vhds)} of the {len(vhds)} disk images"):
        require_vhds("local", vhds, plan, lambda argv: Answer(1, "", "Please run 'az login'"))
