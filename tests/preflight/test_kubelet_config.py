"""kubelet-config: the shipped stacks' pools render a KubeletConfiguration the kubelet accepts; a
field out of the kubelet's own bounds (ValidateKubeletConfiguration: containerLogMaxFiles 1, the
image GC thresholds reversed, parallel pulls with serializeImagePulls true) is a break, and the
containerLogMaxFiles change on research-7500 reaches the review as a high preflight-break. So are
the static CPU manager with no CPU reserved (the kubelet's start refuses it), single-numa-node on the
pools whose NCCL job pods ask all 8 GPUs, and a podPidsLimit below the plan's training-pod estimate.

The breaks are planted in the rendered kubelet-config.yaml, as a change to the renderer or to
kilonode.plan.defaults would render them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from kilonode.catalog.kubelet_validation import catalogue
from kilonode.plan import defaults
from kilonode.preflight import run
from kilonode.preflight.checks.kubelet_config import broken, seconds
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import assess
from tests.preflight.conftest import artefacts, inputs_of
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG = "etc/kubernetes/kubelet-config.yaml"


def edit(files: dict[str, str], change: Callable[[dict[str, Any]], None]) -> list[str]:
    """Every host's kubelet configuration changed by `change`; the hosts."""
    hosts = []
    for path in sorted(p for p in files if p.endswith(CONFIG)):
        document = yaml.safe_load(files[path])
        change(document)
        files[path] = yaml.safe_dump(document)
        hosts.append(path.split("/", 1)[0])
    return hosts


def found(stack: str, files: dict[str, str]) -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, files=files), ["kubelet-config"])]


def test_the_shipped_stacks_kubelets_accept_their_configuration(shipped: str) -> None:
    assert found(shipped, artefacts(shipped)[0]) == []


def test_one_container_log_file_keeps_every_pools_kubelet_down() -> None:
    files, _ = artefacts(STACK)
    hosts = edit(files, lambda c: c.update(containerLogMaxFiles=1))
    breaks = found(STACK, files)
    assert [(level, where) for level, where, _ in breaks] == [("break", f"{h}/{CONFIG}") for h in hosts]
    assert len(hosts) >= 5
    what = breaks[0][2]
    assert "containerLogMaxFiles 1" in what and "must be greater than 1" in what
    assert "refuses its configuration and exits: no node of the pool starts" in what


