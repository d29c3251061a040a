"""`kilonode plan`: deterministic, readable, no key material; bad stacks exit 2."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from kilonode.azure.graph import Graph, format_json, format_markdown, format_text
from kilonode.azure.mockplan import run_plan
from kilonode.cli import app
from kilonode.config import load_stack

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

FORMATTERS = [format_text, format_json, format_markdown]


@pytest.mark.parametrize("formatter", FORMATTERS, ids=["text", "json", "md"])
def test_nothing_in_the_plan_output_contains_private_key_material(
    graph_7500: Graph, formatter: Callable[[Graph], str]
) -> None:
    # Under the mock engine a private key is a placeholder (mockplan: never PEM), so look for
    # those: they are in the unmasked inputs, and must not be in what `kilonode plan` prints.
    unmasked = json.dumps([r.plain() for r in graph_7500.resources])
    assert "mock-private-key:research-7500-tls-etcd-main-ca-key" in unmasked
    assert "mock-private-key:research-7500-tls-admin-key" in unmasked
    text = formatter(graph_7500)
    assert "mock-private-key" not in text
    assert "[secret]" in text


def test_the_plan_of_research_7500_meets_the_issues_done_when(graph_7500: Graph) -> None:
    plan = json.loads(format_json(graph_7500))
    assert plan["stack"] == "research-7500"
    resources = plan["resources"]
    assert all(set(r) >= {"type", "name", "parent", "inputs"} for r in resources)

    def of(type_: str) -> list[dict[str, Any]]:
        return [r for r in resources if r["type"] == type_]

    vms = of("azure-native:compute:VirtualMachine")
    assert sum(r["parent"] == "research-7500-etcd-main" for r in vms) == 5
    assert sum(r["parent"] == "research-7500-etcd-events" for r in vms) == 3
    assert sum(r["parent"] == "research-7500-apiserver" for r in vms) == 5
    assert len(of("azure-native:network:LoadBalancer")) == 2  # internal, and public for the deployer
    sets = of("azure-native:compute:VirtualMachineScaleSet")
    # 7,500 GPU nodes + 3 system nodes + the monitoring node
    assert len(sets) >= 75 and sum(s["inputs"]["sku"]["capacity"] for s in sets) == 7500 + 3 + 1
    for s in sets:
        (nic,) = s["inputs"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
        # podsPerNode in the stack file: 3 on the GPU pools, 16 on the system pool, 4 on the monitoring pool
        pods = 16 if "-system-" in s["name"] else 4 if "-monitoring-" in s["name"] else 3
        assert len(nic["ipConfigurations"]) == 1 + pods
    control = {"10.0.0.0/24", "10.0.1.0/24"}
    for nsg in of("azure-native:network:NetworkSecurityGroup"):
        for rule in nsg["inputs"]["securityRules"]:
            ports = {rule.get("destinationPortRange"), *(rule.get("destinationPortRanges") or [])}
            if rule["access"] == "Allow" and ports & {"2379", "2380"}:
                assert set(rule["sourceAddressPrefixes"]) <= control


def test_the_plan_is_deterministic_run_to_run(graphs: dict[str, Graph]) -> None:
    # the session's recording of `local` was an earlier run in this process: this is the second
    assert format_json(run_plan(load_stack("local"))) == format_json(graphs["local"])


def test_resources_are_listed_depth_first_under_their_parents(graph_7500: Graph) -> None:
    seen: set[str] = set()
    for r in graph_7500.resources:
        assert r.parent is None or r.parent in seen, f"{r.name} listed before its parent {r.parent}"
        seen.add(r.name)
    names = [r.name for r in graph_7500.children("research-7500-a100-ib")]
    assert names == sorted(names) and len(names) == 50


def test_plan_text_ends_with_counts_per_type(graph_7500: Graph) -> None:
    text = format_text(graph_7500)
    counts = text.split("Resources per type:\n", 1)[1]
    # a100-ib's 50 and h100-ib's 25 scale sets of 100, system's 3 (one per zone), monitoring's 1
    assert re.search(rf"azure-native:compute:VirtualMachineScaleSet\s+{50 + 25 + 3 + 1}\n", counts)
    assert re.search(rf"total\s+{len(graph_7500.resources)}\n", counts)


def test_plan_command_prints_json_for_a_stack_name() -> None:
    result = CliRunner().invoke(app, ["plan", "local", "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["stack"] == "local" and plan["resources"][0]["type"] == "kilonode:azure:Cluster"
    # the GPU section (kilonode.k8s.gpu.describe): who acts on GPU nodes has no object of its own
    assert plan["notes"] == {"GPU access": ["no GPU pools: no device plugin, no GPU health agent or controller"]}


def test_plan_command_exits_2_with_the_stack_problems(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": {"name": "bad", "nodePools": [
        {"name": "gpu", "nodes": 10, "podsPerNode": 999}],
        "joinTokens": {"current": {"generation": 1, "expires": "2027-11-30T00:00:00Z"}}}}}))
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert result.stderr == (
        f"kilonode: 1 problem in {path}; nothing was written\n"
        f"{path}:11: nodePools[0].podsPerNode: each NIC would need 1 + 999 = 1000 IP configurations, above Azure's "
        "256 per NIC; lower podsPerNode to at most 255\n"
    )


def test_the_plan_shows_the_pinned_binaries_of_every_role(graph_7500: Graph) -> None:
    from kilonode.azure.graph import _unwrap

    pinned = _unwrap(graph_7500.outputs)["pinnedBinaries"]
    assert sorted(pinned) == ["apiserver", "etcd", "pool-a100-ib", "pool-h100-ib", "pool-monitoring", "pool-system"]
    assert sorted(pinned["pool-a100-ib"]) == [
        "azure-cni", "cni-plugins", "cri-dockerd", "crictl", "kubelet",
        "nccl-topology-ndv4",
    ]
    # GPU pools: the size's NCCL topology is pinned (the container toolkit is no pinned binary:
    # it comes from NVIDIA's apt repository, node-image/recipe.toml)
    assert pinned["pool-h100-ib"]["nccl-topology-ndv5"]["digest"] == (
        "sha256:c26ff47f1decf03d44ee6e90c4a8afd3bddeec334c5545008f33af2a297e2834"
    )
    # the one component without a published digest says so, instead of a digest
    azure_cni = pinned["pool-a100-ib"].pop("azure-cni")
    assert azure_cni.get("digest") is None and azure_cni["unpinned"].startswith("no published digest")
    pinned["pool-h100-ib"].pop("azure-cni")
    assert pinned["pool-system"].pop("azure-cni").get("digest") is None  # the CPU system pool: the same
    assert pinned["pool-monitoring"].pop("azure-cni").get("digest") is None  # and the CPU monitoring pool
    assert pinned["pool-a100-ib"]["kubelet"]["version"] == "1.34.2"
    assert pinned["pool-a100-ib"]["kubelet"]["url"] == "https://dl.k8s.io/release/v1.34.2/bin/linux/amd64/kubelet"
    assert pinned["etcd"]["etcd"]["version"] == "3.5.33"
    assert pinned["apiserver"]["kubernetes-server"]["digest"].startswith("sha512:")
    assert all(entry["digest"].startswith(("sha256:", "sha512:"))
               for role in pinned.values() for entry in role.values())
