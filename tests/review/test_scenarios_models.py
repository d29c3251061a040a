"""Pull requests whose consequence lives between components (issue 38), each as a commit on a
temporary cluster repository reviewed against its parent with each side's own code, as
tests/review/test_scenarios.py's: a DaemonSet stranded off nodes where it runs, an alert rule
Prometheus refuses, the node image's pins (driver, Fabric Manager), a pool's VM size, an NSG rule
moved above others, advice per resource kind, an image version that deletes its predecessor,
and a report that reads as the answer.

Each expectation was written from what `pulumi up` and the components do (the rule modules'
docstrings cite the sources), before the rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kilonode.k8s import gpu as k8s_gpu
from kilonode.k8s import rdma as k8s_rdma
from kilonode.review import Review, alerting, review
from kilonode.review.risks import HIGH
from tests.monitoring.promtool import promtool_path
from tests.review.conftest import change, edit_stack, replace_text

pytestmark = pytest.mark.slow  # each review renders and records its stack at two refs, in child processes

TEAM_TOLERATION = ('        {"key": wellknown.TEAM_LABEL, "operator": "Exists", '
                   '"effect": wellknown.TEAM_TAINT_EFFECT},\n')


def reviewed(repo: Path, branch: str, stack: str = "local") -> Review:
    return review(repo, "main", branch, stacks=[stack])


def risk(result: Review, rule: str) -> list:  # type: ignore[type-arg]
    return [r for r in result.risks if r.rule == rule]


def test_dropping_the_team_toleration_strands_the_gpu_and_rdma_plugins_on_4000_nodes_in_one_line(repo: Path) -> None:
    # the RDMA plugin shares the device plugin's toleration list: one edit, one decision, one line
    branch = change(repo, "plugin-team", replace_text("infra/kilonode/k8s/gpu.py", TEAM_TOLERATION, ""),
                    "the device plugin no longer tolerates team taints")
    result = reviewed(repo, branch, "research-7500")
    [stranded] = risk(result, "daemonset-stranded")
    assert stranded.level == HIGH and result.risks[0] == stranded
    assert (f"DaemonSet {k8s_gpu.DAEMONSET_NAME} and {k8s_rdma.NAME} can no longer run on 4,000 nodes"
            in stranded.summary)
    assert "team-language (3,000 nodes" in stranded.summary and "offers no nvidia.com/gpu" in stranded.summary


def test_a_taint_on_the_h100_pool_strands_the_gpu_and_rdma_plugins(repo: Path) -> None:
    def taint(cluster: dict) -> None:  # type: ignore[type-arg]
        [pool] = [p for p in cluster["nodePools"] if p["name"] == "h100-ib"]
        pool["taints"] = ["dedicated=training:NoSchedule"]

    branch = change(repo, "h100-taint", edit_stack("research-7500", taint), "reserve the H100s for training")
    result = reviewed(repo, branch, "research-7500")
    [stranded] = risk(result, "daemonset-stranded")
    assert stranded.level == HIGH
    assert stranded.summary.startswith("pool-h100-ib: taint dedicated=training:NoSchedule added")
    assert k8s_gpu.DAEMONSET_NAME in stranded.summary and k8s_rdma.NAME in stranded.summary
    assert "2,500 nodes" in stranded.summary and "registers from now on" in stranded.summary


def test_an_alert_rule_prometheus_cannot_parse_is_high(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv(alerting.PROMTOOL_ENV, str(promtool_path()))
    except RuntimeError as error:  # `make test` unpacks it first: never a skip
        pytest.fail(str(error))
    # the apiserver request selector loses its closing brace: every rule built on it is unparseable
    branch = change(repo, "rule-brace", replace_text("infra/kilonode/render/monitoring.py",
                                                     'verb!~"WATCH|CONNECT"}}\'', 'verb!~"WATCH|CONNECT"\''),
                    "tidy the apiserver selector")
    result = reviewed(repo, branch)
    [rejected] = risk(result, "alert-rules-rejected")
    assert rejected.level == HIGH and result.risks[0] == rejected
    assert "kilonode-rules.yaml" in rejected.summary and "at its next start it exits" in rejected.summary