@pytest.mark.parametrize("change, said", [
    ({"imageGCLowThresholdPercent": 90}, "imageGCLowThresholdPercent 90 with imageGCHighThresholdPercent 85"),
    ({"serializeImagePulls": True}, "serializeImagePulls True with maxParallelImagePulls 10"),
    ({"containerLogMaxSize": "100 MiB"}, "containerLogMaxSize '100 MiB'"),
    ({"maxPods": -1}, "maxPods -1"),
    ({"eventRecordQPS": -5}, "eventRecordQPS -5"),
    ({"topologyManagerPolicy": "numa"}, "topologyManagerPolicy 'numa'"),
    ({"cpuCFSQuotaPeriod": "2s"}, "cpuCFSQuotaPeriod 2s"),
    ({"shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "60s"},
     "shutdownGracePeriodCriticalPods 60s with shutdownGracePeriod 30s"),
])
def test_each_rule_the_kubelet_refuses_is_a_break(change: dict[str, Any], said: str) -> None:
    files, _ = artefacts(STACK)
    edit(files, lambda c: c.update(change))
    breaks = found(STACK, files)
    assert breaks and all(level == "break" and said in what for level, _, what in breaks)


def test_defaulted_zeros_and_fields_left_out_pass() -> None:
    rules = catalogue().rules
    config = {"maxPods": 0, "port": 0, "nodeLeaseDurationSeconds": 0, "maxParallelImagePulls": 10,
              "imageGCHighThresholdPercent": 90, "shutdownGracePeriod": "30s", "shutdownGracePeriodCriticalPods": "10s"}
    assert [r.field for r in rules if broken(r, config)] == []
    assert [r.field for r in rules if broken(r, {"containerLogMaxFiles": 0})] == ["containerLogMaxFiles"]
    assert seconds("1m30s") == 90 and seconds("100ms") == 0.1 and seconds("-2s") == -2 and seconds("2 s") is None


def test_the_catalogue_says_what_it_read() -> None:
    known = catalogue()
    assert "NOT read at v1.34.2" in known.validation_source and "001332b0" in known.validation_source
    assert {r.field for r in known.rules} >= {"containerLogMaxFiles", "eventRecordQPS", "registryPullQPS", "maxPods"}


def test_the_log_files_lowered_to_one_is_a_high_preflight_break_in_the_review() -> None:
    head = snapshot(STACK)
    edit(head["files"], lambda c: c.update(containerLogMaxFiles=1))
    risks = assess(compare_stack(STACK, snapshot(STACK), head), {})
    [line] = [r for r in risks if r.rule == "preflight-break" and "kubelet-config" in r.summary]
    assert line.level == HIGH
    assert "containerLogMaxFiles 1" in line.summary and "no node of the pool starts" in line.summary


def gpu_hosts(stack: str) -> list[str]:
    """The render roles of the stack's GPU pools."""
    plan = inputs_of(stack).plan
    return sorted(p.role(t) for p in plan.node_pools if p.gpus_per_node for t in (None, *p.teams))


def test_the_static_cpu_manager_with_nothing_reserved_keeps_the_kubelet_down() -> None:
    files, _ = artefacts(STACK)
    hosts = edit(files, lambda c: c.update(cpuManagerPolicy="static", topologyManagerScope="pod"))
    breaks = [b for b in found(STACK, files) if "cpuManagerPolicy" in b[2]]
    assert [(level, where) for level, where, _ in breaks] == [("break", f"{h}/{CONFIG}") for h in hosts]
    what = breaks[0][2]
    assert "cpuManagerPolicy static with no kubeReserved.cpu or systemReserved.cpu or reservedSystemCPUs" in what
    assert "the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero" in what
    assert "no node of the pool starts" in what and "or its start" in what


@pytest.mark.parametrize("reserved", [{"kubeReserved": {"cpu": "500m"}}, {"systemReserved": {"cpu": "1"}},
                                      {"reservedSystemCPUs": "0-1"}])
def test_a_cpu_reservation_lets_the_static_cpu_manager_start(reserved: dict[str, Any]) -> None:
    [rule] = [r for r in catalogue().rules if r.kind == "requiresAny"]
    assert broken(rule, {"cpuManagerPolicy": "static", **reserved}) is None
    assert broken(rule, {"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "0"}}) is not None
    assert broken(rule, {"cpuManagerPolicy": "none"}) is None


def test_single_numa_node_rejects_the_nccl_jobs_eight_gpu_pods() -> None:
    files, _ = artefacts(STACK)
    edit(files, lambda c: c.update(topologyManagerPolicy="single-numa-node", topologyManagerScope="pod"))
    breaks = found(STACK, files)
    gpus = gpu_hosts(STACK)
    assert len(gpus) >= 2
    assert sorted(where for _, where, _ in breaks) == sorted(f"{h}/{CONFIG}" for h in gpus)
    assert all(level == "break" for level, _, _ in breaks)
    h100 = [what for _, where, what in breaks if where.startswith("pool-h100-ib/")]
    assert h100 and "2 NUMA nodes of 4 GPUs" in h100[0] and "asks all 8 GPUs" in h100[0]
    assert "the gang never starts" in h100[0] and "TopologyAffinityError" in h100[0]


def test_restricted_and_best_effort_admit_the_whole_node_pods() -> None:
    for policy in ("restricted", "best-effort"):
        files, _ = artefacts(STACK)
        edit(files, lambda c, p=policy: c.update(topologyManagerPolicy=p))
        assert found(STACK, files) == []


def test_a_pod_pids_limit_below_the_training_pods_tasks_is_a_break_on_gpu_pools() -> None:
    files, _ = artefacts(STACK)
    edit(files, lambda c: c.update(podPidsLimit=1024))
    breaks = found(STACK, files)
    assert sorted(where for _, where, _ in breaks) == sorted(f"{h}/{CONFIG}" for h in gpu_hosts(STACK))
    assert all(level == "break" for level, _, _ in breaks)
    what = breaks[0][2]
    assert "podPidsLimit 1024" in what and "about 3,840 tasks" in what
    assert "the jobs' pods cannot start their processes on the pool's new nodes" in what


def test_the_plans_own_limit_covers_its_own_estimate() -> None:
    assert defaults.TRAINING_POD_TASKS == 3840 == 8 * defaults.TRAINING_RANK_TASKS
    assert defaults.POD_PIDS_LIMIT >= defaults.TRAINING_POD_TASKS
