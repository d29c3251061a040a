"""What a stack file can add to a machine's custom data (Azure takes 64 KiB of it): each value that
grows it is bounded at load time (kilonode.config.model.CUSTOM_DATA_BOUNDS), and every command that
plans measures each role's custom data as the program composes it, refusing one over the limit at
the stack value that grows it most (kilonode.azure.custom_data_size.oversized): `plan` and
`preflight` ended in a traceback or a bare ValueError before."""

from __future__ import annotations

from pathlib import Path

import pytest

from kilonode.azure.custom_data import AZURE_CUSTOM_DATA_MAX_BYTES
from kilonode.azure.custom_data_size import oversized, user_data
from kilonode.config import Stack, load_stack
from kilonode.config.model import CUSTOM_DATA_BOUNDS
from kilonode.plan import checked_plan
from kilonode.problems import Problem
from kilonode.render import render_cluster
from tests.test_cli_errors import run_main

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def _oversized(stack: Stack) -> list[Problem]:
    plan = checked_plan(stack)
    return oversized(stack, plan, user_data(render_cluster(plan)))


HOSTILE = Path(__file__).resolve().parent / "hostile"
OVER = HOSTILE / "trace2-custom-data-pool-over.yaml"  # every value within its bound, the pool's sum over


@pytest.mark.parametrize("command", [["plan"], ["preflight"], ["explain"]])
def test_a_custom_data_over_the_limit_is_refused_at_its_line_by_every_command_that_plans(
        command: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = run_main([*command, str(OVER)], capsys, monkeypatch)
    assert code == 2, output
    [line] = [line for line in output.splitlines() if not line.startswith("kilonode: ")]
    assert f"{OVER.name}:58: nodePools[0].labels: pool-cpu's custom data would be" in line
    assert "over the 65,535" in line and "ValueError" not in output


def test_the_measurement_is_the_programs_own_and_the_shipped_stacks_are_within_it() -> None:
    for name in ("local", "research-2500", "research-7500"):
        stack = load_stack(name)
        assert _oversized(stack) == []
    stack = load_stack(str(OVER))
    [problem] = _oversized(stack)
    assert problem.loc == ("nodePools", 0, "labels")
    size = int(problem.message.split(" would be ")[1].split(" bytes")[0].replace(",", ""))
    assert size > AZURE_CUSTOM_DATA_MAX_BYTES
    # each value alone is within its bound: it is the sum that is refused
    assert len(stack.config.node_pools[0].labels) <= CUSTOM_DATA_BOUNDS["labels"]
    assert len(stack.config.node_pools[0].taints) <= CUSTOM_DATA_BOUNDS["taints"]
