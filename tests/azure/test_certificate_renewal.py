"""Certificate renewal, one control-plane host per `pulumi up`, under the mock engine: a host's
generation (certificateGenerations) is the replacement trigger of its leaves' keys, requests
and certificates and of nothing else; the new key material changes that host's custom data
alone; the restart guard lets one member through and refuses a majority."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kilonode.azure import rollout
from kilonode.azure.graph import Graph, _unwrap
from kilonode.azure.mockplan import run_program
from tests.azure.conftest import VM
from tests.azure.test_restart_guard import local_with
from tests.graphcache import recorded_program

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

TLS_TYPES = ("tls:index/privateKey:PrivateKey", "tls:index/certRequest:CertRequest",
             "tls:index/locallySignedCert:LocallySignedCert")


@pytest.fixture(scope="module")
def deployed(graphs: dict[str, Graph]) -> dict[str, Any]:
    """The `local` stack's outputs as the last `pulumi up` left them (every generation 0)."""
    return _unwrap(graphs["local"].outputs)


def restart_keys(graph: Graph) -> dict[str, dict[str, Any]]:
    return {vm: key for group in _unwrap(graph.outputs)[rollout.RESTART_KEYS_OUTPUT].values()
            for vm, key in group.items()}


def tls_state(graph: Graph) -> dict[str, tuple[Any, Any]]:
    """Each pulumi-tls resource's (inputs, replacement trigger)."""
    return {r.name: (r.plain(), r.replacement_trigger) for r in graph.resources if r.type in TLS_TYPES}


def test_every_host_leaf_carries_its_generation_as_trigger_and_nothing_else_does(graphs: dict[str, Graph]) -> None:
    for stack, graph in graphs.items():
        triggered = {r.name for r in graph.resources if r.replacement_trigger is not None}
        host_leaves = {r.name for r in graph.resources if r.type in TLS_TYPES and not r.name.endswith("-ca-key")
                       and any(f"-tls-{role}-" in r.name for role in ("etcd-main", "etcd-events", "apiserver"))}
        # the exported admin credential: by the stack's adminGeneration (its revocation)
        admin = {f"{stack}-tls-admin{part}" for part in ("", "-csr", "-key")}
        # the CAs' keys and certificates, the super-admin's and the service-account key: never
        assert not any(r.name.endswith(("-ca", "-ca-key", "-super-admin", "-super-admin-key", "-service-account-key"))
                       for r in graph.resources if r.replacement_trigger is not None), stack
        assert triggered == host_leaves | admin and host_leaves, (stack, triggered ^ (host_leaves | admin))
        assert {r.replacement_trigger for r in graph.resources if r.name in triggered} == {0}


def test_early_renewal_is_off_for_host_leaves_and_the_admins_30_days_renew_in_their_last_10(
    graphs: dict[str, Graph],
) -> None:
    signed = {r.name: r.plain() for r in graphs["research-7500"].of_type(TLS_TYPES[2])}
    # Calico's Typha certificates live in the cluster (kilonode.k8s.calico): renewed 30 days early
    calico = {name: signed.pop(name)["earlyRenewalHours"] for name in list(signed) if "-calico-" in name}
    assert calico == {f"research-7500-k8s-calico-{app}-cert": 30 * 24 for app in ("calico-typha", "calico-node")}
    hours = {name: inputs["earlyRenewalHours"] for name, inputs in signed.items()}
    validity = {name: inputs["validityPeriodHours"] for name, inputs in signed.items()}
    for admin in ("research-7500-tls-admin", "research-7500-tls-super-admin"):
        assert (hours.pop(admin), validity.pop(admin)) == (10 * 24, 30 * 24)
    assert set(hours.values()) == {0} and len(hours) == 5 * 2 + 3 * 2 + 5 * 10
    assert set(validity.values()) == {365 * 24}


