"""`kilonode rollout` through the CLI on a recorded state: start writes the journal from the
plan, step --state --dry-run prints the first steps and changes nothing, status shows it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.rollout import journal as journals

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STATE = Path(__file__).parent / "fixtures" / "research-7500-h100-ib.state.json"
SETS = [f"research-7500-h100-ib-{i:03d}" for i in range(3)]
ENV = {"COLUMNS": "2000", "NO_COLOR": "1"}


def start(journal: Path, *extra: str) -> None:
    only = [arg for name in SETS for arg in ("--only", name)]
    result = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "h100-ib", *only,
                                      "--soak", "30m", "--journal", str(journal), *extra], env=ENV)
    assert result.exit_code == 0, result.output


def test_start_then_a_dry_step_on_a_recorded_state(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    start(path, "--canary", SETS[1], "--cut-gangs")
    journal = journals.load(path)
    assert journal.target == "h100-ib image 1.0.0" and journal.policy.order == (SETS[1], SETS[0], SETS[2])
    assert journal.policy.soak_s == 1800 and journal.policy.cut_gangs
    written = path.read_text()
    result = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path),
                                      "--state", str(STATE), "--dry-run"], env=ENV)
    assert result.exit_code == 0, result.output
    assert f"step: {SETS[1]}: cordon 4 nodes" in result.output
    assert f"step: {SETS[1]}: drain 4 nodes (evicts gangs team-language/gpt-70b)" in result.output
    assert f"waits: {SETS[0]}: the canary {SETS[1]} is not done" in result.output
    assert path.read_text() == written  # a dry run leaves the journal as it was


def test_a_gang_keeps_the_canary_waiting_without_cut_gangs(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    start(path, "--canary", SETS[1])
    result = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path),
                                      "--state", str(STATE), "--dry-run"], env=ENV)
    waits = "gangs run there: team-language/gpt-70b (the policy does not cut gangs; waited 0 of 86400 s)"
    assert waits in result.output
    # cordoned ahead, so no new gang lands on the canary while this one finishes
    assert f"step: {SETS[1]}: cordon 4 nodes (cordoned ahead: no new pod lands there)" in result.output


def test_a_step_on_a_recorded_state_refuses_to_carry_anything_out(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    start(path)
    result = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path),
                                      "--state", str(STATE)], env=ENV)
    assert result.exit_code == 2 and "needs the real one (add --dry-run)" in result.output


def test_status_pause_resume_and_start_refusing_to_replace_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    start(path)
    again = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "h100-ib",
                                     "--journal", str(path)], env=ENV)
    assert again.exit_code == 2 and "--force starts again" in again.output
    paused = CliRunner().invoke(app, ["rollout", "pause", "research-7500", "--why", "incident 42",
                                      "--journal", str(path)], env=ENV)
    assert paused.exit_code == 0
    shown = CliRunner().invoke(app, ["rollout", "status", "research-7500", "--journal", str(path)], env=ENV)
    assert f"{SETS[0]}: pending" in shown.output and "PAUSED: paused by the operator: incident 42" in shown.output
    stepped = CliRunner().invoke(app, ["rollout", "step", "research-7500", "--journal", str(path),
                                       "--state", str(STATE), "--dry-run"], env=ENV)
    assert "PAUSED: paused by the operator: incident 42" in stepped.output
    resumed = CliRunner().invoke(app, ["rollout", "resume", "research-7500", "--journal", str(path)], env=ENV)
    assert resumed.exit_code == 0 and not journals.load(path).paused


def test_an_unknown_pool_or_scale_set_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "h100-ib", "--canary", "nope",
                                      "--journal", str(tmp_path / "j.json")], env=ENV)
    assert result.exit_code == 2 and "pool h100-ib has no scale set nope" in result.output


def test_the_monitoring_pool_needs_a_prometheus_elsewhere(tmp_path: Path) -> None:
    args = ["rollout", "start", "research-7500", "--pool", "monitoring", "--journal", str(tmp_path / "j.json")]
    refused = CliRunner().invoke(app, args, env=ENV)
    assert refused.exit_code == 2 and "runs the cluster's Prometheus" in refused.output
    started = CliRunner().invoke(app, [*args, "--prometheus", "http://prometheus.example:9090"], env=ENV)
    assert started.exit_code == 0 and journals.load(tmp_path / "j.json").prometheus == "http://prometheus.example:9090"


def test_the_default_canary_is_the_pools_first_shared_scale_set_and_the_policy_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "j.json"
    result = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "a100-ib", "--journal", str(path),
                                      "--cordon-ahead", "2", "--gang-wait", "12h"], env=ENV)
    assert result.exit_code == 0, result.output
    policy = journals.load(path).policy
    assert policy.order[0] == "research-7500-a100-ib-040"  # 000-039 are team language's
    assert (policy.cordon_ahead, policy.gang_wait_s, policy.hold_s) == (2, 43200, 1800)


def test_start_force_keeps_the_earlier_journal_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    start(path)
    result = CliRunner().invoke(app, ["rollout", "start", "research-7500", "--pool", "h100-ib", "--journal", str(path),
                                      "--force"], env=ENV)
    assert result.exit_code == 0 and "the earlier rollout's journal is kept as" in result.output
    [aside] = [p for p in tmp_path.iterdir() if p != path and not p.name.endswith(".lock")]
    assert aside.name.startswith("rollout.") and journals.load(aside).policy.order[0] == SETS[0]


def test_a_journal_held_by_a_run_refuses_a_second_and_a_pause_is_left_for_it(tmp_path: Path) -> None:
    """Two processes on one journal would take the same scale set twice: the second is refused,
    naming the first; `pause` while a run holds it leaves the request, applied at the run's next step."""
    path = tmp_path / "rollout.json"
    start(path)
    with journals.locked(path):
        with pytest.raises(journals.Busy, match=f"pid {os.getpid()}"), journals.locked(path):
            pass
        refused = CliRunner().invoke(app, ["rollout", "resume", "research-7500", "--journal", str(path)], env=ENV)
        assert refused.exit_code == 2 and "is running this rollout" in refused.output
        left = CliRunner().invoke(app, ["rollout", "pause", "research-7500", "--journal", str(path), "--why",
                                        "a job owner asked"], env=ENV)
        assert left.exit_code == 0 and "it pauses at its next step" in left.output
        assert not journals.load(path).paused  # the holder's to apply
    journal = journals.load(path)
    assert journals.take_pause_request(journal, path, 1.0)
    assert journal.paused == "paused by the operator: a job owner asked"
    assert not journals.pause_request(path).exists()
