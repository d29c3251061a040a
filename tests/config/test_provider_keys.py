"""Config keys outside `kilonode:` (kilonode.config.load.PROVIDER_KEYS): `pulumi up` hands them to
a provider or the engine, so a stack file sets only the few the project expects, each checked,
and `kilonode diff` shows a change to one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kilonode.config import load_stack
from kilonode.config.load import PROVIDER_KEYS
from kilonode.problems import StackError
from kilonode.review import snapshot
from tests.conftest import shipped_cluster_value

SUBSCRIPTION = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def _write(tmp_path: Path, extra: dict[str, object], name: str = "test") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    config = {**extra, "kilonode:cluster": shipped_cluster_value("local")}
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return path


def test_an_allowed_key_is_read_and_every_other_namespace_is_refused_at_its_line(tmp_path: Path) -> None:
    assert set(PROVIDER_KEYS) == {"azure-native:subscriptionId"}
    stack = load_stack(str(_write(tmp_path, {"azure-native:subscriptionId": SUBSCRIPTION})))
    assert stack.provider_config == {"azure-native:subscriptionId": SUBSCRIPTION}
    assert load_stack("local").provider_config == {}
    path = _write(tmp_path, {"azure-native:subscriptionId": "not-a-guid", "azure-native:location": "westus",
                             "kubernetes:kubeconfig": "/x", "pulumi:disable-default-providers": ["*"]})
    with pytest.raises(StackError) as refused:
        load_stack(str(path))
    assert [(p.path, p.line) for p in refused.value.problems] == [
        ("azure-native:subscriptionId", 2), ("azure-native:location", 3), ("kubernetes:kubeconfig", 4),
        ("pulumi:disable-default-providers", 5)]


def test_kilonode_diff_shows_a_change_to_an_allowed_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's snapshot holds the allowed keys as a file of their own, so a new subscription is
    a changed file in `kilonode diff` (the mock engine's graph does not see it)."""
    def no_graph(_stack: object) -> None:
        raise RuntimeError("not recorded here")

    monkeypatch.setattr("kilonode.azure.mockplan.run_plan", no_graph)
    before = snapshot._stack(str(_write(tmp_path, {}, name="before")))
    after = snapshot._stack(str(_write(tmp_path, {"azure-native:subscriptionId": SUBSCRIPTION})))
    assert snapshot.PROVIDER_CONFIG not in before["files"]
    assert after["files"][snapshot.PROVIDER_CONFIG] == f'azure-native:subscriptionId: "{SUBSCRIPTION}"\n'
