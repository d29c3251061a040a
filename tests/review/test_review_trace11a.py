"""The two kubelet-configuration changes an independent trace of `kilonode diff` on research-7500
found reviewed only as the generic medium `kubelet-config-changed` (trace 11a), each on the stack's
recorded snapshot changed by hand as the pull request changes it: the GPU pools given the static CPU
manager and single-numa-node topology alignment with nothing reserved (the kubelet's CPU manager
refuses to start; the NCCL job's 8-GPU pods span NUMA nodes), and podPidsLimit lowered to 1024 (below
the plan's own ~3,840-task estimate of a training pod). Each is a preflight `kubelet-config` break
new at the head, so `preflight-break` reports it high."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG = "etc/kubernetes/kubelet-config.yaml"
GPU_POOLS = ("pool-a100-ib", "pool-h100-ib")


def on_gpu_pools(head: dict[str, Any], change: dict[str, Any]) -> None:
    """Every GPU pool role's kubelet configuration (team roles included) updated with `change`."""
    files = head["files"]
    paths = [p for p in files if p.endswith(CONFIG) and p.split("/", 1)[0].split(".")[0] in GPU_POOLS]
    assert len(paths) >= 3
    for path in paths:
        document = yaml.safe_load(files[path])
        document.update(change)
        files[path] = yaml.safe_dump(document)


def kubelet_breaks(head: dict[str, Any]) -> list[Risk]:
    risks = assess(compare_stack(STACK, snapshot(STACK), head), {})
    return [r for r in risks if r.rule == "preflight-break" and "kubelet-config" in r.summary]


def test_the_static_cpu_manager_and_single_numa_node_on_gpu_pools_is_a_high_preflight_break() -> None:
    head = snapshot(STACK)
    on_gpu_pools(head, {"cpuManagerPolicy": "static", "topologyManagerPolicy": "single-numa-node",
                        "topologyManagerScope": "pod"})
    lines = kubelet_breaks(head)
    assert lines and all(line.level == HIGH for line in lines)
    [static] = [line for line in lines if "cpuManagerPolicy static" in line.summary]
    assert "the static policy requires systemreserved.cpu + kubereserved.cpu" in static.summary
    assert "no node of the pool starts" in static.summary
    [numa] = [line for line in lines if "single-numa-node" in line.summary]
    assert "the gang never starts" in numa.summary


def test_pod_pids_limit_1024_is_a_high_preflight_break() -> None:
    head = snapshot(STACK)
    on_gpu_pools(head, {"podPidsLimit": 1024})
    [line] = kubelet_breaks(head)
    assert line.level == HIGH
    assert "podPidsLimit 1024" in line.summary
    assert "cannot start their processes on the pool's new nodes" in line.summary
