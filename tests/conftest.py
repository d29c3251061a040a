"""Shared fixtures: shipped stacks, their plans, and stack files written for a test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from kilonode.image.cache import cache_root
from kilonode.image.rootfs import NO_MIRROR_ENV
from kilonode.plan import ClusterPlan
from kilonode.preflight.model import NOW_ENV
from tests import shared
from tests.shared import SHIPPED_STACKS

# Tests never reach a package mirror: what they need, `make test-artefacts` prepared (cloud-init's
# schema, the image bases). An image build that would need the mirror fails, naming that.
os.environ[NO_MIRROR_ENV] = "1"

# Preflight judges the shipped stacks' join tokens as of a fixed day, not the day a test runs: real
# tokens expire (2027-11-30 in the shipped stacks) and no test may start failing on a date. Tests of
# expiry pass their own `now`.
os.environ[NOW_ENV] = "2026-12-01T00:00:00+00:00"

# Hypothesis keeps no example database: the property tests draw afresh each run, bounded by
# their max_examples. What it does keep goes to kilonode's cache, not .hypothesis/ in the
# checkout: the constants it reads from every module of the project (once per file content,
# keyed by its hash), which each pytest process would otherwise parse again at collection.
set_hypothesis_home_dir(cache_root() / "hypothesis")
settings.register_profile("kilonode", database=None)
settings.load_profile("kilonode")


# A file at least this big under a test's work directory is a disk image, a VHD or a root
# filesystem archive (4 GiB each for a node image).
LARGE_FILE_BYTES = 64 << 20


def drop_large_files(root: Path) -> None:
    """Remove the disk images under `root` once the tests that share them are done, keeping
    the logs and reports beside them: one full run builds seven node images (tens of GB), and
    pytest keeps its temporary directories, so CI ran its disk full."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size >= LARGE_FILE_BYTES:
            path.unlink()


def module_workdir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A module fixture's work directory whose disk images go when the module is done."""
    path = tmp_path_factory.mktemp(name)
    yield path
    drop_large_files(path)


@pytest.fixture(scope="session")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each shipped stack's resource graph under Pulumi's mock engine (kilonode.azure.graph.Graph),
    recorded once per test run (tests.shared): tests/azure, tests/k8s and the rest read the same graphs."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return {name: shared.recorded_graph(name) for name in SHIPPED_STACKS}
    # an xdist worker's temporary directory lies in the run's, which the workers share
    return shared.graphs_across_workers(tmp_path_factory.getbasetemp().parent, int(worker.removeprefix("gw")))


@pytest.fixture(scope="session")
def plans() -> dict[str, ClusterPlan]:
    return {name: shared.plan(name) for name in SHIPPED_STACKS}


def shipped_cluster_value(name: str) -> dict[str, Any]:
    return shared.cluster_value(name)


with_leases = shared.with_leases


StackWriter = Callable[[dict[str, Any]], Path]


@pytest.fixture
def write_stack(tmp_path: Path) -> StackWriter:
    """Write a stack file holding `cluster` under kilonode:cluster; return its path."""

    def write(cluster: dict[str, Any], name: str = "test") -> Path:
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump({"config": {"kilonode:cluster": cluster}}, sort_keys=False))
        return path

    return write

