"""The kubelet's cgroupDriver moved from systemd to cgroupfs in every pool's kubelet-config.yaml, the
runtimes left on systemd (an independent trace of `kilonode diff`, which saw only the generic medium
`kubelet-config-changed`). What it does depends on the runtime at the pinned versions
(catalog/contracts.yaml containerd and criDockerd, kubelet-cgroup-driver): containerd 1.7.34 does not
report its driver to the kubelet, so on research-2500's containerd pools the kubelet runs cgroupfs
against runc's systemd and no pod sandbox starts: a preflight `contracts` break new at the head,
which `preflight-break` reports high. cri-dockerd reports Docker's systemd and the kubelet of 1.34
uses it, so on research-7500's Docker pools the field is inert: a warning, no break, and the review
keeps the medium line."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CONFIG = "etc/kubernetes/kubelet-config.yaml"
LINE = "kubelet-cgroup-driver"


def cgroupfs_everywhere(stack: str) -> tuple[list[Risk], list[str]]:
    """The review of `stack` with every pool's kubelet on cgroupfs; the hosts changed."""
    head: dict[str, Any] = snapshot(stack)
    files = head["files"]
    hosts = []
    for path in sorted(p for p in files if p.endswith(CONFIG)):
        document = yaml.safe_load(files[path])
        assert document["cgroupDriver"] == "systemd"
        document["cgroupDriver"] = "cgroupfs"
        files[path] = yaml.safe_dump(document)
        hosts.append(path.split("/", 1)[0])
    return assess(compare_stack(stack, snapshot(stack), head), {}), hosts


def test_on_containerd_pools_a_cgroupfs_kubelet_is_a_high_preflight_break() -> None:
    risks, hosts = cgroupfs_everywhere("research-2500")
    [line] = [r for r in risks if r.rule == "preflight-break" and LINE in r.summary]
    assert line.level == HIGH
    assert "preflight's contracts check finds" in line.summary
    assert "contract line containerd/kubelet-cgroup-driver" in line.summary
    assert "the kubelet runs with cgroupDriver cgroupfs" in line.summary
    assert "RunPodSandbox fails for every pod of the node" in line.summary
    assert {s.split(":")[0] for s in line.subjects} == set(hosts)


def test_on_docker_pools_the_field_is_inert_and_the_review_keeps_the_medium_line() -> None:
    risks, hosts = cgroupfs_everywhere("research-7500")
    assert not [r for r in risks if r.rule == "preflight-break" and LINE in r.summary]
    [changed] = [r for r in risks if "a kubelet configuration field the review does not model changed" in r.summary]
    assert changed.level == MEDIUM
    assert "cgroupDriver systemd -> cgroupfs" in changed.summary
    assert len(hosts) >= 5
