"""The arithmetic of bench/bench_lease_split.py: how it scales the renewal rate to the machine,
and the DeleteRange it clears the main cluster's Leases with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import BENCH_DIR, load_script

bench = load_script(BENCH_DIR / "bench_lease_split.py", "bench_lease_split")


def test_the_renewals_are_nodes_over_ten_when_the_machine_has_room() -> None:
    assert bench.lease_rate(7_504, capacity=10_000) == (pytest.approx(750.4), pytest.approx(1.0))


def test_the_renewals_are_scaled_down_to_a_fraction_of_the_calibrated_capacity() -> None:
    rate, scale = bench.lease_rate(100_000, capacity=2_400)
    assert rate == 480.0 == 2_400 * bench.LOAD_FRACTION
    assert scale == pytest.approx(480 / 10_000)


def test_the_lease_and_node_values_are_the_measured_sizes() -> None:
    assert (bench.NODE_BYTES, bench.LEASE_BYTES) == (15016, 787)


def test_the_delete_range_covers_exactly_the_prefix() -> None:
    request = bench.delete_range_request(b"/registry/leases/")
    fields = bench.iso.fields(request)
    assert fields == {1: [b"/registry/leases/"], 2: [b"/registry/leases0"]}  # '/' + 1 == '0'


def test_the_scratch_stack_adds_a_three_member_leases_cluster_to_research_7500(tmp_path: Path) -> None:
    from kilonode.config import load_stack

    config = load_stack(str(bench.scratch_stack(tmp_path))).config
    assert config.etcd.leases is not None and config.etcd.leases.members == 3
    assert config.name == "research-7500" and config.etcd.main.members == 5
