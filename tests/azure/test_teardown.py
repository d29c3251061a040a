"""Teardown on purpose: a stack value arms `pulumi destroy` (the etcd VMs unprotected, the
resource group tagged), and nothing else does."""

from __future__ import annotations

import pytest

from kilonode.azure.graph import Graph
from kilonode.azure.mockplan import run_program
from kilonode.review import rules
from tests.conftest import shipped_cluster_value

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

VM = "azure-native:compute:VirtualMachine"
RG = "azure-native:resources:ResourceGroup"


def _policy_resources(graph: Graph) -> list[rules.Resource]:
    return [rules.Resource(r.type, r.name, r.plain(), r.protect) for r in graph.resources if r.custom]


def test_teardown_unprotects_the_etcd_vms_tags_the_group_and_the_policy_follows_the_tag() -> None:
    kept = run_program("local", shipped_cluster_value("local"))
    armed = run_program("local", shipped_cluster_value("local") | {"teardown": True})
    etcd = [r for r in kept.of_type(VM) if "etcd" in r.name]
    assert etcd and all(r.protect for r in etcd)
    assert not any(r.protect for r in armed.of_type(VM) if "etcd" in r.name)
    [group] = [r for r in armed.of_type(RG) if r.plain()["resourceGroupName"] == "local"]
    assert group.plain()["tags"]["kilonode-teardown"] == "armed" and group.protect
    [kept_group] = [r for r in kept.of_type(RG) if r.plain()["resourceGroupName"] == "local"]
    assert "kilonode-teardown" not in kept_group.plain()["tags"]
    # the invariant: unprotected etcd VMs are a violation unless the group says teardown
    assert rules.etcd_vms_protected(_policy_resources(armed)) == []
    untagged = [r if r.type != RG else rules.Resource(r.type, r.name, {**r.props, "tags": {}}, r.protect)
                for r in _policy_resources(armed)]
    assert len(rules.etcd_vms_protected(untagged)) == len(etcd)
