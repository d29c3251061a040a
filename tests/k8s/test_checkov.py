"""checkov's Kubernetes checks (the third-party scanner of issue 24) over every in-cluster object
of the shipped stacks, as `pulumi up` sends them (kilonode.azure.graph.format_manifests, the
goldens' in-cluster/ files): each finding is an accepted exception in
policy/security-exceptions.yaml (`checkov:` check id -> reason and resources), and each listed
resource is still found (a fixed one is removed from the file). Slow: checkov takes about 8 s.

checkov is not in pyproject's test extras: checkov 3.3.30 requires packaging<24 and the pinned
pulumi 3.272 requires packaging>=26, so pip cannot resolve both into one environment. It runs
from .venv-checkov (`make setup`), beside this Python or on PATH; without it the test says so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kilonode.azure.graph import Graph, format_manifests
from kilonode.paths import REPO_ROOT
from tests import shared

# `make setup` installs it in .venv-checkov (its own environment, see the Makefile)
CHECKOV = next((str(p) for p in [Path(__file__).resolve().parents[2] / ".venv-checkov/bin/checkov",
                                  Path(sys.executable).parent / "checkov"] if p.exists()),
               shutil.which("checkov"))
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _checkov_installed() -> None:
    """`make setup` puts checkov in .venv-checkov: missing, the test fails saying so, never skips."""
    if CHECKOV is None:
        pytest.fail("checkov is not installed: run `make setup` (it puts checkov 3.3.30 in .venv-checkov)")


def findings(graphs: dict[str, Graph], directory: Path) -> set[tuple[str, str]]:
    """(check id, resource) of every failed check, over the shipped stacks' objects."""
    for stack, graph in graphs.items():
        for path, text in format_manifests(graph).items():
            target = directory / stack / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    assert CHECKOV is not None
    # --skip-download: no doc links or severities fetched from the vendor's platform (offline)
    run = subprocess.run([CHECKOV, "-d", str(directory), "--framework", "kubernetes", "--quiet", "--compact",
                          "--skip-download", "-o", "json"], capture_output=True, text=True, timeout=300)
    reports: Any = json.loads(run.stdout)
    found = set()
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["summary"]["parsing_errors"] == 0
        found |= {(f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]}
    return found


def accepted() -> set[tuple[str, str]]:
    document = shared.load_yaml((REPO_ROOT / "policy/security-exceptions.yaml").read_text())
    for check, entry in document["checkov"].items():
        assert entry["reason"].strip(), check
    return {(check, resource) for check, entry in document["checkov"].items() for resource in entry["resources"]}


def test_every_checkov_finding_is_an_accepted_exception_and_every_exception_is_found(
    graphs: dict[str, Graph], tmp_path: Path,
) -> None:
    found = findings(graphs, tmp_path)
    assert found - accepted() == set(), "new findings: fix them or accept them with a reason"
    assert accepted() - found == set(), "exceptions no longer found: remove them"


def test_a_privileged_pod_outside_the_exceptions_is_a_finding(graphs: dict[str, Graph], tmp_path: Path) -> None:
    """Seeded break: the CSR approver made privileged is a CKV_K8S_16 finding no exception covers."""
    graph = graphs["local"]
    record = next(r for r in graph.resources if r.name.endswith("approver-deployment"))
    broken = Graph(stack=graph.stack, resources=[r for r in graph.resources if r is not record], outputs={}, notes={})
    manifest = record.plain()
    manifest["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "approver.yaml").write_text(json.dumps(manifest))
    found = findings({"local": broken}, tmp_path)
    assert ("CKV_K8S_16", "Deployment.kube-system.kubelet-csr-approver") in found - accepted()
