"""quota: what the stack needs, listed offline; with a recorded Azure (responses shaped as the
REST specs' examples, tests/preflight/fixtures) quota below need and a missing right are breaks.
Nothing here reaches the network: the real reader is built only from credentials in the
environment, which no test sets."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kilonode.preflight import run
from kilonode.preflight.checks.quota import (
    REGIONAL,
    ROLE_ASSIGNMENT_WRITE,
    NotFound,
    RestReader,
    allowed,
    evaluate,
    needs,
    network_needs,
    reader_from_env,
)
from tests.preflight.conftest import inputs_of

FIXTURES = Path(__file__).parent / "fixtures"


def body(name: str) -> list[dict[str, Any]]:
    return list(json.loads((FIXTURES / name).read_text())["responses"]["200"]["body"]["value"])


@dataclass
class Recorded:
    """An AzureReader answering from recorded response bodies."""

    usage: list[dict[str, Any]] = field(default_factory=lambda: body("usage_list.json"))
    network: list[dict[str, Any]] = field(default_factory=lambda: body("network_usage_list.json"))
    granted: list[dict[str, Any]] | None = field(default_factory=lambda: [{"actions": ["*"], "notActions": []}])
    subscription: str = "00000000-0000-0000-0000-000000000000"

    def usages(self, location: str) -> list[Mapping[str, Any]]:
        return list(self.usage)

    def network_usages(self, location: str) -> list[Mapping[str, Any]]:
        return list(self.network)

    def permissions(self, resource_group: str) -> list[Mapping[str, Any]]:
        if self.granted is None:
            raise NotFound(resource_group)
        return list(self.granted)


def test_research_7500_needs_720000_nd_vcpus_listed_offline() -> None:
    need, unknown = needs(inputs_of("research-7500"))
    assert unknown == []
    nd = {family: n.vcpus for family, n in need.items() if family.upper().replace(" ", "").startswith("STANDARDND")}
    assert sum(nd.values()) == 720_000
    # the D sizes: 288 vCPUs for the control plane and 48 for the system pool (3 x Standard_D16ds_v5);
    # the E size: 16 for the monitoring pool's one Standard_E16ds_v5
    assert need["standardDDSv5Family"].vcpus == 288 + 3 * 16
    assert need["standardEDSv5Family"].vcpus == 16
    assert need[REGIONAL].vcpus == 720_000 + need["standardDDSv5Family"].vcpus + need["standardEDSv5Family"].vcpus
    found = run(inputs_of("research-7500"), ["quota"])
    assert {f.level for f in found} == {"warn"}
    assert any("cannot confirm quota offline" in f.what and "720,352" in f.what for f in found)
    assert any(ROLE_ASSIGNMENT_WRITE in f.what for f in found)


def test_enough_quota_and_the_right_pass_with_a_recorded_azure() -> None:
    assert evaluate(inputs_of("research-7500"), Recorded()) == []


def test_quota_below_need_is_a_break() -> None:
    usage = copy.deepcopy(body("usage_list.json"))
    h100 = next(u for u in usage if u["name"]["value"] == "standardNDSH100v5Family")
    h100["limit"] = 200_000
    found = evaluate(inputs_of("research-7500"), Recorded(usage=usage))
    assert [(f.level, f.where) for f in found] == [("break", "quota standardNDSH100v5Family in southcentralus")]
    assert "needs 240,000 vCPUs" in found[0].what and "199,040 are free" in found[0].what


def test_a_family_azure_does_not_list_is_a_break_and_casing_does_not_matter() -> None:
    usage = [u | {"name": {"value": u["name"]["value"].upper()}} for u in body("usage_list.json")
             if u["name"]["value"] != "standardDDSv5Family"]
    found = evaluate(inputs_of("research-7500"), Recorded(usage=usage))
    assert [f.where for f in found] == ["quota standardDDSv5Family in southcentralus"]


def test_a_missing_role_assignment_right_is_a_break() -> None:
    contributor = body("permissions.json")
    assert not allowed(ROLE_ASSIGNMENT_WRITE, contributor)
    found = evaluate(inputs_of("research-7500"), Recorded(granted=contributor))
    assert [(f.level, f.where) for f in found] == [("break", "the deployer")]
    assert ROLE_ASSIGNMENT_WRITE in found[0].what


def test_rbac_wildcards_and_not_actions() -> None:
    assert allowed(ROLE_ASSIGNMENT_WRITE, [{"actions": ["Microsoft.Authorization/*"], "notActions": []}])
    assert not allowed(ROLE_ASSIGNMENT_WRITE, [{"actions": ["Microsoft.Compute/*"], "notActions": []}])
    # a notAction only cancels its own entry's actions
    assert allowed(ROLE_ASSIGNMENT_WRITE, [{"actions": ["*"], "notActions": ["microsoft.authorization/*/write"]},
                                           {"actions": ["Microsoft.Authorization/roleAssignments/*"]}])


def test_a_resource_group_not_created_yet_cannot_be_confirmed() -> None:
    found = evaluate(inputs_of("research-7500"), Recorded(granted=None))
    assert [(f.level, f.where) for f in found] == [("warn", "resource group research-7500")]


def test_the_real_reader_is_built_only_from_credentials() -> None:
    assert reader_from_env({}) is None
    assert reader_from_env({"AZURE_SUBSCRIPTION_ID": "s"}) is None
    reader = reader_from_env({"AZURE_SUBSCRIPTION_ID": "s", "AZURE_ACCESS_TOKEN": "t"})
    assert isinstance(reader, RestReader) and reader.subscription == "s"


def test_network_interfaces_are_counted_per_machine_and_instance_at_reach() -> None:
    # 13 control-plane VMs and 7,504 nodes (5,000 + 2,500 at maxNodes, 3 system, 1 monitoring)
    assert network_needs(inputs_of("research-7500")) == {"NetworkInterfaces": 13 + 7_504, "VirtualNetworks": 1}
    found = run(inputs_of("research-7500"), ["quota"])
    assert any("7,517 network interfaces and 1 VNet(s)" in f.what for f in found)


def test_too_few_network_interfaces_left_in_the_subscription_is_a_break() -> None:
    network = copy.deepcopy(body("network_usage_list.json"))
    nics = next(u for u in network if u["name"]["value"] == "NetworkInterfaces")
    nics["currentValue"] = 60_000  # another cluster in the same subscription and region
    found = evaluate(inputs_of("research-7500"), Recorded(network=network))
    assert [(f.level, f.where) for f in found] == [("break", "NetworkInterfaces in southcentralus")]
    assert "needs 7,517 NetworkInterfaces" in found[0].what and "5,536 are left" in found[0].what


def test_the_plan_counts_the_vcpus_the_graph_creates() -> None:
    # two counts of one need: the plan's (from the config, shown by `kilonode explain` and
    # `kilonode fleet`) and preflight's (from the recorded graph's VMs and scale sets)
    for stack in ("local", "research-2500", "research-7500"):
        inputs = inputs_of(stack)
        need, _ = needs(inputs)
        planned = {n.family: n.vcpus for n in inputs.plan.vcpu_quota}
        assert planned == {family: n.vcpus for family, n in need.items()}, stack
        assert inputs.plan.vcpu_quota[-1].family == REGIONAL
