"""Every number a stack file holds is bounded by the program that reads it (catalog/bounds.yaml);
every sysctl override by its key's kernel type and, where the key hardens the kernel, by
kilonode's baseline (catalog/sysctls.yaml). The largest value a reader takes still passes; one
more is refused (the refusals themselves are hostile files, tests/config/hostile/sem-*)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.catalog.bounds import bounds, number_range
from kilonode.catalog.sysctls import sysctls
from kilonode.config import load_stack
from kilonode.config.reference import keys
from kilonode.config.values import ReadBy
from kilonode.paths import SYSCTL_DIR
from kilonode.problems import StackError
from tests.conftest import StackWriter, shipped_cluster_value

HOSTILE_DIR = Path(__file__).resolve().parent / "hostile"

# Integer keys no other program reads as a number, and what bounds them instead.
BOUNDED_ELSEWHERE = {
    "members": "1, 3, 5 or 7 (EtcdClusterConfig's validators); the count of etcd VMs",
    "vmSizeOverrides": "a member index below members (checks._etcd_overrides)",
    "rejoining": "must stay empty (EtcdClusterConfig._rejoining_is_gone)",
    "replicas": "at most 15 (the model); the count of apiserver VMs",
    "hostNetworkPods": "at most 100 (the model); reaches the kubelet inside maxPods",
    "gpusPerNode": "at most 16 and the size's own count (checks._sizes)",
    "minSnatPortsPerNode": "at most 64,512 (the model); sizes the NAT gateway's prefix",
    "maxConcurrentVmCreates": "at most 2,000: 100 gallery replicas of 20 VMs each (checks._image_replicas)",
    "firstShard": "a shard of its pool (the plan refuses one past the pool's end)",
    "generation": "a name part of the join token's resources; previous is current - 1 (the model)",
    "certificateGenerations": "0 to 10,000 (values.Generation)",
    "adminGeneration": "0 to 10,000 (values.Generation); a name part of the admin group (kilonode:cluster-admins:g<N>)",
    "sysctl.overrides": "each key's kernel type (catalog/sysctls.yaml; tests below)",
    "teams[].nodes": "whole shards of its pool (the plan refuses more than the pool has)",
}


def _holds_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    return any(_holds_int(arg) for arg in typing.get_args(annotation) if isinstance(arg, type) or
               typing.get_args(arg))


def _readers(annotation: Any) -> set[str]:
    found = {m.key for m in getattr(annotation, "__metadata__", ()) if isinstance(m, ReadBy)}
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) or typing.get_args(arg):
            found |= _readers(arg)
    return found


def _integer_keys() -> dict[str, set[str]]:
    """Every key of the stack's value that holds an integer -> the readers (bounds.yaml) it names."""
    return {key.path: _readers(key.field.annotation) | {m.key for m in key.field.metadata if isinstance(m, ReadBy)}
            for key in keys() if _holds_int(key.field.annotation)}


def test_every_integer_key_is_bounded_by_its_reader_or_says_what_bounds_it() -> None:
    unbounded = [path for path, readers in _integer_keys().items()
                 if not readers and not any(path == k or path.endswith("." + k) for k in BOUNDED_ELSEWHERE)]
    assert not unbounded, f"integer keys with no reader in catalog/bounds.yaml and no entry here: {unbounded}"


def test_every_reader_in_the_catalogue_bounds_a_key() -> None:
    used = set().union(*_integer_keys().values())
    # the string keys that hold numbers name theirs in kilonode.config.values
    used |= {"etcdAutoCompactionRetentionHours", "etcdAutoCompactionRetentionDuration", "imagePullProgressDeadline",
             "galleryImageVersionPart"}
    assert set(bounds().numbers) == used


def test_a_key_with_both_a_domain_bound_and_a_reader_keeps_the_domain_inside_the_reader() -> None:
    for key in keys():
        readers = _readers(key.field.annotation) | {m.key for m in key.field.metadata if isinstance(m, ReadBy)}
        for item in key.field.metadata:
            for reader in readers:
                low, high = number_range(reader)
                assert getattr(item, "le", None) is None or item.le <= high, key.path
                assert getattr(item, "ge", None) is None or item.ge >= low, key.path


def _stack_with(write_stack: StackWriter, change: dict[str, Any]) -> Any:
    cluster = shipped_cluster_value("local")
    for path, value in change.items():
        where: Any = cluster
        parts = path.split(".")
        for part in parts[:-1]:
            where = where[int(part)] if isinstance(where, list) else where.setdefault(part, {})
        where[parts[-1]] = value
    return load_stack(str(write_stack(cluster))).config


