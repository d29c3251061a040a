"""Preflight as a user runs it: the same findings from a stack, from saved artefacts and from
the Pulumi program's gate; clear refusals of unusable input; exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pulumi
import pytest
from typer.testing import CliRunner

from kilonode.azure.program import preflight_gate
from kilonode.cli import app
from kilonode.preflight import CHECKS, InputError, breaks, run
from kilonode.preflight.load import from_directories
from kilonode.preflight.report import format_json, format_text
from kilonode.render.write import write_tree
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

runner = CliRunner()


def test_every_check_has_a_stable_unique_name() -> None:
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    assert all(n == n.lower() and " " not in n for n in names)


def test_the_shipped_stacks_have_no_break(shipped: str) -> None:
    findings = run(inputs_of(shipped))
    assert breaks(findings) == [], format_text(findings, shipped)


def saved(tmp_path: Path, stack: str) -> tuple[Path, Path]:
    """The stack's render as `kilonode render` writes it and its graph as `kilonode plan --format json`."""
    from kilonode.config import load_stack
    from kilonode.render.cluster import render_tree

    render = tmp_path / "render"
    write_tree(render_tree(load_stack(stack).config, shared.plan(stack)), render, stack=stack)
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(artefacts(stack)[1]))
    return render, graph


def test_saved_artefacts_give_the_same_findings_as_the_stack(tmp_path: Path) -> None:
    render, graph = saved(tmp_path, "research-2500")
    from_disk = run(from_directories(render, graph))
    assert format_json(from_disk) == format_json(run(inputs_of("research-2500")))


def test_unusable_input_is_refused_naming_the_file(tmp_path: Path) -> None:
    render, graph = saved(tmp_path, "local")
    with pytest.raises(InputError, match=r"no plan\.yaml"):
        from_directories(tmp_path, graph)
    graph.write_text("{not json")
    with pytest.raises(InputError, match=r"graph\.json: not readable as JSON"):
        from_directories(render, graph)
    graph.write_text(json.dumps({"stack": "local"}))
    with pytest.raises(InputError, match="no 'resources' list"):
        from_directories(render, graph)
    graph.write_text(json.dumps(artefacts("local")[1]))
    with pytest.raises(InputError, match="not a directory of built images"):
        from_directories(render, graph, tmp_path / "missing")
    (render / "plan.yaml").write_text("cluster: [")
    with pytest.raises(InputError, match="not a kilonode plan"):
        from_directories(render, graph)


def test_the_command_exits_0_without_breaks_and_2_on_unusable_input(tmp_path: Path) -> None:
    render, graph = saved(tmp_path, "local")
    result = runner.invoke(app, ["preflight", "--render", str(render), "--graph", str(graph), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert all(f["level"] != "break" for f in json.loads(result.stdout))
    result = runner.invoke(app, ["preflight", "--render", str(render)])
    assert result.exit_code == 2
    assert "both --render DIR and --graph FILE" in result.output
    result = runner.invoke(app, ["preflight", "local", "--check", "no-such-check"])
    assert result.exit_code == 2
    assert "no check named no-such-check" in result.output


def _fake_preflight(tmp_path: Path, findings: list[dict[str, str]], code: int) -> list[str]:
    script = tmp_path / "fake.py"
    script.write_text(f"import sys; print({json.dumps(json.dumps(findings))}); sys.exit({code})")
    return [sys.executable, str(script)]


BREAK = {"check": "scheduling", "level": "break", "where": "Deployment kube-system/coredns",
         "what": "no node admits it", "fix": "add a system pool"}


def test_the_program_refuses_before_creating_anything_on_a_break(tmp_path: Path) -> None:
    with pytest.raises(pulumi.RunError, match=r"(?s)preflight found 1 break\(s\).*nothing was created.*scheduling: "
                       r"Deployment kube-system/coredns"):
        preflight_gate(Path("stacks/x.yaml"), _fake_preflight(tmp_path, [BREAK], 1))


def test_the_program_goes_on_with_warnings_and_stops_when_preflight_cannot_run(tmp_path: Path) -> None:
    preflight_gate(Path("x.yaml"), _fake_preflight(tmp_path, [{**BREAK, "level": "warn"}], 0))
    with pytest.raises(pulumi.RunError, match=r"could not check x\.yaml \(exit 2\)"):
        preflight_gate(Path("x.yaml"), [sys.executable, "-c", "import sys; sys.exit(2)"])


def test_the_docs_page_is_generated_from_the_checks() -> None:
    from kilonode.paths import REPO_ROOT
    from kilonode.preflight.report import PAGE, reference_markdown

    assert REPO_ROOT is not None
    page = (REPO_ROOT / PAGE).read_text()
    assert page == reference_markdown(), "run `make golden` and commit"
    assert all(f"### `{c.name}`" in page for c in CHECKS)
