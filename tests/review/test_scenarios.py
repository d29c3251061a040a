"""The pull requests issue 26 tried, each as a commit on a temporary cluster repository, reviewed
against its parent with each side's own code: the level an expert gives it, and the story.

Each expectation was written before the rule: a change whose machines and objects disagree
by Kubernetes' version-skew policy, a way in from the Internet, a node image that lacks what
the head preloads, a widened VNet that moves nothing, replacements `pulumi up` cannot make,
a lesson weakened by any key that carries it, etcd data on a replaced member, an unrecorded
subnet, nodes that keep their registration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kilonode.review import Review, review
from kilonode.review.risks import HIGH, MEDIUM
from tests.review.conftest import change, edit_stack, replace_text

pytestmark = pytest.mark.slow  # each review renders and records its stack at two refs, in child processes


def reviewed(repo: Path, branch: str, stack: str = "local") -> Review:
    return review(repo, "main", branch, stacks=[stack])


def risk(result: Review, rule: str) -> list:  # type: ignore[type-arg]
    return [r for r in result.risks if r.rule == rule]


def test_next_kubernetes_minor_without_new_images_is_skew(repo: Path) -> None:
    branch = change(repo, "k8s-minor", edit_stack("local", lambda c: c.update({"kubernetesVersion": "1.35.4"})),
                    "Kubernetes 1.35")
    result = reviewed(repo, branch)
    [skew] = risk(result, "version-skew")
    assert skew.level == HIGH
    # kube-proxy and the cloud controller move to 1.35 while the apiserver VMs keep their image's 1.34
    assert "kube-proxy 1.35 is newer than kube-apiserver 1.34" in skew.summary
    assert "cloud-controller-manager 1.35" in skew.summary
    assert "controlPlaneImageVersion 1.0.0 (unchanged)" in skew.summary
    [image] = [r for r in risk(result, "image-not-rebuilt") if "kubelet 1.35.4" in r.summary]
    assert image.level == HIGH and "the image has 1.34.2" in image.summary
    assert result.risks[0].level == HIGH


def test_ssh_from_the_world_on_every_subnet_is_one_high_line(repo: Path) -> None:
    # a code change: every NSG's SSH rule admits 0.0.0.0/0 (an inserted rule where no adminCidr was set)
    branch = change(repo, "ssh-world", replace_text(
        "infra/kilonode/azure/network.py",
        "admin = [str(net.admin_cidr)] if net.admin_cidr else []", 'admin = ["0.0.0.0/0"]'), "open ssh")
    result = reviewed(repo, branch)
    [world] = risk(result, "world-open")
    assert world.level == HIGH
    assert "allow-ssh-from-admin" in world.summary and "port 22" in world.summary and "0.0.0.0/0" in world.summary
    assert len(world.subjects) == 3  # control-plane, etcd and the pools' NSGs, one decision
    # compared by identity: the inserted rule is new, the deny-all after it is unchanged
    [diff] = result.changed
    nsg_inputs = [i.path for c in diff.resources if c.type.endswith("NetworkSecurityGroup") for i in c.inputs]
    assert nsg_inputs and all("allow-ssh-from-admin" in p for p in nsg_inputs), nsg_inputs


def test_a_new_pause_image_the_node_image_lacks_stops_every_new_kubelet(repo: Path) -> None:
    branch = change(repo, "pause", edit_stack("local", lambda c: c.update(
        # by digest: a changed pause image by tag alone is refused (kilonode.config.checks._image_sources)
        {"pauseImage": "registry.k8s.io/pause:3.10.1@sha256:" + "0" * 64})), "new pause image")
    result = reviewed(repo, branch)
    [image] = [r for r in risk(result, "image-not-rebuilt") if "pause:3.10.1" in r.summary]
    assert image.level == HIGH
    assert "kilonode-preload-images.service fails" in image.summary and "no new or upgraded node" in image.summary
    assert "Bump nodeImageVersion" in image.summary


def test_widening_the_vnet_that_keeps_every_address_is_medium(repo: Path) -> None:
    branch = change(repo, "vnet", edit_stack("local", lambda c: c.setdefault("network", {}).update(
        {"vnetCidr": "10.0.0.0/15"})), "wider vnet")
    result = reviewed(repo, branch)
    assert not risk(result, "address-moved"), result.risks
    [wide] = risk(result, "vnet-widened")
    assert wide.level == MEDIUM and "10.0.0.0/16" in wide.summary and "10.0.0.0/15" in wide.summary


def test_a_location_change_replaces_the_group_that_holds_the_cluster(repo: Path) -> None:
    branch = change(repo, "location", edit_stack("local", lambda c: c.update({"location": "eastus"})), "move")
    result = reviewed(repo, branch)
    groups = [r for r in risk(result, "container-replaced") if "resource group" in r.summary]
    assert groups and groups[0].level == HIGH and "`pulumi up` stops" in groups[0].summary


def test_control_plane_custom_data_replaces_fixed_names_and_pulumi_stops(repo: Path) -> None:
    # the etcd members' custom data changes (a new snapshot count): replaceOnChanges on fixed names
    branch = change(repo, "etcd-flag", edit_stack("local", lambda c: c["etcd"]["main"].update(
        {"snapshotCount": 20000})), "etcd snapshot count")
    result = reviewed(repo, branch)
    stops = risk(result, "replace-stops")
    assert stops and all(r.level == HIGH for r in stops)
    assert any("`pulumi up` stops at etcd-main-0" in r.summary for r in stops), stops
    assert not risk(result, "etcd-quorum"), "pulumi up stops before any member goes down"


def test_turning_the_audit_log_off_is_named(repo: Path) -> None:
    # the stack refuses an empty auditLog.path now (validate); a code change can still send the log
    # to stdout ('-': kube-apiserver's "log to standard out"), which nobody keeps
    branch = change(repo, "audit", replace_text("infra/kilonode/render/control_plane.py",
                                                '("audit-log-path", audit.path)', '("audit-log-path", "-")'),
                    "audit log to stdout")
    result = reviewed(repo, branch)
    [audit] = risk(result, "audit-log-off")
    assert audit.level == HIGH and "apiserver-0" in audit.summary


def test_one_parallel_pull_is_serialised_pulls(repo: Path) -> None:
    branch = change(repo, "pulls", edit_stack("local", lambda c: c["nodePools"][0].update(
        {"maxParallelImagePulls": 1})), "one pull at a time")
    result = reviewed(repo, branch)
    [pulls] = risk(result, "image-pulls-serialized")
    assert pulls.level == MEDIUM and "maxParallelImagePulls: 1" in pulls.summary


def test_resizing_every_etcd_member_loses_their_data(repo: Path) -> None:
    branch = change(repo, "etcd-resize", edit_stack("local", lambda c: c["etcd"]["main"].update(
        {"vmSize": "Standard_D8ds_v5"})), "bigger etcd")
    result = reviewed(repo, branch)
    [data] = risk(result, "etcd-data-lost")
    assert data.level == HIGH and "3 of 3 etcd-main" in data.summary and "restored from" in data.summary
    assert risk(result, "etcd-quorum")


def test_a_new_pool_without_a_recorded_subnet_says_to_allocate(repo: Path) -> None:
    def add_pool(cluster: dict) -> None:  # type: ignore[type-arg]
        pool = dict(cluster["nodePools"][0])
        pool.pop("subnet", None)
        pool["name"] = "cpu2"
        cluster["nodePools"].append(pool)

    branch = change(repo, "new-pool", edit_stack("local", add_pool), "a second pool")
    result = reviewed(repo, branch)
    [unrecorded] = risk(result, "subnet-unrecorded")
    assert unrecorded.level == MEDIUM and "kilonode allocate local" in unrecorded.summary


def test_shrinking_a_team_leaves_its_old_nodes_tainted(repo: Path) -> None:
    def shrink(cluster: dict) -> None:  # type: ignore[type-arg]
        [team] = [t for t in cluster["teams"] if t["name"] == "vision"]
        team["nodes"] = 500

    branch = change(repo, "team", edit_stack("research-7500", shrink), "vision gives back 500 nodes")
    result = reviewed(repo, branch, "research-7500")
    # the node-identity policy moves with the same `pulumi up` and then denies the old nodes' own
    # writes (the second independent trace of issue 38, finding 3): high, and relabel at once
    [denied] = risk(result, "node-identity-denied")
    assert denied.level == HIGH and "team vision -> (shared)" in denied.summary
    assert len(denied.subjects) == 5 and "a reimage does not do it" in denied.summary
    assert "kubectl label node <name> kilonode.io/team-" in denied.summary
    assert "kubectl taint node <name> kilonode.io/team-" in denied.summary
    assert not risk(result, "labels-until-reimaged")  # said once, as the decision it is


def test_lowering_one_sysctl_is_one_line_with_its_hosts(repo: Path) -> None:
    # the three neighbour-table thresholds lowered together (validate requires them to rise): one decision
    low = {"net.ipv4.neigh.default.gc_thresh1": 1024, "net.ipv4.neigh.default.gc_thresh2": 2048,
           "net.ipv4.neigh.default.gc_thresh3": 4096}
    branch = change(repo, "sysctl-low", edit_stack("local", lambda c: c.setdefault("sysctl", {}).setdefault(
        "overrides", {}).update(low)), "lower the neighbour table")
    result = reviewed(repo, branch)
    [weaker] = risk(result, "sysctl-weaker")
    assert weaker.level == MEDIUM
    assert all(f"{key} = {value}" in weaker.summary for key, value in low.items()), weaker.summary