# The largest (or smallest) value each reader takes: accepted.
@pytest.mark.parametrize("change", [
    {"etcd.main.quotaBackendBytes": 8384883669867978007, "etcd.main.acknowledgeQuotaAboveSuggestedMaximum": True},
    {"etcd.main.snapshotCount": 9223372036854775807},
    {"etcd.main.autoCompactionRetention": "2562047"},
    {"etcd.main.autoCompactionRetention": "2562047h47m16.854775807s"},
    {"apiserver.auditLog.maxAgeDays": 106751},
    {"apiserver.auditLog.maxSizeMb": 8796093022207},
    {"apiserver.auditLog.maxBackup": 9223372036854775807},
    {"nodePools.0.imagePullProgressDeadline": "2562047h"},
    {"nodePools.0.imagePullProgressDeadline": "1m"},  # the floor (cri-dockerd's default)
    {"nodePools.0.imagePullProgressDeadline": "60s"},
    {"nodeImage.version": "2147483647.2147483647.0"},
    {"etcdImage.version": "0.0.0"},
    {"sysctl": {"overrides": {"net.ipv4.neigh.default.gc_thresh3": 2147483647, "fs.file-max": 9223372036854775807,
                              "net.ipv4.ip_local_port_range": "1 65535", "kernel.pid_max": 4194304,
                              "net.ipv4.tcp_rmem": "4096 131072 2147483647", "net.core.default_qdisc": "fq"}}},
], ids=lambda change: next(iter(change)))
def test_the_edge_a_reader_takes_is_accepted(write_stack: StackWriter, change: dict[str, Any]) -> None:
    _stack_with(write_stack, change)


def test_one_past_the_retention_etcd_reads_is_refused_in_both_spellings(write_stack: StackWriter) -> None:
    for retention in ("2562048", "2562047h47m16.854775808s"):
        with pytest.raises(StackError, match="etcd --auto-compaction-retention"):
            _stack_with(write_stack, {"etcd.main.autoCompactionRetention": retention})


# Hardening sysctls at or above kilonode's baseline: accepted (the weaker ones are hostile files).
@pytest.mark.parametrize(("key", "value"), [
    ("kernel.kptr_restrict", 1), ("kernel.kptr_restrict", 2), ("kernel.unprivileged_bpf_disabled", 1),
    ("kernel.unprivileged_bpf_disabled", 2), ("kernel.perf_event_paranoid", 3), ("kernel.yama.ptrace_scope", 3),
    ("net.ipv4.conf.all.rp_filter", 1), ("net.ipv4.conf.eth0.rp_filter", 2), ("vm.mmap_min_addr", 65536),
    ("net.ipv6.conf.all.accept_source_route", -1), ("fs.suid_dumpable", 0), ("net.ipv4.tcp_syncookies", 2),
])
def test_a_hardening_sysctl_at_or_above_its_baseline_is_accepted(write_stack: StackWriter, key: str,
                                                                 value: int) -> None:
    assert _stack_with(write_stack, {"sysctl": {"overrides": {key: value}}}).sysctl.overrides[key] == value


def test_every_hardening_baseline_is_a_value_its_key_takes() -> None:
    catalogue = sysctls()
    for name, rule in catalogue.hardening.items():
        low, high, _, _ = catalogue.range_of(name)
        assert low <= rule.least <= high, name
        assert not rule.weaker(rule.least), name
        values = rule.stronger if isinstance(rule.stronger, tuple) else (low, high)
        assert all(low <= v <= high for v in values), name


@pytest.mark.parametrize("profile", sorted(SYSCTL_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_the_shipped_profiles_set_values_their_keys_take_and_weaken_nothing(profile: Path) -> None:
    catalogue = sysctls()
    for name, entry in yaml.safe_load(profile.read_text()).items():
        assert catalogue.key(name) is not None, f"{name}: give its type in catalog/sysctls.yaml"
        low, high, _, _ = catalogue.range_of(name)
        assert isinstance(entry["value"], str) or low <= entry["value"] <= high, name
        found = catalogue.hardening_of(name)
        assert found is None or not found[1].weaker(entry["value"]), name


@pytest.mark.parametrize("prefix", [
    "sem-number-", "sem-sysctl-weakens-", "sem-world-", "sem-reserved-", "sem-key-", "sem-path-", "sem-name-",
])
def test_the_semantic_corpus_has_cases_of_every_class(prefix: str) -> None:
    assert len(list(HOSTILE_DIR.glob(f"{prefix}*.yaml"))) >= 3, prefix


@pytest.mark.parametrize("key", sorted(sysctls().paths))
def test_a_key_the_kernel_runs_or_writes_as_root_is_refused_as_such(write_stack: StackWriter, key: str) -> None:
    """Not only as a key the catalogue lacks: a row added to `keys` for it later is refused by the
    catalogue's own validator, and the message says why the key is never a stack's."""
    refused = re.escape(f"sysctl.overrides.{key}: {key} names a program or file the kernel runs")
    with pytest.raises(StackError, match=refused):
        _stack_with(write_stack, {"sysctl": {"overrides": {key: "core"}}})


def test_an_override_of_a_key_the_catalogue_lacks_says_how_to_add_it(write_stack: StackWriter) -> None:
    with pytest.raises(StackError, match=r"add a row to keys in infra/kilonode/catalog/sysctls\.yaml"):
        _stack_with(write_stack, {"sysctl": {"overrides": {"net.ipv4.tcp_congestion_control": "bbr"}}})
