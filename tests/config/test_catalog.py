"""Stacks are checked against the Azure facts in infra/kilonode/catalog: sizes and regions."""

from __future__ import annotations

from ipaddress import IPv4Network
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kilonode.catalog import CATALOG_DIR, read
from kilonode.catalog import vm as catalog
from kilonode.catalog.components import Component, components
from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.problems import StackError
from kilonode.review.versions import minor
from tests.conftest import StackWriter, shipped_cluster_value


def problems_of(cluster: dict, write_stack: StackWriter) -> list[str]:
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    return [p.format("S") for p in caught.value.problems]


def test_every_size_the_shipped_stacks_and_defaults_use_is_in_the_catalogue() -> None:
    from kilonode.config.model import ApiserverConfig, EtcdClusterConfig, NodePoolConfig

    used = {EtcdClusterConfig().vm_size, ApiserverConfig().vm_size, NodePoolConfig(name="x", nodes=1).vm_size}
    for name in ("local", "research-2500", "research-7500"):
        config = load_stack(name).config
        used |= {config.etcd.main.vm_size, config.etcd.events.vm_size, config.apiserver.vm_size}
        used |= {p.vm_size for p in config.node_pools}
    assert used <= set(catalog.vm_sizes())


def test_catalogue_rows_are_consistent() -> None:
    sizes = catalog.vm_sizes()
    assert len(sizes) >= 30
    for name, size in sizes.items():
        assert name.startswith("Standard_"), name
        assert (size.gpus == 0) == (size.gpu_model is None), name
        assert "microsoft.com" in size.source, name
        assert set(size.generations) <= {1, 2} and size.generations, name
    # what the field notes and stacks rely on
    assert (sizes["Standard_ND96asr_v4"].gpus, sizes["Standard_ND96asr_v4"].infiniband) == (8, True)
    h100 = sizes["Standard_ND96isr_H100_v5"]
    assert (h100.infiniband, h100.nvme_disks) == (True, catalog.NvmeDisks(count=8, size_gib=3584))
    assert sizes["Standard_D16ds_v5"].temp_disk_gib == 600 and sizes["Standard_D16s_v5"].temp_disk_gib == 0
    assert sizes["Standard_NC24ads_A100_v4"].infiniband is False


def test_every_gpu_size_says_whether_it_has_nvswitch() -> None:
    sizes = catalog.vm_sizes()
    for name, size in sizes.items():
        assert (size.nvswitch is not None) == (size.gpus > 0), name
    # the shipped GPU sizes are HGX boards: Fabric Manager must run on them
    assert catalog.nvswitch_of("Standard_ND96asr_v4") and catalog.nvswitch_of("Standard_ND96isr_H100_v5")
    # PCIe cards and NDv2's hybrid cube-mesh have no NVSwitch; a CPU size or an unknown one neither
    assert not catalog.nvswitch_of("Standard_NC24ads_A100_v4") and not catalog.nvswitch_of("Standard_ND40rs_v2")
    assert not catalog.nvswitch_of("Standard_D16ds_v5") and not catalog.nvswitch_of("Standard_Nope")
    row = sizes["Standard_NC24ads_A100_v4"].model_dump(by_alias=True)
    with pytest.raises(ValueError, match="must state nvswitch"):
        catalog.VmSize.model_validate({**row, "nvswitch": None})
    cpu = sizes["Standard_D16ds_v5"].model_dump(by_alias=True)
    with pytest.raises(ValueError, match="nvswitch: true on a size without GPUs"):
        catalog.VmSize.model_validate({**cpu, "nvswitch": True})