def test_a_new_admin_generation_revokes_the_old_credential_and_replaces_no_machine(
    graphs: dict[str, Graph], deployed: dict[str, Any],
) -> None:
    """Raising adminGeneration: a new key, request and certificate for the exported admin alone, in a
    new group, and the cluster-admins binding moved to that group (so every earlier copy has no
    binding left); no VM's custom data changes, the super-admin stays."""
    before = graphs["local"]
    after = recorded_program("local", local_with(adminGeneration=1), deployed)
    old, new = tls_state(before), tls_state(after)
    changed = sorted(name for name in old if old[name] != new[name])
    assert changed == [f"local-tls-admin{part}" for part in ("", "-csr", "-key")]
    assert after.named("local-tls-admin-key").replacement_trigger == 1
    assert after.named("local-tls-admin-csr").plain()["subject"]["organization"] == "kilonode:cluster-admins:g1"

    def binding(graph: Graph) -> dict[str, Any]:
        return next(r.plain() for r in graph.resources if r.type == "kubernetes:rbac.authorization.k8s.io/v1:"
                    "ClusterRoleBinding" and r.plain()["metadata"]["name"] == "kilonode:cluster-admins")
    assert binding(before)["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                            "name": "kilonode:cluster-admins"}]
    assert binding(after)["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                           "name": "kilonode:cluster-admins:g1"}]
    assert binding(after)["roleRef"] == binding(before)["roleRef"]  # immutable in the API: updated in place
    keys_before, keys_after = restart_keys(before), restart_keys(after)
    assert keys_before == keys_after


def test_a_generation_bump_on_etcd_main_0_renews_its_certificates_and_custom_data_only(
    graphs: dict[str, Graph], deployed: dict[str, Any]
) -> None:
    before = graphs["local"]
    after = recorded_program("local", local_with(certificateGenerations={"etcd-main-0": 1}), deployed)
    old, new = tls_state(before), tls_state(after)
    assert set(old) == set(new)
    changed = sorted(name for name in old if old[name] != new[name])
    assert changed == sorted(f"local-tls-etcd-main-0-{leaf}{part}" for leaf in ("server", "peer")
                             for part in ("", "-csr", "-key"))
    assert {new[name][1] for name in changed} == {1}
    # what the engine's replacement gives: a new key (and so a new request and certificate)
    key = after.named("local-tls-etcd-main-0-server-key")
    assert key.replacement_trigger == 1
    csr = after.named("local-tls-etcd-main-0-server-csr").plain()
    assert csr["privateKeyPem"] == "mock-private-key:local-tls-etcd-main-0-server-key#generation-1"
    # only that member's custom data, so only that VM, changes
    keys_before, keys_after = restart_keys(before), restart_keys(after)
    assert [vm for vm in keys_before if keys_before[vm] != keys_after[vm]] == ["local-etcd-main-0"]
    data = {vm.name: vm.plain()["osProfile"]["customData"] for vm in before.of_type(VM)}
    data_after = {vm.name: vm.plain()["osProfile"]["customData"] for vm in after.of_type(VM)}
    assert [name for name in data if data[name] != data_after[name]] == ["local-etcd-main-0"]


def test_the_next_member_after_the_first_is_one_member_again(deployed: dict[str, Any]) -> None:
    # etcd-main-0 was renewed by the last deployment; this one renews etcd-main-1
    first = recorded_program("local", local_with(certificateGenerations={"etcd-main-0": 1}), deployed)
    second = recorded_program("local", local_with(certificateGenerations={"etcd-main-0": 1, "etcd-main-1": 1}),
                              _unwrap(first.outputs))
    keys_first, keys_second = restart_keys(first), restart_keys(second)
    assert [vm for vm in keys_first if keys_first[vm] != keys_second[vm]] == ["local-etcd-main-1"]


def test_renewing_a_majority_of_an_etcd_cluster_in_one_update_is_refused(deployed: dict[str, Any]) -> None:
    raw = local_with(certificateGenerations={"etcd-events-0": 1, "etcd-events-2": 1})
    with pytest.raises(Exception, match=r"would restart or replace 2 of 3 etcd-events machines at once "
                                        r"\(local-etcd-events-0, local-etcd-events-2\)"):
        run_program("local", raw, None, deployed)


def test_an_apiservers_generation_renews_all_it_holds_and_no_other_apiservers_files(
    graphs: dict[str, Graph],
) -> None:
    # research-7500: five apiservers; renewing apiserver-2 changes apiserver-2 alone, which
    # the guard allows (four still serve)
    before = graphs["research-7500"]
    deployed_7500 = _unwrap(before.outputs)
    raw = copy.deepcopy(_cluster_value("research-7500")) | {"certificateGenerations": {"apiserver-2": 1}}
    after = recorded_program("research-7500", raw, deployed_7500)
    old, new = tls_state(before), tls_state(after)
    changed = {name.removeprefix("research-7500-tls-") for name in old if old[name] != new[name]}
    leaves = {"serving", "etcd-client", "kubelet-client", "kube-scheduler", "kube-controller-manager",
              "kube-scheduler-serving", "kube-controller-manager-serving", "gpu-health-controller",
              "node-client-approver", "front-proxy-client"}
    assert changed == {f"apiserver-2-{leaf}{part}" for leaf in leaves for part in ("", "-csr", "-key")}
    keys_before, keys_after = restart_keys(before), restart_keys(after)
    assert [vm for vm in keys_before if keys_before[vm] != keys_after[vm]] == ["research-7500-apiserver-2"]


def test_with_one_apiserver_its_renewal_needs_the_acknowledgement(deployed: dict[str, Any]) -> None:
    raw = local_with(certificateGenerations={"apiserver-0": 1})
    with pytest.raises(Exception, match=r"1 of 1 apiservers machines"):
        run_program("local", raw, None, deployed)
    acknowledged = local_with(certificateGenerations={"apiserver-0": 1}, acknowledgeRestart=["apiservers"])
    assert recorded_program("local", acknowledged, deployed).count(VM) == 7


def _cluster_value(stack: str) -> Any:
    from kilonode.azure.mockplan import cluster_value
    from kilonode.config import load_stack

    return cluster_value(load_stack(stack))
