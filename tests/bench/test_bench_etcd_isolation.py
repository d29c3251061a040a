"""The arithmetic of bench/bench_etcd_isolation.py: its schedule, its percentiles, latency
counted from the scheduled time (coordinated omission), and its hand-encoded protobuf."""

from __future__ import annotations

import math

import pytest

from tests.scripts import BENCH_DIR, load_script

bench = load_script(BENCH_DIR / "bench_etcd_isolation.py", "bench_etcd_isolation")


def test_the_schedule_sends_rate_puts_a_second_evenly_from_zero() -> None:
    offsets = bench.schedule(160, 2.0)
    assert len(offsets) == 320
    assert offsets[0] == 0.0
    assert offsets[1] == pytest.approx(1 / 160)
    assert offsets[-1] == pytest.approx(319 / 160)


@pytest.mark.parametrize(("p", "expected"), [(50, 50), (99, 99), (99.9, 100), (100, 100), (0.5, 1)])
def test_percentiles_are_nearest_rank_values_that_happened(p: float, expected: float) -> None:
    assert bench.percentile([float(v) for v in range(1, 101)], p) == expected


def test_a_percentile_of_nothing_is_nan_and_of_one_value_is_that_value() -> None:
    assert math.isnan(bench.percentile([], 99))
    assert bench.percentile([7.0], 99) == 7.0


def _stalled_run(rate: float = 100, seconds: float = 10, stall: tuple[float, float] = (5.0, 6.0),
                 service_s: float = 0.002) -> list:
    """The server answers in 2 ms, except that nothing is answered during `stall`: a put due
    in it is answered when the stall ends. The open-loop client sent each on time."""
    outcomes = []
    for due in bench.schedule(rate, seconds):
        done = (stall[1] if stall[0] <= due < stall[1] else due) + service_s
        outcomes.append(bench.Outcome(due=due, sent=due, done=done, ok=True))
    return outcomes


def test_a_one_second_stall_shows_in_p99_when_latency_runs_from_the_schedule() -> None:
    outcomes = _stalled_run()
    values = bench.latencies(outcomes, end=10.0)
    # 100 of the 1,000 puts were due during the stall; the 10th worst waited ~0.9 s
    assert bench.percentile(values, 99) == pytest.approx(0.902, abs=0.011)
    assert values[-1] == pytest.approx(1.002)
    assert bench.percentile(values, 50) == pytest.approx(0.002)


def test_negative_measured_from_the_send_of_a_closed_loop_client_the_same_stall_hides_in_p99() -> None:
    # what a client that waits for each answer before sending the next would record: one slow
    # put; the 99 it could not send during the stall never exist (coordinated omission)
    closed_loop = sorted([0.002] * 899 + [1.002])
    assert bench.percentile(closed_loop, 99) == pytest.approx(0.002)
    assert bench.percentile(bench.latencies(_stalled_run(), end=10.0), 99) > 100 * bench.percentile(closed_loop, 99)


def test_puts_sent_late_count_from_when_they_were_due_not_from_when_they_left() -> None:
    # the sending thread itself was held up for a second (CPU starved, say): the puts due
    # then left late and were answered at once; the wait is still the caller's
    outcomes = []
    for due in bench.schedule(100, 10):
        sent = 6.0 if 5.0 <= due < 6.0 else due
        outcomes.append(bench.Outcome(due=due, sent=sent, done=sent + 0.002, ok=True))
    assert bench.percentile(bench.latencies(outcomes, end=10.0), 99) == pytest.approx(0.902, abs=0.011)
    assert bench.summarise(outcomes, start=0.0, duration_s=10.0, end=10.0)["send_lag_ms"]["max"] == \
        pytest.approx(1000.0)


def test_an_unanswered_put_counts_with_the_time_it_waited() -> None:
    outcomes = [bench.Outcome(due=1.0, sent=1.0, done=None, ok=False),
                bench.Outcome(due=2.0, sent=2.0, done=2.01, ok=True)]
    assert bench.latencies(outcomes, end=6.0) == pytest.approx([0.01, 5.0])
    summary = bench.summarise(outcomes, start=0.0, duration_s=4.0, end=6.0)
    assert summary["unanswered"] == 1 and summary["errors"] == 0 and summary["ok"] == 1
    assert summary["latency_ms"]["max"] == pytest.approx(5000.0)


