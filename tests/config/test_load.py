"""The stack boundary: every mistake is reported with file, line, field and a way out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.config.load import SYSCTL_DIR, stack_from_value
from kilonode.config.model import GIB
from kilonode.paths import EXAMPLE_STACKS_DIR
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value


def problems_of(path: Path) -> list[str]:
    with pytest.raises(StackError) as caught:
        load_stack(str(path))
    return [p.format(caught.value.file) for p in caught.value.problems]


@pytest.mark.parametrize("name", ["local", "research-2500", "research-7500"])
def test_every_shipped_stack_is_valid(name: str) -> None:
    assert load_stack(name).config.name == name


def test_defaults_fill_what_the_stack_leaves_out() -> None:
    config = load_stack("research-2500").config
    assert config.etcd.main.quota_backend_bytes == 8 * GIB
    assert config.etcd.events.members == 3
    assert config.node_pools[0].max_concurrent_downloads == 10


def test_even_etcd_member_count_is_refused_with_line_and_field(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["members"] = 4
    [problem] = problems_of(write_stack(cluster))
    assert "Pulumi.test.yaml:" in problem
    assert "etcd.main.members: must be odd (got 4)" in problem
    assert "use 3 or 5" in problem


def test_more_than_seven_members_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["events"]["members"] = 9
    [problem] = problems_of(write_stack(cluster))
    assert "etcd.events.members" in problem and "at most 7" in problem


def test_typo_key_is_an_error_that_suggests_the_real_key(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["podsPerNodes"] = 4
    [problem] = problems_of(write_stack(cluster))
    assert "nodePools[0].podsPerNodes: unknown key; did you mean 'podsPerNode'?" in problem


def test_problem_names_the_line_of_the_offending_key(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.lines.yaml"
    path.write_text(
        "config:\n"
        "  kilonode:cluster:\n"
        "    name: lines\n"
        "    joinTokens: {current: {generation: 1, expires: '2027-11-30T00:00:00Z'}}\n"
        "    nodePools:\n"
        "      - name: gpu\n"
        "        nodes: 10\n"
        "        runtme: docker\n"
    )
    [problem] = problems_of(path)
    assert problem.startswith(f"{path}:8: nodePools[0].runtme")


def test_gc_thresh_out_of_order_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["sysctl"] = {"overrides": {"net.ipv4.neigh.default.gc_thresh3": 85000}}
    [problem] = problems_of(write_stack(cluster))
    assert "sysctl.overrides.net.ipv4.neigh.default.gc_thresh3" in problem
    assert "80000 / 90000 / 85000" in problem


def test_gc_thresh_override_in_order_is_accepted(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["sysctl"] = {"overrides": {"net.ipv4.neigh.default.gc_thresh3": 200000}}
    overrides = load_stack(str(write_stack(cluster))).config.sysctl.overrides
    assert overrides == {"net.ipv4.neigh.default.gc_thresh3": 200000}


def test_an_override_of_a_tunable_the_kubelet_checks_is_refused(write_stack: StackWriter) -> None:
    """Seeded break: with protectKernelDefaults the kubelet would refuse to start on every node."""
    cluster = shipped_cluster_value("local")
    cluster["sysctl"] = {"overrides": {"vm.overcommit_memory": 0, "kernel.panic": 10}}  # the second is its value
    [problem] = problems_of(write_stack(cluster))
    assert "sysctl.overrides.vm.overcommit_memory" in problem and "unless it is 1" in problem


def test_a_profile_without_a_tunable_the_kubelet_checks_is_refused(tmp_path: Path) -> None:
    profile = yaml.safe_load((SYSCTL_DIR / "gpu-worker.yaml").read_text())
    del profile["kernel.panic_on_oops"]
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(profile))
    cluster = shipped_cluster_value("local") | {"sysctl": {"profile": "bare"}}
    with pytest.raises(StackError) as caught:
        stack_from_value("local", cluster, tmp_path / "Pulumi.local.yaml", sysctl_dir=tmp_path)
    [problem] = [p.format("S") for p in caught.value.problems]
    assert "sysctl.profile" in problem and "kernel.panic_on_oops" in problem and "does not set it" in problem


def test_quota_above_8_gib_needs_acknowledgement(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["quotaBackendBytes"] = 16 * GIB
    [problem] = problems_of(write_stack(cluster))
    assert "etcd.main.quotaBackendBytes" in problem and "acknowledgeQuotaAboveSuggestedMaximum" in problem
    cluster["etcd"]["main"]["acknowledgeQuotaAboveSuggestedMaximum"] = True
    assert load_stack(str(write_stack(cluster))).config.etcd.main.quota_backend_bytes == 16 * GIB


def test_duplicate_pool_names_are_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"].append({k: v for k, v in cluster["nodePools"][0].items() if k != "subnet"})
    [problem] = problems_of(write_stack(cluster))
    assert "nodePools[1].name" in problem and "already the name of nodePools[0]" in problem


def test_subnet_outside_the_vnet_and_overlaps_are_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["network"] = {"etcdSubnet": "10.0.1.0/24", "controlPlaneSubnet": "10.0.1.128/25"}
    cluster["nodePools"][0]["subnet"] = "192.168.0.0/24"
    found = problems_of(write_stack(cluster))
    assert any("nodePools[0].subnet: 192.168.0.0/24 is not inside network.vnetCidr" in p for p in found)
    assert any("network.etcdSubnet: 10.0.1.0/24 overlaps 10.0.1.128/25" in p for p in found)


def test_invalid_cidr_is_refused(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["network"] = {"vnetCidr": "10.0.0.1/16"}
    [problem] = problems_of(write_stack(cluster))
    assert problem.endswith(": network.vnetCidr: 10.0.0.1/16 has host bits set; write the network itself: 10.0.0.0/16")


@pytest.mark.parametrize(("version", "ok"), [("1.31.9", False), ("1.32.7", True), ("1.35.4", True), ("1.36.0", False)])
def test_supported_kubernetes_versions(write_stack: StackWriter, version: str, ok: bool) -> None:
    cluster = shipped_cluster_value("local")
    cluster["kubernetesVersion"] = version
    path = write_stack(cluster)
    if ok:
        assert load_stack(str(path)).config.kubernetes_version == version
    else:
        [problem] = problems_of(path)
        assert "kubernetesVersion" in problem and "use 1.32 to 1.35" in problem


@pytest.mark.parametrize(("version", "missing"), [
    ("1.34.999", "kubectl, kubelet, kubernetes-server"),
    # kubelet and kubectl are pinned for 1.35.0, the control plane (the server tarball) only for 1.35.4
    ("1.35.0", "kubernetes-server"),
])
def test_a_kubernetes_version_without_pinned_binaries_is_refused(write_stack: StackWriter, version: str,
                                                                 missing: str) -> None:
    cluster = shipped_cluster_value("local")
    cluster["kubernetesVersion"] = version
    [problem] = problems_of(write_stack(cluster))
    assert f": kubernetesVersion: {version} has no pinned {missing} in node-image/binaries.toml" in problem
    assert "pinned for every machine: 1.32.7-1.32.8, 1.33.4-1.33.5, 1.34.0-1.34.7, 1.35.4" in problem


def test_all_problems_are_reported_at_once(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["etcd"]["main"]["members"] = 2
    cluster["apiserver"]["replicaz"] = 3
    cluster["nodePools"][0]["runtime"] = "cri-o"
    with pytest.raises(StackError) as caught:
        load_stack(str(write_stack(cluster)))
    problems = caught.value.problems
    assert [p.path for p in problems] == ["etcd.main.members", "apiserver.replicaz", "nodePools[0].runtime"]
    assert None not in [p.line for p in problems]


def test_unknown_stack_name_lists_the_stacks_there_are() -> None:
    with pytest.raises(StackError) as caught:
        load_stack("no-such-stack")
    assert str(caught.value) == (
        "no-such-stack: (top level): no stack named 'no-such-stack' (looked in stacks: local, research-2500, "
        "research-7500); give a stack name from there or a path to a stack file"
    )


def test_broken_yaml_reports_its_line(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text("config:\n  kilonode:cluster:\n    name: [unclosed\n")
    [problem] = problems_of(path)
    assert "not valid YAML" in problem and f"{path}:" in problem


def test_stray_kilonode_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.stray.yaml"
    path.write_text(
        "config:\n  kilonode:clustr:\n    name: x\n  kilonode:cluster:\n    name: x\n"
        "    nodePools: [{name: a, nodes: 1}]\n"
        "    joinTokens: {current: {generation: 1, expires: '2027-11-30T00:00:00Z'}}\n"
    )
    [problem] = problems_of(path)
    assert "kilonode:clustr: unknown kilonode setting" in problem


def test_labels_and_taints_are_checked(write_stack: StackWriter) -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["labels"] = {"team": "a,b"}
    cluster["nodePools"][0]["taints"] = ["gpu:Sometimes"]
    labels, taints = problems_of(write_stack(cluster))
    assert labels.endswith(": nodePools[0].labels.team: label value 'a,b': at most 63 of [A-Za-z0-9_.-], "
                           "alphanumeric at both ends")
    assert taints.endswith(": nodePools[0].taints[0]: 'gpu:Sometimes' is not a taint like "
                           "'nvidia.com/gpu=present:NoSchedule' (key[=value]:effect, the effect one of NoSchedule, "
                           "PreferNoSchedule, NoExecute)")
    cluster["nodePools"][0]["labels"] = {"example.com/team": "vision"}
    cluster["nodePools"][0]["taints"] = ["nvidia.com/gpu=present:NoSchedule"]
    pool = load_stack(str(write_stack(cluster))).config.node_pools[0]
    assert pool.labels == {"example.com/team": "vision"}
    assert pool.taints == ("nvidia.com/gpu=present:NoSchedule",)


def test_an_alias_is_read_as_its_value(tmp_path: Path) -> None:
    """Aliases are YAML's, and tools that write YAML use them for a repeated value; only their
    expansion is bounded (tests/config/hostile/billion-laughs.yaml)."""
    text = (EXAMPLE_STACKS_DIR / "Pulumi.local.yaml").read_text(encoding="utf-8")
    main = "        localDisk: {device: /dev/vdb}\n      events:"
    events = "        localDisk: {device: /dev/vdb}\n    apiserver:"
    text = text.replace(main, main.replace("localDisk: ", "localDisk: &disk "), 1)
    text = text.replace(events, events.replace("{device: /dev/vdb}", "*disk"), 1)
    assert "*disk" in text
    path = tmp_path / "Pulumi.aliased.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_stack(str(path)).config.etcd.events.local_disk.device == "/dev/vdb"


def test_member_indices_read_through_pulumi_config_are_text_and_still_indices(tmp_path: Path) -> None:
    """The Pulumi program reads the stack value as JSON (pulumi.Config), whose object keys are
    always text: vmSizeOverrides' "3" is member 3 there, as YAML's 3 is; other text is refused."""
    import json

    from kilonode.config.load import stack_from_value

    raw = shipped_cluster_value("research-7500")
    raw["etcd"]["main"]["vmSizeOverrides"] = {3: "Standard_D32ds_v5"}
    as_pulumi_reads_it = json.loads(json.dumps(raw))
    assert as_pulumi_reads_it["etcd"]["main"]["vmSizeOverrides"] == {"3": "Standard_D32ds_v5"}
    stack = stack_from_value("research-7500", as_pulumi_reads_it, tmp_path / "Pulumi.research-7500.yaml")
    assert stack.config.etcd.main.vm_size_overrides == {3: "Standard_D32ds_v5"}
    for bad in ("true", "3a", "-1"):
        raw["etcd"]["main"]["vmSizeOverrides"] = {bad: "Standard_D32ds_v5"}
        with pytest.raises(StackError, match="takes a member index"):
            stack_from_value("research-7500", json.loads(json.dumps(raw)), tmp_path / "Pulumi.research-7500.yaml")
