"""controller-clients (kilonode.preflight.checks.controller_clients): the shipped stacks' control plane keeps up
with their joins; research-7500 with upstream's --kube-api-qps put back and the scheduler's qps at 25 (the
seeded break) warns for both programs, with the minutes it takes to start every DaemonSet pod."""

from __future__ import annotations

import pytest

from kilonode.preflight import run
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["controller-clients"]
UNIT = "etc/systemd/system/kube-controller-manager.service"
CONFIG = "etc/kubernetes/kube-scheduler-config.yaml"


def test_the_shipped_stacks_keep_up(shipped: str) -> None:
    assert run(inputs_of(shipped), CHECK) == []


def test_upstreams_defaults_at_research_7500_warn_for_both() -> None:
    files, graph = artefacts("research-7500")
    for path in [p for p in files if p.endswith(UNIT)]:
        assert "--kube-api-qps=100" in files[path]
        files[path] = files[path].replace("--kube-api-qps=100", "--kube-api-qps=20")
    for path in [p for p in files if p.endswith(CONFIG)]:
        assert "qps: 100" in files[path]
        files[path] = files[path].replace("  qps: 100\n", "  qps: 25\n")
    findings = run(inputs_of("research-7500", files=files, graph=graph), CHECK)
    # upstream's 50 for the scheduler would cover the 38.1 a second without kilonode's headroom: 25 does not
    assert [f.where.split(" on ")[0] for f in findings] == ["kube-controller-manager", "kube-scheduler"]
    kcm, scheduler = findings
    assert "is 20/s, under the 38.1 DaemonSet pods/s" in kcm.what and "44 min to start" in kcm.what
    assert "is 25/s" in scheduler.what and "no device plugin" in scheduler.what
    assert all(f.level == "warn" for f in findings) and "apiserver-0" in kcm.where
