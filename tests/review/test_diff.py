"""`kilonode diff` on a temporary git repository made by the test: the toolkit and the shipped
stacks as one commit, then one commit per change a reviewer meets, each reviewed against its
parent with that side's own code (a worktree per ref), as a pull request would be.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kilonode.review import Review, review
from kilonode.review.compare import CREATE, DELETE, REPLACE, UPDATE
from kilonode.review.report import COMMENT_LIMIT, MARKER, to_markdown, to_text
from kilonode.review.risks import HIGH, MEDIUM
from tests.review.conftest import change, edit_stack, git, replace_text

pytestmark = pytest.mark.slow  # each review renders and records its stacks twice, in child processes


def reviewed(repo: Path, branch: str, **kwargs: object) -> Review:
    return review(repo, "main", branch, **kwargs)  # type: ignore[arg-type]


def rules_of(result: Review, level: str | None = None) -> set[str]:
    return {r.rule for r in result.risks if level is None or r.level == level}


def test_raising_a_sysctl_shows_the_line_on_every_pool_host_and_a_fleet_rollout(repo: Path) -> None:
    branch = change(repo, "sysctl", edit_stack("local", lambda c: c.setdefault("sysctl", {}).setdefault(
        "overrides", {}).update({"net.ipv4.neigh.default.gc_thresh3": 120000})), "raise gc_thresh3")
    result = reviewed(repo, branch)
    assert result.stacks == ["local"] and "stack files changed" in result.why
    [diff] = result.changed
    files = {f.path: f for f in diff.files}
    conf = files["pool-cpu/etc/sysctl.d/90-kilonode.conf"]
    assert "-net.ipv4.neigh.default.gc_thresh3 = 100000" in conf.diff
    assert "+net.ipv4.neigh.default.gc_thresh3 = 120000" in conf.diff
    assert "pool-cpu/user-data" in files  # the custom data, decoded: the same line inside cloud-init
    [scale_set] = [c for c in diff.resources if c.type.endswith("VirtualMachineScaleSet")]
    assert scale_set.action == UPDATE and "rollout" in scale_set.kinds
    assert any(i.path == "virtualMachineProfile.osProfile.customData" for i in scale_set.inputs)
    assert not any(c.type.endswith(":VirtualMachine") for c in diff.resources), "no control-plane machine moves"
    assert rules_of(result) == {"fleet-rollout"} and result.level() == MEDIUM


def test_a_new_etcd_vm_size_for_all_five_members_is_a_quorum_risk(repo: Path) -> None:
    branch = change(repo, "etcd-size", edit_stack(
        "research-7500", lambda c: c["etcd"]["main"].update({"vmSize": "Standard_D32ds_v5"})), "bigger etcd VMs")
    result = reviewed(repo, branch)
    assert result.stacks == ["research-7500"]
    [risk] = [r for r in result.risks if r.rule == "etcd-quorum"]
    assert risk.level == HIGH
    assert risk.subjects == tuple(f"etcd-main-{i}" for i in range(5))
    assert "5 of 5 etcd-main members" in risk.summary and "tolerates 2 down" in risk.summary
    assert "hardwareProfile.vmSize" in risk.summary
    [diff] = result.changed
    vms = [c for c in diff.resources if c.type.endswith(":VirtualMachine")]
    assert {c.name for c in vms} == {f"research-7500-etcd-main-{i}" for i in range(5)}
    assert all(c.action == UPDATE and "restart" in c.kinds for c in vms)


def test_one_member_of_a_rolling_resize_is_medium(repo: Path) -> None:
    branch = change(repo, "etcd-roll", edit_stack(
        "research-7500", lambda c: c["etcd"]["main"].update({"vmSizeOverrides": {3: "Standard_D32ds_v5"}})),
        "roll etcd-main-3 to the bigger size")
    result = reviewed(repo, branch)
    [risk] = [r for r in result.risks if r.rule == "etcd-restarted"]
    assert (risk.level, risk.rule, risk.subjects) == (MEDIUM, "etcd-restarted", ("etcd-main-3",))
    assert "1 of 5 etcd-main members" in risk.summary and "4 keep quorum" in risk.summary
    # and what the resize does to its data: the local SSD does not follow it, the member rejoins empty
    [data] = [r for r in result.risks if r.rule == "etcd-data-lost"]
    assert data.level == MEDIUM and "must rejoin" in data.summary
    assert {r.rule for r in result.risks} == {"etcd-restarted", "etcd-data-lost"}


def test_removing_the_events_cluster_breaks_the_policy_invariant(repo: Path) -> None:
    # a toolkit change: it touches every stack; reviewed on `local` alone to keep the test short
    branch = change(repo, "no-events", replace_text(
        "infra/kilonode/azure/etcd.py", "for member in etcd.members:",
        "for member in (etcd.members if etcd.role == 'main' else ()):"),
        "drop the events VMs")
    result = reviewed(repo, branch, stacks=["local"])
    assert "policy:etcd-events-cluster" in rules_of(result, HIGH)
    [diff] = result.changed
    deleted = {c.name for c in diff.resources if c.action == DELETE}
    assert {f"local-etcd-events-{i}" for i in range(3)} <= deleted
    risk = next(r for r in result.risks if r.rule == "policy:etcd-events-cluster")
    assert "Events would share the main etcd" in risk.summary


def test_halving_a_pool_is_at_the_guard_and_shrinking_further_is_high(repo: Path) -> None:
    half = reviewed(repo, change(repo, "halve", edit_stack("local", lambda c: c["nodePools"][0].update(
        {"nodes": 1})), "halve the cpu pool"))
    [diff] = half.changed
    [scale_set] = [c for c in diff.resources if c.type.endswith("VirtualMachineScaleSet")]
    capacity = next(i for i in scale_set.inputs if i.path == "sku.capacity")
    assert (capacity.before, capacity.after) == (2, 1)
    assert "pool-shrink" not in rules_of(half, HIGH) and "pool-halved" in rules_of(half, MEDIUM)
    more = reviewed(repo, change(repo, "shrink", edit_stack("research-2500", lambda c: [
        p.update({"nodes": p["nodes"] // 3}) for p in c["nodePools"][:1]]), "shrink the first pool to a third"))
    risk = next(r for r in more.risks if r.rule == "pool-shrink")
    assert risk.level == HIGH and "more than half" in risk.summary
    assert any(c.action == DELETE and c.type.endswith("VirtualMachineScaleSet")
               for d in more.changed for c in d.resources), "the shards beyond the new size go"


def test_growing_a_pool_past_its_recorded_subnet_is_refused_and_high(repo: Path) -> None:
    branch = change(repo, "grow", edit_stack("research-7500", lambda c: c["nodePools"][1].update({"nodes": 5000})),
                    "grow h100-ib to 5,000")
    result = reviewed(repo, branch)
    [risk] = result.risks
    assert (risk.level, risk.rule) == (HIGH, "stack-invalid")
    [diff] = result.diffs
    assert any("moves this pool's subnet 10.0.64.0/18" in e for e in diff.errors), diff.errors


def test_growing_a_pool_that_moves_the_next_pools_subnet_is_high(repo: Path) -> None:
    """Before `kilonode allocate` records them, pools' subnets follow one another: growing the
    first moves the second, which recreates what sits in it."""
    def two_pools(c: dict) -> None:
        first = c["nodePools"][0]
        first.pop("subnet")
        c["nodePools"].append({**first, "name": "cpu2"})
    path = "stacks/Pulumi.twopools.yaml"

    def create(repo: Path) -> None:
        document = yaml.safe_load((repo / "stacks/Pulumi.local.yaml").read_text())
        document["config"]["kilonode:cluster"]["name"] = "twopools"
        two_pools(document["config"]["kilonode:cluster"])
        (repo / path).write_text(yaml.safe_dump(document, sort_keys=False))
        git(repo, "add", path)
    base = change(repo, "twopools-base", create, "a stack with two unrecorded pools")
    git(repo, "checkout", "-q", "-B", "twopools-grow", base)
    edit_stack("twopools", lambda c: c["nodePools"][0].update({"nodes": 40}))(repo)
    git(repo, "commit", "-q", "-am", "grow the first pool")
    git(repo, "checkout", "-q", "main")
    result = review(repo, base, "twopools-grow")
    moved = [r for r in result.risks if r.rule == "address-moved"]
    assert moved and all(r.level == HIGH for r in moved)
    assert any("twopools-network-pool-cpu2" in r.subjects[0] and "addressPrefix" in r.summary for r in moved), moved


def test_a_comment_only_change_reports_no_changes(repo: Path) -> None:
    branch = change(repo, "comment", replace_text(
        "stacks/Pulumi.research-7500.yaml", "# The 7,500-node shape", "# The 7,500-node cluster's shape"),
        "reword a comment")
    result = reviewed(repo, branch)
    assert result.stacks == ["research-7500"] and result.changed == [] and result.risks == []
    assert "no changes" in to_text(result)


def test_docs_and_tests_touch_no_stack(repo: Path) -> None:
    def add_doc(repo: Path) -> None:
        (repo / "NOTES.md").write_text("a note\n")
        git(repo, "add", "NOTES.md")
    result = reviewed(repo, change(repo, "docs", add_doc, "a note"))
    assert result.stacks == [] and "No stack touched" in to_text(result)


def kilonode(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kilonode.cli", "diff", *args], cwd=repo, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_cli_as_a_new_user_runs_it(repo: Path, tmp_path: Path) -> None:
    """Change research-7500's main etcd VM size, commit, `kilonode diff --base HEAD~1 --fail-on
    high`: exit 3, the five members and the quorum risk named; the Markdown fits one comment;
    a comment-only commit on top exits 0 with "no changes"."""
    git(repo, "checkout", "-q", "-B", "user", "main")
    try:
        edit_stack("research-7500", lambda c: c["etcd"]["main"].update({"vmSize": "Standard_D32ds_v5"}))(repo)
        git(repo, "commit", "-q", "-am", "bigger etcd VMs")
        done = kilonode(repo, "--base", "HEAD~1", "--fail-on", "high")
        assert done.returncode == 3, done.stdout + done.stderr
        assert "etcd-quorum" in done.stdout and "5 of 5 etcd-main members" in done.stdout
        for i in range(5):
            assert f"research-7500-etcd-main-{i}" in done.stdout
        report = tmp_path / "diff.json"
        md = kilonode(repo, "--base", "HEAD~1", "--format", "md", "--write-json", str(report))
        assert md.returncode == 0, md.stderr
        assert md.stdout.startswith(MARKER) and len(md.stdout) < COMMENT_LIMIT
        assert md.stdout.index("### Risks") < md.stdout.index("### research-7500")
        data = json.loads(report.read_text())
        assert data["level"] == HIGH and data["risks"][0]["rule"] == "etcd-quorum"
        replace_text("stacks/Pulumi.research-7500.yaml", "apiserver:", "apiserver:  # five, behind the LB")(repo)
        git(repo, "commit", "-q", "-am", "a comment")
        quiet = kilonode(repo, "--base", "HEAD~1", "--fail-on", "high")
        assert quiet.returncode == 0, quiet.stdout + quiet.stderr
        assert "no changes" in quiet.stdout
        bad = kilonode(repo, "--base", "no-such-ref")
        assert bad.returncode == 2 and "'no-such-ref' names no commit" in bad.stderr
    finally:
        git(repo, "checkout", "-q", "main")


def test_the_markdown_of_a_toolkit_change_fits_one_comment(repo: Path) -> None:
    """A change to every node's custom data in the biggest stack: hundreds of resources and
    files; the comment keeps summary and risks and cuts the rest with a pointer."""
    branch = change(repo, "toolkit", replace_text(
        "sysctl/gpu-worker.yaml", "value: 100000", "value: 110000"), "raise gc_thresh3 in the profile")
    result = reviewed(repo, branch, stacks=["research-7500"])
    assert result.why == "chosen with --stack"
    text = to_markdown(result)
    assert len(text) < COMMENT_LIMIT
    # one line for the pool and its teams' shards: one decision
    assert "fleet-rollout" in text and len(re.findall(r"every scale set of pool-a100-ib\b", text)) == 1
    assert re.search(r"every scale set of pool-a100-ib \(50: shared 10, team-language 30, team-vision 10\)", text)
    assert {c.action for d in result.changed for c in d.resources} <= {UPDATE, REPLACE, CREATE}


def test_widening_a_budgeted_daemonsets_cluster_wide_watch_is_high(repo: Path) -> None:
    """cloud-node-manager states its budget (its own Node); a change that also lets it list and
    watch every Pod is a new per-node watch the budget does not cover: every node x one watch."""
    branch = change(repo, "cnm-pods", replace_text(
        "infra/kilonode/k8s/cloud_provider.py", '    ("", "nodes/status", ["patch"]),\n]\n\n\n',
        '    ("", "nodes/status", ["patch"]),\n    ("", "pods", ["list", "watch"]),\n]\n\n\n'),
        "let cloud-node-manager watch pods")
    result = reviewed(repo, branch, stacks=["local"])
    [risk] = [r for r in result.risks if r.rule == "daemonset-api-load"]
    nodes = sum(p["nodes"] for p in yaml.safe_load(result.changed[0].head["files"]["plan.yaml"])["nodePools"])
    assert risk.level == HIGH and risk.subjects == ("local-k8s-cloud-provider-cloud-node-manager",)
    assert risk.summary.startswith(f"{nodes:,} nodes x a watch of pods on the apiservers: the 2,500-node lesson")
    assert "ClusterRole kilonode:cloud-node-manager" in risk.summary and "its stated budget" in risk.summary
    # the budget covers it for the policy pack: no policy risk, only the load story
    assert not any(r.rule.startswith("policy:") for r in result.risks)
