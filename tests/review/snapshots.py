"""A shipped stack's review snapshot (what kilonode.review.snapshot records for one side),
built from the plans, renders and graphs the test process has already (tests.shared), so that a
rule's boundary can be tested on a real stack changed by hand, without a git repository or a
child process. Each call hands out a fresh copy."""

from __future__ import annotations

import copy
import functools
from typing import Any

from kilonode.config import load_stack
from kilonode.render.cluster import render_tree
from kilonode.review.snapshot import entry
from tests import shared


@functools.cache
def _shipped(stack: str) -> dict[str, Any]:
    plan = shared.plan(stack)
    files = {path: file.content for path, file in render_tree(load_stack(stack).config, plan).items()}
    return entry(plan, files, shared.recorded_graph(stack))


def snapshot(stack: str) -> dict[str, Any]:
    """The stack's snapshot entry, the caller's own to change."""
    return copy.deepcopy(_shipped(stack))


def workload(entry: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The recorded inputs of a Deployment, DaemonSet or StatefulSet by its metadata.name."""
    [found] = [r["inputs"] for r in entry["resources"] if r["type"] == f"kubernetes:apps/v1:{kind}"
               and r["inputs"]["metadata"]["name"] == name]
    return found


def pod_spec(entry: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = workload(entry, kind, name)["spec"]["template"]["spec"]
    return spec
