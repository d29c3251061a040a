"""NCCL on the InfiniBand GPU sizes Azure publishes a topology for: the plan names the family
per size, the image build takes the pinned topology file, and /etc/nccl.conf is what Azure's
own HPC images write for that family, read the way NCCL reads it."""

from __future__ import annotations

import pytest

from kilonode.catalog import binaries
from kilonode.catalog.vm import vm_sizes
from kilonode.config import load_stack
from kilonode.plan import plan_stack
from kilonode.plan.wellknown import NCCL_CONF, NCCL_TOPOLOGY_LABEL
from kilonode.render.pool import nccl_conf, render_pool
from tests import shared
from tests.conftest import StackWriter, shipped_cluster_value

# Azure/azhpc-images components/setup_sku_customizations.sh at 8e9d055f: which VM sizes get
# which topology family (the case patterns, applied to the catalogue's names by hand).
AZHPC_FAMILIES = {
    "Standard_ND40rs_v2": "ndv2",
    "Standard_ND96asr_v4": "ndv4",
    "Standard_ND96amsr_A100_v4": "ndv4",
    "Standard_ND96isr_H100_v5": "ndv5",
    "Standard_ND96isr_H200_v5": "ndv5",
}
# components/customizations/<family>.sh at the same commit: what each writes to /etc/nccl.conf.
AZHPC_NCCL_CONF = {
    "ndv2": {"NCCL_TOPO_FILE": "/opt/microsoft/ndv2/topo.xml", "NCCL_IGNORE_CPU_AFFINITY": "1"},
    "ndv4": {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_TOPO_FILE": "/opt/microsoft/ndv4/topo.xml",
             "NCCL_IGNORE_CPU_AFFINITY": "1"},
    "ndv5": {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_TOPO_FILE": "/opt/microsoft/ndv5/topo.xml",
             "NCCL_IGNORE_CPU_AFFINITY": "1"},
}


def nccl_reads(text: str) -> dict[str, str]:
    """NCCL's setEnvFile (src/include/param.h): each line up to the first '=' is a variable,
    the rest its value; a line without '=' is skipped (so a comment must hold none)."""
    env: dict[str, str] = {}
    for line in text.split("\n"):
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        env.setdefault(key, value)
    return env


def test_the_catalogue_names_exactly_azures_topology_families() -> None:
    named = {name: size.nccl_topology for name, size in vm_sizes().items() if size.nccl_topology}
    assert named == AZHPC_FAMILIES
    assert all(vm_sizes()[name].infiniband and vm_sizes()[name].gpus for name in named)


def test_research_7500_pools_get_their_family_label_and_nccl_conf() -> None:
    plan = plan_stack(load_stack("research-7500"))
    families = {pool.name: pool.nccl_topology for pool in plan.gpu_pools}
    assert families == {"a100-ib": "ndv4", "h100-ib": "ndv5"}
    for pool in plan.gpu_pools:
        assert pool.labels[NCCL_TOPOLOGY_LABEL] == pool.nccl_topology
        files = render_pool(plan, pool)
        env = nccl_reads(files[NCCL_CONF.lstrip("/")].content)
        assert env == AZHPC_NCCL_CONF[str(pool.nccl_topology)]


@pytest.mark.parametrize("stack", ["local", "research-2500"])
def test_pools_without_a_published_topology_get_none(stack: str) -> None:
    """local has no GPUs; research-2500's NC A100 v4 pool has GPUs but no InfiniBand."""
    plan = shared.plan(stack)
    rendered = shared.rendered(stack)
    for pool in plan.node_pools:
        assert pool.nccl_topology is None and NCCL_TOPOLOGY_LABEL not in pool.labels
        assert NCCL_CONF.lstrip("/") not in rendered[f"pool-{pool.name}"]


def test_an_ib_size_without_infiniband_in_use_gets_no_topology(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    pool = cluster["nodePools"][0]
    pool["vmSize"] = "Standard_ND96isr_H100_v5"
    pool["infiniband"] = False
    pool.pop("gpusPerNode", None)
    plan = plan_stack(load_stack(str(write_stack(cluster))))
    assert plan.node_pools[0].nccl_topology is None


@pytest.mark.parametrize("family", sorted(AZHPC_NCCL_CONF))
def test_the_topology_file_is_pinned_at_the_commit_its_digest_came_from(family: str) -> None:
    catalog = binaries.load()
    [resolved] = catalog.resolve(f"nccl-{family}", "1.34.2")
    source = catalog.sources[resolved.pin.source]
    assert source.repo == "Azure/azhpc-images"
    assert resolved.url == (
        f"https://raw.githubusercontent.com/Azure/azhpc-images/{source.commit}/topology/{family}-topo.xml"
    )
    assert [f.path for f in resolved.files] == [f"/opt/microsoft/{family}/topo.xml"]
    # the rendered /etc/nccl.conf names the file the build places
    assert nccl_reads(nccl_conf(family))["NCCL_TOPO_FILE"] == resolved.files[0].path