def test_achieved_throughput_counts_only_puts_answered_within_the_phase() -> None:
    outcomes = _stalled_run(rate=10, seconds=10, stall=(9.5, 20.0))  # the last 5 answered at 20 s
    summary = bench.summarise(outcomes, start=0.0, duration_s=10.0, end=20.0)
    assert summary["scheduled"] == 100
    assert summary["achieved_puts_per_s"] == pytest.approx(9.5)
    assert summary["offered_puts_per_s"] == pytest.approx(10.0)


def test_late_sends_are_reported_as_send_lag() -> None:
    outcomes = [bench.Outcome(due=float(i), sent=i + (0.05 if i == 3 else 0.0), done=i + 0.06, ok=True)
                for i in range(10)]
    lag = bench.summarise(outcomes, start=0.0, duration_s=10.0, end=10.0)["send_lag_ms"]
    assert lag["max"] == pytest.approx(50.0)
    assert lag["p50"] == pytest.approx(0.0)


# protobuf: vectors from the encoding's specification (protobuf.dev, "Encoding"): 150 in field
# 1 is 08 96 01; 300 is ac 02; -1 as an int64 is ten bytes
def test_varints_match_the_protobuf_specification() -> None:
    assert bench.varint(1 << 3) + bench.varint(150) == bytes.fromhex("089601")
    assert bench.varint(300) == bytes.fromhex("ac02")
    assert bench.varint(0) == b"\x00"
    assert bench.varint(-1) == bytes.fromhex("ffffffffffffffffff01")


def test_a_put_request_carries_key_value_and_a_lease_only_when_there_is_one() -> None:
    assert bench.put_request(b"k", b"v") == b"\x0a\x01k\x12\x01v"
    assert bench.put_request(b"k", b"v", lease=300) == b"\x0a\x01k\x12\x01v\x18\xac\x02"
    big = bench.put_request(b"/registry/x", b"a" * 1024)
    assert bench.fields(big) == {1: [b"/registry/x"], 2: [b"a" * 1024]}


def test_the_revision_and_the_lease_id_are_read_from_the_replies() -> None:
    header = b"\x08\x07\x10\x09\x18" + bench.varint(123456) + b"\x20\x02"  # cluster 7, member 9, rev, term 2
    assert bench.revision_of(b"\x0a" + bench.varint(len(header)) + header) == 123456
    grant = b"\x0a" + bench.varint(len(header)) + header + b"\x10" + bench.varint(0x694D8A2B5F3C1E07) + b"\x18\x0a"
    assert bench.lease_id_of(grant) == 0x694D8A2B5F3C1E07
    assert bench.lease_grant_request(3660) == b"\x08" + bench.varint(3660)


def test_a_lease_grant_that_reports_an_error_raises() -> None:
    with pytest.raises(RuntimeError, match="lease not found"):
        bench.lease_id_of(b"\x22\x0flease not found")


def test_the_worst_latency_of_each_second_shows_when_the_stall_was() -> None:
    worst = bench.worst_per_second(_stalled_run(), start=0.0, duration_s=10.0, end=10.0)
    assert worst[5] == pytest.approx(1002.0)
    assert max(worst[:5] + worst[6:]) == pytest.approx(2.0)


def test_rounds_are_pooled_put_by_put_not_by_averaging_their_percentiles() -> None:
    calm = bench.Run([bench.Outcome(due=t, sent=t, done=t + 0.002, ok=True) for t in bench.schedule(100, 10)],
                     start=0.0, end=10.0)
    stalled = bench.Run(_stalled_run(), start=0.0, end=10.0)
    pooled = bench.summarise_runs([calm, stalled], duration_s=10.0)
    # 100 slow puts among 2,000: the 20 worst are all > 0.8 s; the mean of the two rounds' p99s
    # (2 ms and ~900 ms) would say ~450 ms
    assert pooled["latency_ms"]["p99"] == pytest.approx(802.0, abs=11)
    assert pooled["scheduled"] == 2000
    assert pooled["achieved_puts_per_s"] == pytest.approx(100.0)
