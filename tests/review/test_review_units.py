"""The review's pure parts on small hand-made snapshots: which stacks a change touches, how
resources compare, each risk rule's boundary, and the Markdown's size limit."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from kilonode.catalog.effects import effects
from kilonode.review.compare import CREATE, DELETE, REPLACE, UPDATE, compare_resources, compare_stack
from kilonode.review.decisions import decisions
from kilonode.review.refs import Side, affected
from kilonode.review.report import COMMENT_LIMIT, MARKER, Review, grouped_files, to_markdown, to_text
from kilonode.review.risks import HIGH, MEDIUM, Risk, assess

VM = "azure-native:compute:VirtualMachine"
VMSS = "azure-native:compute:VirtualMachineScaleSet"


def vm(name: str, role: str, size: str = "Standard_D16ds_v5", protect: bool = True) -> dict[str, Any]:
    return {"type": VM, "name": name, "parent": None, "protect": protect, "custom": True,
            "replaceOnChanges": ["osProfile.customData", "storageProfile.imageReference"], "ignoreChanges": [],
            "inputs": {"hardwareProfile": {"vmSize": size}, "osProfile": {"customData": "[secret sha256:aaaa]"},
                       "tags": {"kilonode-role": role, "kilonode-etcd-quota-bytes": "8589934592"}}}


def scale_set(name: str, pool: str, capacity: int = 100, custom_data: str = "[secret sha256:1]") -> dict[str, Any]:
    return {"type": VMSS, "name": name, "parent": None, "protect": False, "custom": True, "replaceOnChanges": [],
            "ignoreChanges": ["sku.capacity"],
            "inputs": {"sku": {"name": "Standard_D4ds_v5", "capacity": capacity},
                       "tags": {"kilonode-role": f"pool-{pool}"},
                       "virtualMachineProfile": {"osProfile": {"customData": custom_data}}}}


def plan(quota: int = 8 << 30, nodes: int = 400, root: str = "/mnt/local-ssd/docker") -> str:
    return yaml.safe_dump({
        "etcdMain": {"quotaBackendBytes": quota}, "etcdEvents": {"quotaBackendBytes": 8 << 30},
        "nodePools": [{"name": "gpu", "nodes": nodes, "runtimeRoot": root,
                       "localStorage": {"mountPoint": "/mnt/local-ssd"}}],
    })


def entry(**files: str) -> dict[str, Any]:
    members = [vm(f"c-etcd-main-{i}", "etcd-main") for i in range(5)]
    members += [vm(f"c-etcd-events-{i}", "etcd-events") for i in range(3)]
    sets = [scale_set(f"c-gpu-{i:03d}", "gpu") for i in range(4)]
    return {"files": {"plan.yaml": plan(), **{k.replace("__", "/"): v for k, v in files.items()}},
            "resources": members + sets, "outputs": {}}


LESSONS = {"sysctl": {"net.ipv4.neigh.default.gc_thresh3": 100000}}


def risks_between(base: dict[str, Any], head: dict[str, Any]) -> dict[str, str]:
    return {r.rule: r.level for r in assess(compare_stack("c", base, head), LESSONS)}


def test_which_stacks_a_change_touches() -> None:
    known = {"local", "research-7500"}
    assert affected(["stacks/Pulumi.local.yaml"], known) == (["local"], "their stack files changed")
    stacks, why = affected(["templates/etc/etcd.j2", "README.md"], known)
    assert stacks == ["local", "research-7500"] and "templates/etc/etcd.j2" in why
    assert affected(["docs/review.md", "tests/test_x.py"], known)[0] == []
    # a lock change (a download recorded or re-recorded) is a toolkit change: every stack's images
    stacks, why = affected(["node-image/binaries.lock.toml"], known)
    assert stacks == ["local", "research-7500"] and "node-image/binaries.lock.toml" in why


def test_resources_compare_by_type_and_name_and_replace_on_recorded_paths() -> None:
    base = [vm("a", "etcd-main"), vm("b", "etcd-main"), scale_set("s", "gpu")]
    head = copy.deepcopy(base)
    head[0]["inputs"]["hardwareProfile"]["vmSize"] = "Standard_D32ds_v5"
    head[1]["inputs"]["osProfile"]["customData"] = "[secret sha256:bbbb]"
    head[2]["inputs"]["sku"]["capacity"] = 60  # the autoscaler's to change: ignoreChanges
    del head[2]
    head.append(vm("c", "etcd-main"))
    changes = {c.name: c for c in compare_resources(base, head)}
    assert changes["a"].action == UPDATE and "restart" in changes["a"].kinds
    assert changes["b"].action == REPLACE and changes["b"].reason() == "osProfile.customData"
    assert changes["c"].action == CREATE and changes["s"].action == DELETE
    ignored = copy.deepcopy(base)
    ignored[2]["inputs"]["sku"]["capacity"] = 60
    [capacity] = compare_resources(base, ignored)
    assert capacity.inputs[0].ignored and capacity.kinds == set()


def test_every_effect_names_a_source() -> None:
    rows = [e for rows in effects().values() for e in rows]
    assert rows and all(e.source and e.effect in {"replace", "restart", "rollout", "refused", "in-place"}
                        for e in rows)
    assert any(e.type == VM and e.path == "hardwareProfile.vmSize" and e.effect == "restart" for e in rows)


def test_quorum_boundary_two_of_five_is_medium_three_is_high() -> None:
    base = entry()
    for count, level in ((2, MEDIUM), (3, HIGH)):
        head = copy.deepcopy(base)
        for r in head["resources"][:count]:
            r["inputs"]["hardwareProfile"]["vmSize"] = "Standard_D32ds_v5"
        found = risks_between(base, head)
        assert found.get("etcd-quorum" if level == HIGH else "etcd-restarted") == level, found


def test_an_etcd_vm_losing_protect_or_the_events_cluster_is_high() -> None:
    base = entry()
    head = copy.deepcopy(base)
    head["resources"][0]["protect"] = False
    assert risks_between(base, head)["policy:etcd-protected"] == HIGH
    gone = copy.deepcopy(base)
    gone["resources"] = [r for r in gone["resources"] if r["inputs"]["tags"]["kilonode-role"] != "etcd-events"]
    found = risks_between(base, gone)
    assert found["policy:etcd-events-cluster"] == HIGH and found["etcd-quorum"] == HIGH  # 3 of 3 deleted


def test_quota_lowered_is_high_raised_is_not() -> None:
    base = entry()
    lower, higher = copy.deepcopy(base), copy.deepcopy(base)
    lower["files"]["plan.yaml"] = plan(quota=4 << 30)
    higher["files"]["plan.yaml"] = plan(quota=8 << 30 | 1)
    assert risks_between(base, lower) == {"etcd-quota-lowered": HIGH}
    assert risks_between(base, higher) == {}


def test_pool_shrink_boundaries() -> None:
    base = entry()
    for nodes, expected in ((201, {}), (200, {"pool-halved": MEDIUM}), (199, {"pool-shrink": HIGH})):
        head = copy.deepcopy(base)
        head["files"]["plan.yaml"] = plan(nodes=nodes)
        assert risks_between(base, head) == expected, nodes


def test_a_fleet_rollout_is_every_scale_set_of_a_pool() -> None:
    base = entry()
    some, every = copy.deepcopy(base), copy.deepcopy(base)
    for head, count in ((some, 3), (every, 4)):
        for r in [r for r in head["resources"] if r["type"] == VMSS][:count]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:2]"
    # the scale sets are autoscaled (ignoreChanges sku.capacity): their models' PUT is its own line, rollout or not
    assert risks_between(base, some) == {"autoscaled-model-put": MEDIUM}
    assert risks_between(base, every) == {"fleet-rollout": MEDIUM, "autoscaled-model-put": MEDIUM}


def test_a_rollout_over_a_pool_and_its_teams_is_one_line_and_a_teams_own_is_its_own() -> None:
    base = entry()
    base["resources"] += [scale_set(f"c-gpu-lang-{i:03d}", "gpu.team-lang") for i in range(3)]
    pool, team = copy.deepcopy(base), copy.deepcopy(base)
    for head, role in ((pool, ""), (team, "gpu.team-lang")):
        for r in [r for r in head["resources"] if r["type"] == VMSS and role in r["inputs"]["tags"]["kilonode-role"]]:
            r["inputs"]["virtualMachineProfile"]["osProfile"]["customData"] = "[secret sha256:2]"
    [whole] = [r for r in assess(compare_stack("c", base, pool), LESSONS) if r.rule == "fleet-rollout"]
    assert "every scale set of pool-gpu (7: shared 4, team-lang 3)" in whole.summary and len(whole.subjects) == 7
    [own] = [r for r in assess(compare_stack("c", base, team), LESSONS) if r.rule == "fleet-rollout"]
    assert "every scale set of pool-gpu.team-lang (3)" in own.summary


def test_field_lessons_made_weaker_are_medium() -> None:
    conf = "# why\nnet.ipv4.neigh.default.gc_thresh3 = {}\n"
    kubelet = "serializeImagePulls: {}\nmaxParallelImagePulls: 10\n"
    base = entry(**{"pool-gpu__etc__sysctl.d__90-kilonode.conf": conf.format(100000),
                    "pool-gpu__etc__kubernetes__kubelet-config.yaml": kubelet.format("false")})
    weaker = copy.deepcopy(base)
    weaker["files"]["pool-gpu/etc/sysctl.d/90-kilonode.conf"] = conf.format(1024)
    weaker["files"]["pool-gpu/etc/kubernetes/kubelet-config.yaml"] = kubelet.format("true")
    weaker["files"]["plan.yaml"] = plan(root="/var/lib/docker")
    assert risks_between(base, weaker) == {"sysctl-weaker": MEDIUM, "image-pulls-serialized": MEDIUM,
                                           "runtime-root-off-local-disk": MEDIUM}
    stronger = copy.deepcopy(base)
    stronger["files"]["pool-gpu/etc/sysctl.d/90-kilonode.conf"] = conf.format(200000)
    assert risks_between(base, stronger) == {}


def test_the_same_change_on_many_hosts_is_shown_once() -> None:
    base = entry(**{f"etcd-main-{i}__etc__default__etcd": "A=1\n" for i in range(5)})
    head = copy.deepcopy(base)
    for i in range(5):
        head["files"][f"etcd-main-{i}/etc/default/etcd"] = "A=2\n"
    diff = compare_stack("c", base, head)
    [(first, hosts)] = grouped_files(diff.files)
    assert first.path == "etcd-main-0/etc/default/etcd" and hosts == [f"etcd-main-{i}" for i in range(5)]


def test_a_huge_review_is_cut_to_one_comment_keeping_summary_and_risks() -> None:
    base = entry(**{f"pool-gpu-{i}__etc__big.conf": "".join(f"line {n}\n" for n in range(400)) for i in range(300)})
    head = copy.deepcopy(base)
    for i in range(300):
        head["files"][f"pool-gpu-{i}/etc/big.conf"] = "".join(f"line {n} {i}\n" for n in range(400))
    for r in head["resources"]:
        r["inputs"]["hardwareProfile"] = {"vmSize": "Standard_D64ds_v5"}
    diff = compare_stack("c", base, head)
    review = Review(Side("base", "main", "a" * 40), Side("head", "HEAD", "b" * 40), ["c"], "test",
                    [diff], assess(diff, LESSONS))
    text = to_markdown(review)
    assert text.startswith(MARKER) and len(text) <= 60_000 < COMMENT_LIMIT
    assert "### Risks" in text and "etcd-quorum" in text
    assert "full report" in text


def test_an_update_azure_refuses_is_high_and_a_replacement_is_not_refused() -> None:
    base = entry()
    head = copy.deepcopy(base)
    for r in head["resources"][:2]:  # two etcd members moved to another zone: create-only, nested
        r["inputs"]["zones"] = ["3"]
    found = {r.rule: r for r in assess(compare_stack("c", base, head), LESSONS)}
    refused = found["update-refused"]
    assert refused.level == HIGH and refused.subjects == ("c-etcd-main-0", "c-etcd-main-1")
    assert "zones" in refused.summary
    replaced = copy.deepcopy(base)
    replaced["resources"][0]["inputs"]["osProfile"]["customData"] = "[secret sha256:cccc]"  # replaceOnChanges
    assert "update-refused" not in {r.rule for r in assess(compare_stack("c", base, replaced), LESSONS)}


def test_in_cluster_objects_follow_the_kubernetes_providers_rules() -> None:
    def obj(kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"type": kind, "name": name, "parent": "c-k8s-x", "protect": False, "custom": True,
                "replaceOnChanges": [], "ignoreChanges": [], "inputs": {"metadata": {"name": name}, **body}}
    base = entry()
    base["resources"] += [
        obj("kubernetes:core/v1:ConfigMap", "rules", {"data": {"rules.yaml": "groups: []\n"}}),
        obj("kubernetes:scheduling.k8s.io/v1:PriorityClass", "kilonode-team", {"value": 1000}),
    ]
    head = copy.deepcopy(base)
    # a rule file promtool accepts: the replacement is the story here (alert-rules-rejected is not)
    head["resources"][-2]["inputs"]["data"]["rules.yaml"] = "groups:\n- name: kilonode\n  rules: []\n"
    head["resources"][-1]["inputs"]["value"] = 2000
    diff = compare_stack("c", base, head)
    actions = {c.name: c.action for c in diff.resources}
    assert actions == {"rules": REPLACE, "kilonode-team": UPDATE}
    [risk] = assess(diff, LESSONS)
    assert (risk.rule, risk.level, risk.subjects) == ("update-refused", HIGH, ("kilonode-team",))
    assert "the apiserver refuses" in risk.summary


def test_the_rules_hold_a_leases_cluster_to_what_they_hold_the_others() -> None:
    from kilonode.review import rules

    assert rules.ETCD_GROUPS == ("etcd-main", "etcd-events", "etcd-leases")
    assert "etcd-leases" in rules.CONTROL_PLANE_ROLES
    stack = entry()
    # no leases cluster: nothing to say about it
    assert rules.violations([rules.Resource(r["type"], r["name"], r["inputs"], r["protect"])
                             for r in stack["resources"]]) == {}
    leases = [vm(f"c-etcd-leases-{i}", "etcd-leases", protect=i != 1) for i in range(2)]
    found = rules.violations([rules.Resource(r["type"], r["name"], r["inputs"], r["protect"])
                              for r in stack["resources"] + leases])
    assert found["etcd-member-counts"] == ["etcd-leases has 2 members: use 3, 5 or 7 (an odd count of at least 3 "
                                           "tolerates (n-1)/2 down; the 7,500-node clusters ran 5 for the main store)"]
    assert [m.split(":")[0] for m in found["etcd-protected"]] == ["c-etcd-leases-1"]


def test_leases_members_restarted_together_lose_quorum_like_any_etcd_cluster() -> None:
    base = entry()
    base["resources"] += [vm(f"c-etcd-leases-{i}", "etcd-leases") for i in range(3)]
    head = copy.deepcopy(base)
    for r in head["resources"][-2:]:
        r["inputs"]["hardwareProfile"]["vmSize"] = "Standard_D32ds_v5"
    assert risks_between(base, head)["etcd-quorum"] == HIGH


def test_moving_the_leases_on_a_running_cluster_is_high_creating_a_cluster_with_them_is_not() -> None:
    def with_leases(stack: dict[str, Any]) -> dict[str, Any]:
        split = copy.deepcopy(stack)
        document = yaml.safe_load(split["files"]["plan.yaml"]) | {"etcdLeases": {"quotaBackendBytes": 8 << 30}}
        split["files"]["plan.yaml"] = yaml.safe_dump(document)
        split["resources"] += [vm(f"c-etcd-leases-{i}", "etcd-leases") for i in range(3)]
        return split

    base = entry()
    added = risks_between(base, with_leases(base))
    assert added["etcd-leases-moved"] == HIGH
    [risk] = [r for r in assess(compare_stack("c", base, with_leases(base)), LESSONS) if r.rule == "etcd-leases-moved"]
    assert "from the main etcd to the new leases cluster" in risk.summary and "two schedulers" in risk.summary
    assert risks_between(with_leases(base), base)["etcd-leases-moved"] == HIGH  # and back
    # a new cluster has no Lease to move
    new = {"files": {}, "resources": [], "outputs": {}}
    assert "etcd-leases-moved" not in risks_between(new, with_leases(base))


# --- the answer: one line per decision, by impact, and what is not judged -----------------------------------------

def risk(level: str, rule: str, summary: str, subjects: tuple[str, ...] = (), cause: str = "") -> Risk:
    return Risk(level, rule, "c", summary, subjects, cause)


def test_one_decisions_fan_out_is_one_line_led_by_its_gravest_finding() -> None:
    fanned = [risk(HIGH, "update-refused", "7 VirtualMachine change location in place, which Azure refuses (...)",
                   tuple("abcdefg"), cause="location"),
              risk(HIGH, "replace-stops", "`pulumi up` stops at etcd-backup-account: ...", ("s",), cause="location"),
              risk(HIGH, "container-replaced", "the resource group rg is replaced (location): ...", ("rg",),
                   cause="location")]
    [decision] = decisions(fanned)
    assert decision.lead.rule == "container-replaced" and len(decision.others) == 2
    line = decision.line()
    assert line.startswith("container-replaced (c; one change, location, 3 findings): the resource group rg")
    assert "update-refused: 7 VirtualMachine change location in place, which Azure refuses;" in line


def test_decisions_come_by_level_then_impact_then_nodes() -> None:
    found = decisions([risk(MEDIUM, "fleet-rollout", "every scale set of pool-a (10) gets ...: 1,000 nodes"),
                       risk(HIGH, "update-refused", "1 NatGateway change location"),
                       risk(HIGH, "daemonset-stranded", "DaemonSet x can no longer run on 40 nodes"),
                       risk(HIGH, "daemonset-stranded", "DaemonSet y can no longer run on 4,000 nodes"),
                       risk(HIGH, "etcd-quorum", "3 of 5 etcd-main members restart")])
    assert [(d.lead.rule, d.lead.summary.split()[1]) for d in found] == [
        ("etcd-quorum", "of"), ("daemonset-stranded", "y"), ("daemonset-stranded", "x"),
        ("update-refused", "NatGateway"), ("fleet-rollout", "scale")]


def test_a_review_with_no_risk_says_what_it_does_not_judge() -> None:
    base = entry()
    head = copy.deepcopy(base)
    head["resources"][-1]["inputs"]["sku"]["capacity"] = 60  # ignoreChanges: shown, no risk
    diff = compare_stack("c", base, head)
    review = Review(Side("base", "main", "a" * 40), Side("head", "HEAD", "b" * 40), ["c"], "test", [diff], [],
                    ["c: alert rules (x) changed and were not checked: no promtool here"])
    for text in (to_text(review), to_markdown(review)):
        assert "No risk found by the rules, which is not the same as safe" in text
        assert "Not judged: what the workloads themselves do" in text and "no promtool here" in text
