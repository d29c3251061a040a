"""The misjudgements an independent trace of `kilonode diff` found on research-7500 (15 realistic
pull requests), each on research-7500's recorded snapshot changed by hand as the pull request
changes it: the restart guard in the replacement advice, etcd's data past the stops, a shrinking
etcd cluster, what a reimage keeps, a moved serviceCidr and replaced Services, Prometheus's
restarts, a tag under an unchanged digest, a join-token rotation, a taint on a GPU pool."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml

from kilonode.paths import REPO_ROOT
from kilonode.review import incluster, lifecycle
from kilonode.review.compare import compare_stack
from kilonode.review.decisions import decisions
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import pod_spec, snapshot, workload

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
VMSS = "azure-native:compute:VirtualMachineScaleSet"
SECRET = "kubernetes:core/v1:Secret"


def risks(head: dict[str, Any]) -> list[Risk]:
    return assess(compare_stack(STACK, snapshot(STACK), head), {})


def rule(found: list[Risk], name: str) -> list[Risk]:
    return [r for r in found if r.rule == name]


def _resource(entry: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [r for r in entry["resources"] if r["name"] == f"{STACK}-{name}"]
    return found


def _plan(entry: dict[str, Any]) -> dict[str, Any]:
    plan: dict[str, Any] = yaml.safe_load(entry["files"]["plan.yaml"])
    return plan


def _set_plan(entry: dict[str, Any], plan: dict[str, Any]) -> None:
    entry["files"]["plan.yaml"] = yaml.safe_dump(plan)


def _new_custom_data(entry: dict[str, Any], *members: str) -> dict[str, Any]:
    for member in members:
        _resource(entry, member)["inputs"]["osProfile"]["customData"] = "[secret sha256:0000]"
    return entry


# --- 1. the restart guard in the advice of a replacement `pulumi up` stops at -------------------------------------


def test_replacing_a_majority_of_etcd_members_says_to_acknowledge_the_restart_first() -> None:
    found = risks(_new_custom_data(snapshot(STACK), "etcd-main-0", "etcd-main-1", "etcd-main-2"))
    [stop] = [r for r in rule(found, "replace-stops") if "etcd-main-0" in r.summary]
    # the guard checks every control-plane machine, so each targeted run is refused too
    assert "First add `acknowledgeRestart: [etcd-main]`" in stop.summary
    assert "3 of the 5 etcd-main machines the head has changed, it refuses each `pulumi up --target`" in stop.summary
    assert stop.summary.index("acknowledgeRestart") < stop.summary.index("pulumi state unprotect")
    # docs/azure.md "Rolling the control plane": a full run records the keys, then the acknowledgement goes
    assert "one full `pulumi up` (it records the new restart keys), then remove acknowledgeRestart" in stop.summary
    assert not rule(found, "etcd-quorum"), "pulumi up stops first: the guard is said by replace-stops"


def test_replacing_one_etcd_member_needs_no_acknowledgement_but_still_the_full_run() -> None:
    [stop] = rule(risks(_new_custom_data(snapshot(STACK), "etcd-main-0")), "replace-stops")
    assert "acknowledgeRestart" not in stop.summary
    assert "one full `pulumi up`: only a full run records the new restart keys" in stop.summary


def test_replacing_every_apiserver_is_no_stop_any_more_but_still_every_apiserver() -> None:
    # the apiserver VMs are delete-before-replace: `pulumi up --target` replaces one, nothing stops at its name
    head = _new_custom_data(snapshot(STACK), *(f"apiserver-{i}" for i in range(5)))
    found = risks(head)
    assert not rule(found, "replace-stops")
    [every] = rule(found, "apiservers-all")
    assert every.summary.startswith("5 of 5 apiservers restart or are replaced")


def test_replacing_every_apiserver_of_a_stack_deployed_before_says_to_acknowledge_and_never_destroy() -> None:
    # a base recorded before delete-before-replace
    base = snapshot(STACK)
    for i in range(5):
        _resource(base, f"apiserver-{i}")["deleteBeforeReplace"] = False
    head = _new_custom_data(snapshot(STACK), *(f"apiserver-{i}" for i in range(5)))
    # Pulumi replaces with the head program's options: its delete-before-replace, so no stop at the name
    found = assess(compare_stack(STACK, base, head), {})
    assert rule(found, "replace-stops") == []
    [every] = rule(found, "apiservers-all")
    assert "acknowledgeRestart lists apiservers" in every.summary and "5 of 5 apiservers" in every.summary
    # the guard cannot hold the acknowledged roll to one machine per run: said where it is advised
    assert "cannot tell a targeted run from a plain one" in every.summary
    assert "`pulumi up --target <one machine's VM urn>` per run" in every.summary
    assert "pulumi destroy" not in every.summary


# --- 2. etcd's data: what happens past the stops, not what `pulumi up` does ----------------------------------------


def test_every_etcd_member_replaced_is_a_restore_only_past_the_guard_and_protect() -> None:
    [data] = rule(risks(_new_custom_data(snapshot(STACK), *(f"etcd-main-{i}" for i in range(5)))), "etcd-data-lost")
    assert data.level == HIGH
    assert "`pulumi up` stops before that, at the restart guard" in data.summary
    assert "at the members' protect" in data.summary and "only if forced past both" in data.summary
    assert "the cluster must be restored" not in data.summary and "would have to be restored" in data.summary


# --- 3. a shrinking etcd cluster ------------------------------------------------------------------------------------


def _shrunk(entry: dict[str, Any], *gone: str) -> dict[str, Any]:
    entry["resources"] = [r for r in entry["resources"] if r["name"] not in {f"{STACK}-{g}" for g in gone}]
    return entry


def test_fewer_etcd_members_says_to_remove_them_from_etcd_first_and_counts_their_protected_deletes_as_stops() -> None:
    found = risks(_shrunk(snapshot(STACK), "etcd-main-3", "etcd-main-4"))
    [removed] = rule(found, "etcd-members-removed")
    assert removed.level == HIGH and removed.subjects == (f"{STACK}-etcd-main-3", f"{STACK}-etcd-main-4")
    assert "etcd-main shrinks from 5 to 3 members" in removed.summary
    assert "`etcdctl member remove <ID>`" in removed.summary and "one member at a time" in removed.summary
    assert "run a 5-member cluster whose quorum is 3: it can lose none" in removed.summary
    assert "docs/runbooks/etcd-member-lost-its-disk.md" in removed.summary
    assert "Pulumi never deletes a protected resource" in removed.summary
    # the deletes stop `pulumi up`: no member goes down, so neither quorum line
    assert not rule(found, "etcd-restarted") and not rule(found, "etcd-quorum")
    assert not rule(found, "etcd-data-lost"), "the removed members' data is meant to go"


def test_an_etcd_cluster_left_below_its_old_quorum_stops_every_write() -> None:
    [removed] = rule(risks(_shrunk(snapshot(STACK), "etcd-main-2", "etcd-main-3", "etcd-main-4")),
                     "etcd-members-removed")
    assert "the remaining 2 are fewer than the 5-member cluster's quorum of 3: every write stops" in removed.summary


# --- 4. a reimage keeps the instance's own model ---------------------------------------------------------------------


def test_a_fleet_rollout_says_an_upgrade_applies_the_model_and_a_reimage_does_not() -> None:
    head = snapshot(STACK)
    for r in head["resources"]:
        if r["type"] == VMSS and "h100-ib" in r["name"]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:0000]"
    [rollout] = rule(risks(head), "fleet-rollout")
    assert "upgraded or reimaged" not in rollout.summary
    assert "`az vmss update-instances`" in rollout.summary
    # custom data needs the upgrade and then a reimage (cloud-init reads it at first boot only):
    # tests/review/test_review_trace4.py
    assert "then reimage it (`az vmss reimage --instance-ids`)" in rollout.summary


def test_the_scale_set_effects_say_a_reimage_keeps_the_instance_model() -> None:
    assert REPO_ROOT is not None
    rows = tomllib.loads((REPO_ROOT / "infra/kilonode/catalog/effects.toml").read_text())["effect"]
    by_path = {r["path"]: r["why"] for r in rows if r["type"] == VMSS}
    for path in ("virtualMachineProfile", "virtualMachineProfile.osProfile.customData",
                 "virtualMachineProfile.osProfile.linuxConfiguration",
                 "virtualMachineProfile.storageProfile.imageReference"):
        assert "update-instances" in by_path[path], path
        assert "until reimaged" not in by_path[path] and "new or reimaged" not in by_path[path], path
        assert "upgraded or reimaged" not in by_path[path] and "reimaged/upgraded" not in by_path[path], path


# --- 5. a moved serviceCidr, and any replaced Service --------------------------------------------------------------


def _moved_service_cidr() -> dict[str, Any]:
    head = snapshot(STACK)
    plan = _plan(head)
    plan["controlPlane"].update({"serviceCidr": "10.97.0.0/16", "kubernetesServiceIp": "10.97.0.1",
                                 "clusterDnsIp": "10.97.0.10"})
    _set_plan(head, plan)
    _resource(head, "k8s-dns-service")["inputs"]["spec"]["clusterIP"] = "10.97.0.10"
    return head


def test_a_moved_service_cidr_on_a_running_cluster_is_high_and_says_dns_is_gone() -> None:
    found = risks(_moved_service_cidr())
    [moved] = rule(found, "service-cidr-moved")
    assert moved.level == HIGH and "cluster DNS is gone" in moved.summary
    assert "172.16.0.0/16 -> 10.97.0.0/16" in moved.summary
    assert "deletes a fixed-name object before creating it again" in moved.summary
    assert "outside the default ServiceCIDR `kubernetes`" in moved.summary
    assert "keeps clusterDNS 172.16.0.10 until its instance is upgraded" in moved.summary
    [replaced] = rule(found, "service-replaced")
    assert replaced.level == MEDIUM and "kube-system/kube-dns (ClusterIP 172.16.0.10 -> 10.97.0.10)" in replaced.summary
    # one decision: the report leads with the moved range
    [decision] = [d for d in decisions(found) if d.lead.rule == "service-cidr-moved"]
    assert [r.rule for r in decision.others] == ["service-replaced"]


def test_any_replaced_service_is_a_delete_then_a_create_with_a_new_cluster_ip() -> None:
    head = snapshot(STACK)
    _resource(head, "k8s-dns-service")["inputs"]["spec"]["clusterIP"] = "172.16.0.53"
    found = risks(head)
    assert not rule(found, "service-cidr-moved")
    [replaced] = rule(found, "service-replaced")
    assert "absent from the delete on, and stays absent if the create fails" in replaced.summary
    assert "ClusterIP changes" in replaced.summary


# --- 6. Prometheus restarts ----------------------------------------------------------------------------------------


def test_a_prometheus_pod_template_change_loses_alerting_for_a_while_and_keeps_its_history() -> None:
    head = snapshot(STACK)
    [container] = pod_spec(head, "StatefulSet", "prometheus")["containers"]
    container["args"] = [a.replace("retention.time=15d", "retention.time=14d") for a in container["args"]]
    container["resources"]["limits"]["memory"] = container["resources"]["requests"]["memory"] = "50Gi"
    [restart] = rule(risks(head), "prometheus-restarted")
    assert restart.level == MEDIUM and "its history stays on its claim data-prometheus-0" in restart.summary
    assert "no alert fires" in restart.summary and "its sizing only" in restart.summary
    assert "history is gone" not in restart.summary


def test_the_monitoring_node_resized_restarts_prometheus() -> None:
    head = snapshot(STACK)
    _resource(head, "monitoring-000")["inputs"]["sku"]["name"] = "Standard_E32ds_v5"
    [restart] = rule(risks(head), "prometheus-restarted")
    assert f"its node's scale set {STACK}-monitoring-000 is resized" in restart.summary


def test_an_unchanged_stack_restarts_no_prometheus_and_replaces_no_service() -> None:
    found = incluster.assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK)))
    assert found == []


# --- 7. a tag that moves under an unchanged digest -----------------------------------------------------------------


def test_a_new_tag_under_the_same_digest_is_high() -> None:
    head = snapshot(STACK)
    [container] = pod_spec(head, "Deployment", "coredns")["containers"]
    container["image"] = container["image"].replace(":v1.12.1@", ":v1.12.2@")
    [same] = rule(risks(head), "image-tag-same-digest")
    assert same.level == HIGH and same.subjects == ("Deployment coredns",)
    assert "tag v1.12.1 -> v1.12.2 under the same digest" in same.summary
    assert "the pods run the v1.12.1 image" in same.summary


def test_a_new_tag_with_its_own_digest_is_not_flagged() -> None:
    head = snapshot(STACK)
    [container] = pod_spec(head, "Deployment", "coredns")["containers"]
    repo, _, _ = incluster.split_reference(container["image"])
    container["image"] = f"{repo}:v1.12.2@sha256:{'1' * 64}"
    assert not rule(risks(head), "image-tag-same-digest")
    assert workload(head, "Deployment", "coredns")


# --- 8. a join-token rotation ---------------------------------------------------------------------------------------


def _rotated() -> dict[str, Any]:
    """docs/azure.md "Node join credentials": current 2 -> previous, 3 the new current, 1 dropped."""
    head = snapshot(STACK)
    plan = _plan(head)
    tokens = [t for t in plan["joinTokens"] if t["generation"] == 2]
    plan["joinTokens"] = [{**t, "generation": 3, "current": True} for t in tokens] + [
        {**t, "current": False} for t in tokens]
    _set_plan(head, plan)
    for r in head["resources"]:
        if r["type"] == VMSS:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:0000]"
    head["resources"] = [r for r in head["resources"] if not (r["type"] == SECRET and r["name"].endswith("-g1"))]
    return head


def test_a_join_token_rotation_rolls_nothing_and_says_what_the_retired_token_strands() -> None:
    found = risks(_rotated())
    assert not rule(found, "fleet-rollout"), "only the join token changes in the custom data: nothing to roll"
    [rotated] = rule(found, "join-token-rotated")
    assert rotated.level == MEDIUM and "generations 1, 2 -> 2, 3" in rotated.summary
    assert "new VMs join with the new token" in rotated.summary and "nothing needs rolling" in rotated.summary
    # a token per registration group: the pools' shared shards and each team's (6 at research-7500)
    retired = len([t for t in _plan(snapshot(STACK))["joinTokens"] if t["generation"] == 1])
    assert retired == 6 and f"The generation 1 token Secrets are deleted ({retired})" in rotated.summary
    assert "cannot join again after a reimage, which keeps the instance's own model" in rotated.summary
    assert len(rotated.subjects) == retired and all(s.endswith("-g1") for s in rotated.subjects)


def test_a_rotation_beside_a_rendered_change_still_rolls_that_pool() -> None:
    head = _rotated()
    key = "pool-h100-ib/etc/nccl.conf"
    head["files"][key] += "\n# changed\n"
    rollouts = rule(risks(head), "fleet-rollout")
    assert [r for r in rollouts if "of pool-h100-ib" in r.summary], rollouts
    assert not [r for r in rollouts if "of pool-a100-ib" in r.summary]


# --- a taint on a GPU pool ------------------------------------------------------------------------------------------


def _tainted(pool: str) -> dict[str, Any]:
    head = snapshot(STACK)
    plan = _plan(head)
    [entry] = [p for p in plan["nodePools"] if p["name"] == pool]
    entry["taints"] = [*entry["taints"], "dedicated=training:NoSchedule"]
    _set_plan(head, plan)
    return head


def test_a_taint_added_to_a_gpu_pool_says_user_gpu_pods_need_a_toleration_by_hand() -> None:
    [labels] = [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), _tainted("h100-ib")))
                if f.rule == "labels-until-reimaged"]
    assert "On this GPU pool the new taint dedicated=training:NoSchedule keeps every user GPU pod" in labels.summary
    assert "ExtendedResourceToleration" in labels.summary


def test_a_taint_on_a_pool_without_gpus_says_nothing_of_gpu_pods() -> None:
    [labels] = [f for f in lifecycle.assess(compare_stack(STACK, snapshot(STACK), _tainted("system")))
                if f.rule == "labels-until-reimaged"]
    assert "GPU pod" not in labels.summary