def test_an_unknown_size_is_refused_with_the_close_match(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["vmSize"] = "Standard_ND96isr_H100_v6"
    [problem] = problems_of(cluster, write_stack)
    assert "nodePools[0].vmSize: 'Standard_ND96isr_H100_v6' is not in kilonode's size catalogue" in problem
    assert "did you mean 'Standard_ND96isr_H100_v5'?" in problem


def test_an_unknown_region_is_refused_with_the_close_match(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local") | {"location": "eastuss"}
    [problem] = problems_of(cluster, write_stack)
    assert "location: 'eastuss' is not an Azure region name; did you mean 'eastus'?" in problem


def test_infiniband_on_a_size_without_it_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["infiniband"] = True
    [problem] = problems_of(cluster, write_stack)
    assert "nodePools[0].infiniband: Standard_D4ds_v5 has no InfiniBand" in problem


def test_a_gpu_count_that_contradicts_the_size_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-2500")
    cluster["nodePools"][0]["gpusPerNode"] = 8
    [problem] = problems_of(cluster, write_stack)
    assert "nodePools[0].gpusPerNode: Standard_NC24ads_A100_v4 has 1 GPUs" in problem


def test_a_cpu_pool_without_gpus_per_node_gets_its_sizes_zero_gpus(write_stack: StackWriter) -> None:
    """Before the catalogue, leaving gpusPerNode out gave every pool 8 GPUs."""
    cluster = shipped_cluster_value("local")
    del cluster["nodePools"][0]["gpusPerNode"]
    [pool] = plan_stack(load_stack(str(write_stack(cluster)))).node_pools
    assert pool.gpus_per_node == 0 and not pool.infiniband


def test_a_gpu_pool_without_gpus_or_infiniband_gets_them_from_its_size(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    # the GPU pools: every pool but those the stack declares without GPUs (system, monitoring)
    cluster["nodePools"] = [pool for pool in cluster["nodePools"] if pool.get("gpusPerNode") != 0]
    assert [pool["name"] for pool in cluster["nodePools"]] == ["a100-ib", "h100-ib"]
    for pool in cluster["nodePools"]:
        pool.pop("gpusPerNode", None)
        pool.pop("infiniband", None)
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    assert all(p.gpus_per_node == 8 and p.infiniband for p in plan.node_pools)
    assert all(s.capacity <= 100 for p in plan.node_pools for s in p.shards)


def test_a_size_without_the_local_disk_the_stack_relies_on_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-2500")
    cluster["etcd"] = {"main": {"vmSize": "Standard_D16s_v5"}}
    [problem] = problems_of(cluster, write_stack)
    assert "etcd.main.vmSize: Standard_D16s_v5 has no local temp disk" in problem
    assert "e.g. Standard_D16ds_v5" in problem


@pytest.mark.parametrize("field", ["adminCidr", "apiserverAllowedCidrs"])
def test_world_open_access_needs_an_acknowledgement(write_stack: StackWriter, field: str) -> None:
    cluster = shipped_cluster_value("local")
    value = "0.0.0.0/0" if field == "adminCidr" else ["0.0.0.0/0"]
    cluster["network"] = {**cluster["network"], "publicIpsOnControlPlane": True, field: value}
    [problem] = problems_of(cluster, write_stack)
    assert problem.split(": ", 1)[1] == {
        "adminCidr": "network.adminCidr: 0.0.0.0/0 opens SSH (22) on every control-plane VM to the whole internet "
                     "through their public IPs; name the ranges that need it, or set "
                     "network.acknowledgeWorldOpenAccess: true if you mean it",
        "apiserverAllowedCidrs": "network.apiserverAllowedCidrs[0]: 0.0.0.0/0 opens the apiserver (6443) to the "
                                 "whole internet; name the ranges that need it, or set "
                                 "network.acknowledgeWorldOpenAccess: true if you mean it",
    }[field]
    cluster["network"]["acknowledgeWorldOpenAccess"] = True
    if field == "adminCidr":
        # acknowledged, the world is still refused for SSH: it holds the cluster's own pods
        [problem] = problems_of(cluster, write_stack)
        assert "network.adminCidr: 0.0.0.0/0 overlaps nodePools[0].subnet" in problem
        return
    network = load_stack(str(write_stack(cluster))).config.network
    assert (network.admin_cidr, network.apiserver_allowed_cidrs) == (None, (IPv4Network("0.0.0.0/0"),))


RUNNER_VNET = ("/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/ci/providers/"
               "Microsoft.Network/virtualNetworks/runners")


@pytest.mark.parametrize(("deployer", "expected"), [
    ({"network": "internet", "cidrs": ["0.0.0.0/0"]},
     "deployer.cidrs[0]: 0.0.0.0/0 opens the apiserver (6443) to the whole internet; name the ranges that need it"),
    ({"network": "peered", "vnetId": RUNNER_VNET, "cidrs": ["10.0.9.0/24"]},
     "deployer.cidrs[0]: 10.0.9.0/24 overlaps network.vnetCidr 10.0.0.0/16: Azure cannot peer overlapping"),
    ({"network": "peered", "cidrs": ["10.200.0.0/24"]}, "network: peered needs vnetId"),
    ({"network": "internet", "vnetId": RUNNER_VNET, "cidrs": ["20.1.2.3/32"]}, "vnetId is for network: peered"),
    ({"network": "internet", "cidrs": []}, "deployer.cidrs"),
    ({"network": "peered", "vnetId": "/subscriptions/x/resourceGroups/ci", "cidrs": ["10.200.0.0/24"]},
     "deployer.vnetId"),
])
def test_a_deployer_azure_could_not_connect_is_refused(write_stack: StackWriter, deployer: dict[str, object],
                                                       expected: str) -> None:
    cluster = shipped_cluster_value("local")
    cluster["deployer"] = deployer
    assert any(expected in problem for problem in problems_of(cluster, write_stack)), problems_of(cluster, write_stack)


def test_a_rolling_resize_names_existing_members_and_known_sizes(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("research-7500")
    cluster["etcd"]["main"]["vmSizeOverrides"] = {3: "Standard_D32ds_v5"}
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    assert [m.vm_size for m in plan.etcd_main.members] == ["Standard_D16ds_v5"] * 3 + ["Standard_D32ds_v5",
                                                                                     "Standard_D16ds_v5"]
    cluster["etcd"]["main"]["vmSizeOverrides"] = {5: "Standard_D32ds_v5"}
    [problem] = problems_of(cluster, write_stack)
    assert "etcd.main.vmSizeOverrides[5]: names member 5, but the members are numbered 0 to 4" in problem
    cluster["etcd"]["main"]["vmSizeOverrides"] = {1: "Standard_D32s_v5"}
    [problem] = problems_of(cluster, write_stack)
    assert "etcd.main.vmSizeOverrides[1]" in problem and "no local temp disk" in problem, problem


@pytest.mark.parametrize("path", sorted(catalog.CATALOG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_catalogue_file_reads_alike_through_libyaml_and_pure_python(path: Path) -> None:
    # kilonode.catalog.read takes libyaml's parser where PyYAML has it; the data must be the
    # pure-Python parser's, types included (1 and "1", dates, nulls)
    text = path.read_text(encoding="utf-8")
    pure = yaml.safe_load(text)
    assert read(path) == pure and repr(read(path)) == repr(pure)


# --- regions as users write them, and where each size is sold -------------------------------------

@pytest.mark.parametrize("written", ["West US 3", "West US3", "westus 3", "WESTUS3"])
def test_a_region_written_as_its_display_name_is_taken_as_its_programmatic_name_with_a_note(
        write_stack: StackWriter, written: str) -> None:
    stack = load_stack(str(write_stack(shipped_cluster_value("local") | {"location": written})))
    plan = plan_stack(stack)
    assert stack.config.location == plan.location == "westus3"
    [note] = [w for w in plan.warnings if w.startswith("location:")]
    assert note.startswith(f"location: {written!r} is ") and "write `location: westus3` to drop this note" in note


def test_a_region_written_as_its_programmatic_name_gets_no_note(write_stack: StackWriter) -> None:
    plan = plan_stack(load_stack(str(write_stack(shipped_cluster_value("local") | {"location": "westus3"}))))
    assert not [w for w in plan.warnings if w.startswith("location:")]


def test_a_display_name_of_no_region_is_refused_with_the_programmatic_name_it_is_closest_to(
        write_stack: StackWriter) -> None:
    [problem] = problems_of(shipped_cluster_value("local") | {"location": "Sweden Centrl"}, write_stack)
    assert "location: 'Sweden Centrl' is not an Azure region name; did you mean 'swedencentral'?" in problem


def test_every_display_name_is_its_programmatic_name_spaced() -> None:
    # hand-written rows from the Learn page, and the rule ARM compares by (case and spaces ignored)
    names = catalog.region_display_names()
    assert names["westus3"] == "West US 3" and names["australiacentral2"] == "Australia Central 2"
    assert names["southcentralus"] == "South Central US" and names["uaenorth"] == "UAE North"
    for name, display in names.items():
        assert catalog.region_name(display) == name == "".join(display.split()).lower()
    assert catalog.region_name("West US 9") is None


def seeded_h100(monkeypatch: pytest.MonkeyPatch, regions: tuple[str, ...]) -> None:
    """A catalogue whose ND96isr_H100_v5 row lists `regions` (a seeded row: the shipped one records none)."""
    real = catalog._availability()
    source = catalog.RegionSource(title="Seeded test row", url="https://example.com/seeded", file="tests",
                                  date="2026-01-01", read="2026-01-02")
    seeded = real.model_copy(update={
        "sources": real.sources | {"seeded": source},
        "sizes": real.sizes | {"Standard_ND96isr_H100_v5": catalog.SizeRegions(regions=regions, source="seeded")},
    })
    monkeypatch.setattr(catalog, "_availability", lambda: seeded)


def test_a_gpu_size_in_a_region_the_catalogue_does_not_list_is_refused_naming_where_it_is_sold(
        write_stack: StackWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    seeded_h100(monkeypatch, ("eastus", "southcentralus"))
    cluster = shipped_cluster_value("research-7500") | {"location": "westus2"}
    [problem] = problems_of(cluster, write_stack)
    assert problem.split(": ", 1)[1] == (
        "nodePools[1].vmSize: Standard_ND96isr_H100_v5 is not sold in westus2 by kilonode's catalogue, which lists "
        "it in eastus, southcentralus (Seeded test row, dated 2026-01-01, read 2026-01-02: "
        "infra/kilonode/catalog/vm_regions.yaml); move location to one of those or pick another size; if Azure "
        "sells it in westus2 now (`az vm list-skus --location westus2 --size Standard_ND96isr_H100_v5 --all "
        "--output table` lists it without restrictions), add Standard_ND96isr_H100_v5 to sizesConfirmedInLocation")
    # where the catalogue lists it, and where the stack confirms Azure sells it now, it loads
    load_stack(str(write_stack(cluster | {"location": "southcentralus"})))
    confirmed = load_stack(str(write_stack(cluster | {"sizesConfirmedInLocation": ["Standard_ND96isr_H100_v5"]})))
    assert confirmed.config.sizes_confirmed_in_location == ("Standard_ND96isr_H100_v5",)


def test_a_confirmation_the_stack_does_not_need_is_refused(write_stack: StackWriter,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seeded_h100(monkeypatch, ("eastus", "southcentralus"))
    cluster = shipped_cluster_value("research-7500") | {
        "sizesConfirmedInLocation": ["Standard_ND96isr_H100_v5", "Standard_D16ds_v5", "Standard_ND96amsr_A100_v4"]}
    assert [p.split(": ", 1)[1] for p in problems_of(cluster, write_stack)] == [
        "sizesConfirmedInLocation[0]: kilonode's catalogue (read 2026-01-02) already lists Standard_ND96isr_H100_v5 "
        "in southcentralus; remove it",
        "sizesConfirmedInLocation[1]: kilonode's catalogue (read 2026-12-07) already lists Standard_D16ds_v5 in "
        "southcentralus; remove it",
        "sizesConfirmedInLocation[2]: Standard_ND96amsr_A100_v4 is not a size this stack uses; remove it",
    ]


def used_sizes() -> dict[str, set[str]]:
    """Each shipped stack's location -> the sizes it names, the defaults' included."""
    from kilonode.config.model import ApiserverConfig, EtcdClusterConfig, NodePoolConfig

    defaults = {EtcdClusterConfig().vm_size, ApiserverConfig().vm_size, NodePoolConfig(name="x", nodes=1).vm_size}
    used: dict[str, set[str]] = {}
    for name in ("local", "research-2500", "research-7500"):
        config = load_stack(name).config
        sizes = {config.etcd.main.vm_size, config.etcd.events.vm_size, config.apiserver.vm_size}
        used[name] = sizes | {p.vm_size for p in config.node_pools} | defaults
    return used


def test_the_shipped_stacks_ask_for_no_size_where_the_catalogue_says_it_is_not_sold() -> None:
    for name, sizes in used_sizes().items():
        location = load_stack(name).config.location
        assert all(catalog.sold_in(size, location) is not False for size in sizes), name


def test_every_size_the_shipped_stacks_use_has_a_row_saying_where_it_is_sold_or_that_nobody_recorded_it() -> None:
    rows = catalog._availability().sizes
    used = set().union(*used_sizes().values())
    assert used <= set(rows)
    # the CPU sizes follow Microsoft's foundational series (everywhere); the GPU sizes are not recorded
    # (vm_regions.yaml says why): a test to revisit when a dated per-region list is added
    assert {s for s in used if rows[s].regions == "all"} == {s for s in used if catalog.vm_sizes()[s].gpus == 0}
    assert {s for s in used if rows[s].regions is None} == {s for s in used if catalog.vm_sizes()[s].gpus > 0}


def test_a_vm_regions_row_naming_no_region_or_no_source_is_refused() -> None:
    good = {"sources": {"s": {"title": "t", "url": "https://x", "file": "f", "date": "d", "read": "r"}}}
    with pytest.raises(ValueError, match=r"\['westus9'\] not in regions\.yaml"):
        catalog._AvailabilityFile.model_validate(
            good | {"sizes": {"Standard_D4ds_v5": {"regions": ["westus2", "westus9"], "source": "s"}}})
    with pytest.raises(ValueError, match="needs its source"):
        catalog._AvailabilityFile.model_validate(good | {"sizes": {"Standard_D4ds_v5": {"regions": "all",
                                                                                        "source": None}}})
    with pytest.raises(ValueError, match=r"not a size in vm_sizes\.yaml"):
        catalog._AvailabilityFile.model_validate(good | {"sizes": {"Standard_Nope": {"regions": "all", "source": "s"}}})


# --- image digests per release (components.yaml `digests`) ----------------------------------------

def test_a_per_release_digest_pins_that_release_alone() -> None:
    proxy = components().kube_proxy
    # by hand from kubernetes/k8s.io@ecf019a8 registry.k8s.io/images/k8s-staging-kubernetes/images.yaml,
    # image kube-proxy: the multi-architecture index of v1.33.5
    assert proxy.image("kubeProxy", "v1.33.5") == (
        "registry.k8s.io/kube-proxy:v1.33.5@sha256:71445ec84ad98bd52a7784865a9d31b1b50b56092d3f7699edc39eefd71befe1")
    assert proxy.image("kubeProxy", "v1.34.2") == "registry.k8s.io/kube-proxy:v1.34.2"  # none read: by tag
    assert components().scheduler_plugins.by_tag() == {"scheduler": ["v0.34.7"], "controller": ["v0.34.7"]}


@pytest.mark.parametrize(("change", "refusal"), [
    ({"digests": {"v0.31.0": {"scheduler": "sha256:" + "a" * 64}}}, "no pinned release"),
    ({"digests": {"v0.32.7": {"schedular": "sha256:" + "a" * 64}}}, "which no image is"),
    ({"digests": {"v0.32.7": {"scheduler": "sha256:" + "A" * 64}}}, "String should match pattern"),
])
def test_a_digest_for_no_pinned_release_or_image_is_refused(change: dict[str, object], refusal: str) -> None:
    """Seeded breaks: a digest no image would use is a typo, not a pin."""
    row = yaml.safe_load((CATALOG_DIR / "components.yaml").read_text())["components"]["schedulerPlugins"]
    with pytest.raises(ValidationError, match=refusal):
        Component.model_validate(row | change)


def test_the_review_reads_the_minor_of_an_image_pinned_by_digest() -> None:
    assert minor("registry.k8s.io/kube-proxy:v1.33.5@sha256:" + "0" * 64) == 33
    assert minor("registry.k8s.io/kube-proxy:v1.34.2") == 34
