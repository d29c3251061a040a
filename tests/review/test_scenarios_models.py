"""Pull requests whose consequence lives between components (issue 38), each as a commit on a
temporary cluster repository reviewed against its parent with each side's own code, as
tests/review/test_scenarios.py's: a DaemonSet stranded off nodes where it runs, an alert rule
Prometheus refuses, the node image's pins (driver, Fabric Manager), a pool's VM size, an NSG rule
moved above others, advice per resource kind, an image version that deletes its predecessor,
and a report that reads as the answer.

Each expectation was written from what `pulumi up` and the components do (the rule modules'
docstrings cite the sources), before the rule.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from kilonode.k8s import exporters as k8s_exporters
from kilonode.k8s import gpu as k8s_gpu
from kilonode.k8s import rdma as k8s_rdma
from kilonode.preflight.model import NOW_ENV
from kilonode.review import Review, alerting, review
from kilonode.review.decisions import decisions
from kilonode.review.report import to_text
from kilonode.review.risks import HIGH
from tests.monitoring.promtool import promtool_path
from tests.review.conftest import change, edit_stack, replace_text

pytestmark = pytest.mark.slow  # each review renders and records its stack at two refs, in child processes

TEAM_TOLERATION = ('        {"key": wellknown.TEAM_LABEL, "operator": "Exists", '
                   '"effect": wellknown.TEAM_TAINT_EFFECT},\n')


def reviewed(repo: Path, branch: str, stack: str = "local") -> Review:
    return review(repo, "main", branch, stacks=[stack])


def risk(result: Review, rule: str) -> list:  # type: ignore[type-arg]
    return [r for r in result.risks if r.rule == rule]


def test_dropping_the_team_toleration_strands_the_gpu_and_rdma_plugins_on_4000_nodes_in_one_line(repo: Path) -> None:
    # the RDMA plugin shares the device plugin's toleration list: one edit, one decision, one line
    branch = change(repo, "plugin-team", replace_text("infra/kilonode/k8s/gpu.py", TEAM_TOLERATION, ""),
                    "the device plugin no longer tolerates team taints")
    result = reviewed(repo, branch, "research-7500")
    [stranded] = risk(result, "daemonset-stranded")
    assert stranded.level == HIGH and result.risks[0] == stranded
    # dcgm-exporter shares the device plugin's tolerations too (kilonode.k8s.exporters)
    assert (f"DaemonSet {k8s_gpu.DAEMONSET_NAME} and {k8s_rdma.NAME} and {k8s_exporters.DCGM_EXPORTER} can no "
            "longer run on 4,000 nodes" in stranded.summary)
    assert "team-language (3,000 nodes" in stranded.summary and "offers no nvidia.com/gpu" in stranded.summary


def test_a_taint_on_the_h100_pool_strands_the_gpu_and_rdma_plugins(repo: Path) -> None:
    def taint(cluster: dict) -> None:  # type: ignore[type-arg]
        [pool] = [p for p in cluster["nodePools"] if p["name"] == "h100-ib"]
        pool["taints"] = ["dedicated=training:NoSchedule"]

    branch = change(repo, "h100-taint", edit_stack("research-7500", taint), "reserve the H100s for training")
    result = reviewed(repo, branch, "research-7500")
    [stranded] = risk(result, "daemonset-stranded")
    assert stranded.level == HIGH
    assert stranded.summary.startswith("pool-h100-ib: taint dedicated=training:NoSchedule added")
    assert k8s_gpu.DAEMONSET_NAME in stranded.summary and k8s_rdma.NAME in stranded.summary
    assert "2,500 nodes" in stranded.summary and "registers from now on" in stranded.summary


def test_an_alert_rule_prometheus_cannot_parse_is_high(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv(alerting.PROMTOOL_ENV, str(promtool_path()))
    except RuntimeError as error:  # `make test` unpacks it first: never a skip
        pytest.fail(str(error))
    # the apiserver request selector loses its closing brace: every rule built on it is unparseable
    branch = change(repo, "rule-brace", replace_text("infra/kilonode/render/monitoring.py",
                                                     'verb!~"WATCH|CONNECT"}}\'', 'verb!~"WATCH|CONNECT"\''),
                    "tidy the apiserver selector")
    result = reviewed(repo, branch)
    [rejected] = risk(result, "alert-rules-rejected")
    assert rejected.level == HIGH and result.risks[0] == rejected
    assert "kilonode-rules.yaml" in rejected.summary and "at its next start it exits" in rejected.summary


def test_a_driver_bump_that_leaves_fabric_manager_behind_is_high_and_shown_as_an_image_change(repo: Path) -> None:
    def bump_driver(root: Path) -> None:  # every driver package of the GPU list, not Fabric Manager or NSCQ
        path = root / "node-image" / "packages" / "gpu.txt"
        path.write_text(path.read_text().replace("=535.261.03-1", "=550.163.01-1"))

    branch = change(repo, "driver-550", bump_driver, "driver 550")
    result = reviewed(repo, branch, "research-7500")
    [diff] = result.changed
    assert not diff.resources and not diff.files, "nothing rendered moves: the change is in the image alone"
    [mismatch] = risk(result, "gpu-driver-mismatch")
    assert mismatch.level == HIGH and result.risks[0] == mismatch
    assert "nvidia-fabricmanager-535 535.261.03-1 is not the driver's release 550.163.01" in mismatch.summary
    assert "pool-h100-ib (2,500 nodes" in mismatch.summary and "cudaErrorSystemNotReady" in mismatch.summary
    [unreleased] = risk(result, "image-recipe-unreleased")
    assert "nodeImageVersion stays 1.0.0" in unreleased.summary
    assert "nvidia-open-kernel-dkms 535.261.03-1 -> 550.163.01-1" in to_text(result)


def test_the_deny_all_moved_to_the_top_shadows_the_etcd_peer_rule(repo: Path) -> None:
    branch = change(repo, "deny-first", replace_text("infra/kilonode/azure/network.py", "DENY_ALL_PRIORITY = 4096",
                                                      "DENY_ALL_PRIORITY = 102"), "deny first")
    result = reviewed(repo, branch)
    [shadowed] = risk(result, "nsg-shadowed")
    assert shadowed.level == HIGH and "rule deny-all-inbound now comes before" in shadowed.summary
    assert "allow-etcd-peer-from-etcd" in shadowed.summary and "TCP 2380 from etcd-events-0" in shadowed.summary


def test_a_new_vm_size_for_a_pool_is_a_fleet_replacement(repo: Path) -> None:
    branch = change(repo, "pool-size", edit_stack("local", lambda c: c["nodePools"][0].update(
        {"vmSize": "Standard_D8ds_v5"})), "bigger pool VMs")
    result = reviewed(repo, branch)
    [resized] = risk(result, "pool-resized")
    assert "every scale set of pool-cpu (1) gets a new VM size Standard_D4ds_v5 -> Standard_D8ds_v5: 2 nodes" \
        in resized.summary
    assert "local NVMe" in resized.summary and "pool replacement" in resized.summary
    assert not risk(result, "fleet-rollout"), "one line for the pool"


def test_a_node_image_version_bump_deletes_the_rollback_target(repo: Path) -> None:
    branch = change(repo, "image-101", edit_stack("local", lambda c: c["nodeImage"].update({"version": "1.0.1"})),
                    "node image 1.0.1")
    result = reviewed(repo, branch)
    [gone] = risk(result, "rollback-target-removed")
    assert gone.level == HIGH and "deletes the previous image version(s) (1.0.0 of cpu)" in gone.summary
    [rollout] = risk(result, "fleet-rollout")
    assert "image 1.0.0 -> 1.0.1 (contents unchanged: a new version of the same recipe" in rollout.summary
    # one decision, one line: the deletion leads, the rollout it comes with is named after it
    [decision] = [d for d in decisions(result.risks) if d.lead.rule == "rollback-target-removed"]
    assert rollout in decision.others and "one change, image version 1.0.0 -> 1.0.1" in decision.line()



def test_a_location_change_is_one_line_of_the_answer_led_by_the_resource_group(repo: Path) -> None:
    result = reviewed(repo, change(repo, "location-answer", edit_stack("local", lambda c: c.update(
        {"location": "eastus"})), "move"))
    [decision] = decisions(result.risks)
    assert decision.lead.rule == "container-replaced" and "resource group" in decision.lead.summary
    assert len(decision.others) >= 8 and {r.rule for r in decision.others} >= {"update-refused", "replace-stops"}
    text = to_text(result)
    answer = text.split("Answer (one line per decision, highest impact first):\n", 1)[1].split("\n\n", 1)[0]
    assert answer.count("\n  - ") == 0 and "one change, location" in answer, answer
    assert "Not judged: what the workloads themselves do" in text


# --- the independent trace's pull requests on research-7500 (fast forms: tests/review/test_review_trace.py) --------


def test_two_fewer_etcd_members_say_member_remove_first_and_the_guard(repo: Path) -> None:
    branch = change(repo, "etcd-5-3", edit_stack("research-7500", lambda c: c["etcd"]["main"].update(
        {"members": 3})), "three main etcd members")
    result = reviewed(repo, branch, "research-7500")
    [removed] = risk(result, "etcd-members-removed")
    assert removed.level == HIGH and "`etcdctl member remove <ID>`" in removed.summary
    assert "run a 5-member cluster whose quorum is 3: it can lose none" in removed.summary
    # the 3 that stay are replaced too (their custom data names the new cluster): the guard is said there
    stops = [r for r in risk(result, "replace-stops") if "etcd-main-0" in r.summary]
    assert stops and "`acknowledgeRestart: [etcd-main]`" in stops[0].summary
    [data] = risk(result, "etcd-data-lost")
    assert "`pulumi up` stops before that" in data.summary and "only if forced past both" in data.summary


def test_a_new_service_cidr_on_research_7500_is_cluster_dns_gone(repo: Path) -> None:
    branch = change(repo, "service-cidr", edit_stack("research-7500", lambda c: c.setdefault("network", {}).update(
        {"serviceCidr": "10.97.0.0/16"})), "new service range")
    result = reviewed(repo, branch, "research-7500")
    [moved] = risk(result, "service-cidr-moved")
    assert moved.level == HIGH and "cluster DNS is gone" in moved.summary and "10.97.0.10" in moved.summary
    assert risk(result, "service-replaced")


def test_a_join_token_rotation_on_research_7500_is_no_fleet_rollout(repo: Path) -> None:
    def rotate(cluster: dict) -> None:  # type: ignore[type-arg]
        # docs/azure.md "Node join credentials": current -> previous, the next generation current
        # within a year of the tests' clock (tests/conftest.py: validate refuses longer) and after
        # the previous generation's expiry
        expires = (datetime.fromisoformat(os.environ[NOW_ENV]) + timedelta(days=365)).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster["joinTokens"] = {"current": {"generation": 3, "expires": expires},
                                 "previous": cluster["joinTokens"]["current"]}

    result = reviewed(repo, change(repo, "rotate", edit_stack("research-7500", rotate), "rotate"), "research-7500")
    assert not risk(result, "fleet-rollout"), result.risks
    [rotated] = risk(result, "join-token-rotated")
    assert "nothing needs rolling" in rotated.summary
    assert "The generation 1 token Secrets are deleted" in rotated.summary


def test_coredns_tag_moved_under_its_digest_is_high(repo: Path) -> None:
    branch = change(repo, "coredns-tag", replace_text("infra/kilonode/catalog/components.yaml",
                                                       "version: v1.12.1\n", "version: v1.12.2\n"), "coredns 1.12.2")
    result = reviewed(repo, branch, "research-7500")
    [same] = risk(result, "image-tag-same-digest")
    assert same.level == HIGH and "tag v1.12.1 -> v1.12.2 under the same digest" in same.summary
