"""A user's project (what `kilonode new` makes: Pulumi.yaml beside stacks/, not kilonode's
source tree) keeps the files kilonode writes or the user extends: the image build's lock files
and VM sizes added to the catalogue. Outside such a project nothing moves."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kilonode import paths
from kilonode.catalog import binaries
from kilonode.catalog import vm as catalog
from kilonode.cli import app
from kilonode.image.recipe import load_recipe

runner = CliRunner()
H100 = "Standard_ND96isr_H100_v5"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scaffolded project, the working directory (as under `cd DIR` and `pulumi up`)."""
    made = runner.invoke(app, ["new", str(tmp_path / "clusters"), "--pin", "path", "--stack", "dev"])
    assert made.exit_code == 0, made.output
    monkeypatch.chdir(tmp_path / "clusters" / "stacks")  # any folder inside the project
    return tmp_path / "clusters"


def packaged_row(name: str) -> dict[str, object]:
    return catalog._packaged_sizes()[name].model_dump(by_alias=True, mode="json")


def write_sizes(project: Path, sizes: object) -> None:
    (project / "catalog" / "vm_sizes.yaml").write_text(yaml.safe_dump({"sizes": sizes}))


def test_the_source_tree_keeps_its_files(monkeypatch: pytest.MonkeyPatch) -> None:
    assert paths.REPO_ROOT is not None
    monkeypatch.chdir(paths.REPO_ROOT)
    assert paths.user_project() is None
    assert binaries.load().lock_file == paths.NODE_IMAGE_DIR / "binaries.lock.toml"
    assert load_recipe().apt_lock_file == paths.NODE_IMAGE_DIR / "apt.lock.toml"
    assert paths.shown_lock("binaries.lock.toml") == "node-image/binaries.lock.toml"
    assert paths.shown_vm_sizes() == "infra/kilonode/catalog/vm_sizes.yaml"


def test_a_folder_without_stacks_is_no_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: other\nruntime: python\n")
    monkeypatch.chdir(tmp_path)
    assert paths.user_project() is None


def test_the_locks_are_the_projects(project: Path) -> None:
    assert paths.user_project() == project
    catalog_ = binaries.load()
    assert catalog_.lock_file == project / "node-image" / "binaries.lock.toml"
    # seeded by `kilonode new`: the packaged lock's entries are trusted as they were
    assert catalog_.locked == binaries.load_lock(paths.NODE_IMAGE_DIR / "binaries.lock.toml")
    assert load_recipe().apt_lock_file == project / "node-image" / "apt.lock.toml"
    assert paths.shown_lock("binaries.lock.toml") == str(project / "node-image" / "binaries.lock.toml")
    assert paths.shown_vm_sizes().startswith(str(project / "catalog" / "vm_sizes.yaml"))


def test_a_project_adds_a_size_and_a_stack_may_use_it(project: Path) -> None:
    write_sizes(project, {"Standard_D4ds_v9": packaged_row("Standard_D4ds_v5")})
    assert catalog.vm_sizes()["Standard_D4ds_v9"].vcpus == 4
    assert H100 in catalog.vm_sizes()  # the packaged sizes stay
    stack = project / "stacks" / "Pulumi.dev.yaml"
    pool_size = "        vmSize: Standard_D4ds_v5\n"
    assert stack.read_text().count(pool_size) == 1  # the starter's pool
    stack.write_text(stack.read_text().replace(pool_size, pool_size.replace("v5", "v9")))
    validated = runner.invoke(app, ["validate", "dev"])
    assert validated.exit_code == 0, validated.output
    # the same stack where the project's file does not add it: refused, naming that file
    write_sizes(project, {})
    catalog._sizes_in.cache_clear()
    refused = runner.invoke(app, ["validate", "dev"])
    assert refused.exit_code == 2 and "catalog/vm_sizes.yaml (merged over kilonode's catalogue)" in refused.output


def test_a_project_row_may_state_what_kilonode_leaves_unknown(project: Path) -> None:
    row = packaged_row(H100)
    assert row["encryptionAtHost"] is None  # unknown in kilonode's catalogue
    write_sizes(project, {H100: {**row, "encryptionAtHost": True}})
    assert catalog.vm_sizes()[H100].encryption_at_host is True


def test_a_project_row_may_not_change_a_stated_value(project: Path) -> None:
    write_sizes(project, {H100: {**packaged_row(H100), "gpus": 4}})
    with pytest.raises(catalog.CatalogError, match=rf"vm_sizes.yaml: {H100}.gpus differ from kilonode's own"):
        catalog.vm_sizes()


@pytest.mark.parametrize(("content", "message"), [
    ("sizes: [a, b]\n", "must be a mapping with one key, `sizes:`"),
    ("size: {}\n", "must be a mapping with one key, `sizes:`"),
    ("sizes: {Standard_X: {vcpus: 2}}\n", "sizes.Standard_X.memoryGib: Field required"),
    ("sizes: {a: [\n", "cannot be read as YAML"),
])
def test_a_malformed_file_is_refused_naming_it(project: Path, content: str, message: str) -> None:
    (project / "catalog" / "vm_sizes.yaml").write_text(content)
    with pytest.raises(catalog.CatalogError, match=r"vm_sizes\.yaml: ") as refused:
        catalog.vm_sizes()
    assert message in str(refused.value) and "\n" not in str(refused.value)
    # the command says it in one line and stops (exit 2), as for any other unusable input
    result = runner.invoke(app, ["validate", "dev"])
    assert result.exit_code != 0
