"""The Pulumi entry point: tiny, reads kilonode:cluster, refuses a bad stack with its problems."""

from __future__ import annotations

import ast
import runpy
import shutil
from pathlib import Path

import pulumi
import pytest

from kilonode.azure.deployer import Answer
from kilonode.azure.graph import Graph, format_json
from kilonode.azure.mockplan import run_plan, run_program
from kilonode.config import load_stack
from kilonode.paths import EXAMPLE_STACKS_DIR, REPO_ROOT
from kilonode.plan import plan_stack
from kilonode.plan.model import BootImage
from tests.conftest import shipped_cluster_value
from tests.source import parse

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def test_the_pulumi_entry_point_builds_the_graph_kilonode_plan_shows(graphs: dict[str, Graph]) -> None:
    # Pulumi runs `main: infra/` as a script directory, i.e. infra/__main__.py.
    via_main = run_plan(load_stack("local"), lambda: runpy.run_path(str(REPO_ROOT / "infra"), run_name="__main__"))
    assert format_json(via_main) == format_json(graphs["local"])  # `kilonode plan`'s run_plan, recorded once


def test_a_stack_over_azures_limits_stops_the_program_with_the_problem() -> None:
    cluster = shipped_cluster_value("local")
    cluster["nodePools"][0]["podsPerNode"] = 999
    with pytest.raises(pulumi.RunError, match=r"Pulumi\.local\.yaml.*nodePools\[0\]\.podsPerNode"):
        run_program("local", cluster)


def test_an_invalid_cluster_value_stops_the_program_with_every_problem() -> None:
    cluster = shipped_cluster_value("local") | {"nodePool": []}
    with pytest.raises(pulumi.RunError, match="unknown key; did you mean 'nodePools'"):
        run_program("local", cluster)


def import_time_pulumi_calls(path: Path) -> list[str]:
    """file:line of each Config/export/require_object/get_stack call outside a def or class."""
    offenders = []
    for statement in parse(path).body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in {"Config", "export", "require_object", "get_stack"}:
                offenders.append(f"{path.name}:{node.lineno}")
    return offenders


def test_no_azure_module_reads_config_or_exports_at_import_time() -> None:
    # Config read at import time and module-level state are the anti-patterns to avoid:
    # every pulumi call must sit inside a function that the program runs.
    offenders = [hit for path in sorted((REPO_ROOT / "infra" / "kilonode" / "azure").glob("*.py"))
                 for hit in import_time_pulumi_calls(path)]
    assert offenders == []


def test_the_import_time_check_finds_config_read_at_module_level(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("import pulumi\n\nCLUSTER = pulumi.Config().require_object('cluster')\n\n\n"
                      "def main() -> None:\n    pulumi.export('ok', pulumi.Config().get('x'))\n")
    assert import_time_pulumi_calls(module) == ["bad.py:3", "bad.py:3"]


def test_pulumi_up_refuses_subnets_the_stack_file_does_not_record() -> None:
    """An unrecorded subnet could move when another pool changes: nothing is created there."""
    from kilonode.azure.program import main

    cluster = shipped_cluster_value("local")
    cluster["nodePools"].append({"name": "extra", "nodes": 3, "vmSize": "Standard_D4ds_v5", "gpusPerNode": 0})
    with pytest.raises(pulumi.RunError, match=r"not recorded in the stack file: nodePools\[1\]\.subnet \(would be "
                                              r"10\.0\.2\.32/27\); run `kilonode allocate local`"):
        run_program("local", cluster, main)
    # the offline preview shows the pool, on the subnet the refusal names
    graph = run_program("local", cluster)
    assert graph.named("local-network-pool-extra").inputs["addressPrefix"] == "10.0.2.32/27"
    assert graph.named("local-extra-000").plain()["sku"]["capacity"] == 3


def test_pulumi_up_refuses_before_registering_anything_while_a_disk_image_is_not_built(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every image the program uploads must be built first: otherwise the upload of the absent
    file fails after minutes of retries and no scale set is created. The refusal comes before
    preflight and before any resource, and names what is missing and the one command to build it."""
    from kilonode.azure import program
    from kilonode.azure.node_image import default_vhd

    monkeypatch.setattr(program, "_recorded_by_mocks", lambda: False)  # as `pulumi up` runs it
    asked = []
    monkeypatch.setattr(program, "run_tool", lambda argv: asked.append(argv) or Answer(3, "", "ResourceNotFound"))
    monkeypatch.setattr(program, "preflight_gate", lambda *_: pytest.fail("preflight ran before the images' check"))
    monkeypatch.chdir(tmp_path)  # the project folder `pulumi up` runs in: build/node-image/ holds some images
    # and its stack file, which the program reads as every command does (config.load.program_stack)
    (tmp_path / "Pulumi.yaml").write_text("name: kilonode\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    shutil.copy(EXAMPLE_STACKS_DIR / "Pulumi.research-7500.yaml", tmp_path / "stacks")
    names = [image.name for image in plan_images("research-7500")]
    for name in names[:-1]:
        (tmp_path / default_vhd("research-7500", name)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / default_vhd("research-7500", name)).write_bytes(b"")
    with pytest.raises(pulumi.RunError) as refused:
        run_program("research-7500", shipped_cluster_value("research-7500"), program.main)
    assert str(refused.value) == (
        f"1 of the {len(names)} disk images this stack boots are not built here and not published in its gallery: "
        f"build/node-image/research-7500-{names[-1]}.vhd. Build them with `kilonode image build research-7500 --all "
        '--out build/node-image --fetch` (docs/azure.md, "Running it for real"), then `pulumi up` again; nothing '
        "was created.")
    [question] = asked  # the gallery is asked about the one not built, and says it has no such version
    assert names[-1] in question and "image-version" in question


def plan_images(stack: str) -> list[BootImage]:
    return list(plan_stack(load_stack(stack)).boot_images)
