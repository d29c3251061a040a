"""The stack file described from the model: JSON Schema, the reference doc, `kilonode new`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from kilonode.cli import app
from kilonode.config import load_stack
from kilonode.config.reference import REFERENCE_DOC, keys, reference_markdown, stack_file_schema
from kilonode.paths import EXAMPLE_STACKS_DIR, REPO_ROOT

runner = CliRunner()


def test_every_key_has_a_reason() -> None:
    missing = [k.path for k in keys() if not (k.field.description or "").strip()]
    assert missing == []


def test_the_reference_doc_is_current() -> None:
    assert REPO_ROOT is not None
    assert (REPO_ROOT / REFERENCE_DOC).read_text() == reference_markdown(), "run `make golden` and commit"


def test_the_reference_names_every_key_with_its_default() -> None:
    text = reference_markdown()
    for key in keys():
        assert f"| `{key.path}` |" in text
    assert "| `etcd.events.members` | int | `3` |" in text  # a section's own default, not the class's
    assert "| `etcd.main.members` | int | `5` |" in text
    assert "| `nodePools[].nodes` | int | required | ≥ 1, read by cluster-autoscaler" in text


def test_schema_command_prints_a_json_schema_the_shipped_stacks_satisfy() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema == json.loads(json.dumps(stack_file_schema()))
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    for path in sorted(EXAMPLE_STACKS_DIR.glob("Pulumi.*.yaml")):
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert errors == [], f"{path.name}: {[e.message for e in errors]}"
    typo = yaml.safe_load((EXAMPLE_STACKS_DIR / "Pulumi.local.yaml").read_text())
    typo["config"]["kilonode:cluster"]["nodePools"][0]["runtme"] = "docker"
    assert [(list(e.absolute_path), e.message) for e in validator.iter_errors(typo)] == [
        (["config", "kilonode:cluster", "nodePools", 0],
         "Additional properties are not allowed ('runtme' was unexpected)"),
    ]


def test_new_scaffolds_a_project_whose_stack_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "Research-Cluster"
    # --pin path: no wheel built here (tests/cli/test_new_pin.py installs the default pin's wheel)
    result = runner.invoke(app, ["new", str(project), "--pin", "path"])
    assert result.exit_code == 0, result.output
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == [
        ".gitignore", "Pulumi.yaml", "__main__.py", "catalog/vm_sizes.yaml", "node-image/apt.lock.toml",
        "node-image/binaries.lock.toml", "requirements.txt", "stacks/Pulumi.dev.yaml"]
    pulumi_yaml = yaml.safe_load((project / "Pulumi.yaml").read_text())
    assert pulumi_yaml["stackConfigDir"] == "stacks" and pulumi_yaml["runtime"]["name"] == "python"
    assert "from kilonode.azure.program import main" in (project / "__main__.py").read_text()
    assert re.search(r"^kilonode @ file://", (project / "requirements.txt").read_text(), re.M)
    monkeypatch.chdir(project)  # `cd DIR && kilonode validate dev`: the name resolves in the project
    result = runner.invoke(app, ["validate", "dev"])
    assert result.exit_code == 0, result.output
    # the stack's cluster name is the directory's, lowercased into a valid name
    assert load_stack(str(project / "stacks" / "Pulumi.dev.yaml")).config.name == "research-cluster"
    # a second `new` into the same directory is refused and changes nothing
    again = runner.invoke(app, ["new", str(project), "--pin", "path"])
    assert again.exit_code == 2 and "not an empty directory" in again.output


def test_uncommenting_every_key_of_the_starter_stack_changes_nothing(tmp_path: Path) -> None:
    """Each commented line shows the real default: uncomment them all and the cluster is the same."""
    assert runner.invoke(app, ["new", str(tmp_path / "p"), "--name", "demo", "--pin", "path"]).exit_code == 0
    starter = tmp_path / "p" / "stacks" / "Pulumi.dev.yaml"
    commented = starter.read_text()
    config_lines = commented.split("config:\n", 1)[1]
    uncommented = "config:\n" + re.sub(r"^(\s*)# (?=[a-zA-Z]+:)", r"\1", config_lines, flags=re.M)
    assert uncommented.count("\n") == commented.split("config:\n", 1)[1].count("\n") + 1
    full = tmp_path / "Pulumi.full.yaml"
    full.write_text(uncommented)
    assert load_stack(str(full)).config == load_stack(str(starter)).config
