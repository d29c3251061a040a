"""Independent trace 10a of `kilonode diff` on research-7500, finding 1: the apiservers' Pod Security
default enforce level `baseline -> restricted` (kilonode.plan.defaults POD_SECURITY_DEFAULT_ENFORCE,
rendered into every apiserver's admission-config.yaml) was reported only as the apiservers' roll.
It reaches every namespace without its own enforce label, kilonode's NCCL job's `default`
included: `pod-security-default-tightened` (high). Loosened: medium. The head is the stack's
recorded snapshot with the rendered file changed by hand, as the pull request renders it."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import pod_security_default
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
CONFIG = "etc/kubernetes/admission-config.yaml"


def with_defaults(entry: dict[str, Any], **values: str) -> dict[str, Any]:
    """Every apiserver's rendered PodSecurity defaults changed to `values` (mode -> value)."""
    paths = [p for p in entry["files"] if p.endswith("/" + CONFIG)]
    assert len(paths) == 5
    for path in paths:
        text = entry["files"][path]
        for mode, value in values.items():
            old = next(line for line in text.splitlines() if line.strip().startswith(f"{mode}:"))
            text = text.replace(old, f"{old.split(':')[0]}: {value}")
        entry["files"][path] = text
    return entry


def risks(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Risk]:
    found = assess(compare_stack(STACK, base or snapshot(STACK), head), {})
    return [r for r in found if r.rule.startswith("pod-security-default")]


def test_the_restricted_default_is_high_naming_the_nccl_job_and_the_unlabelled_namespaces() -> None:
    assert pod_security_default.defaults(snapshot(STACK))["enforce"] == "baseline"
    [line] = risks(with_defaults(snapshot(STACK), enforce="restricted"))
    assert (line.level, line.rule) == (HIGH, "pod-security-default-tightened")
    said = line.summary
    assert "baseline -> restricted" in said
    assert "default" in said and "kube-public" in said and "every namespace users create without a label" in said
    assert "kube-system privileged" in said  # the labelled namespaces keep their own level
    assert "runAsNonRoot" in said and "seccompProfile RuntimeDefault" in said and "dropping ALL" in said
    assert "allowPrivilegeEscalation false" in said
    assert "NCCL job" in said and "would be refused" in said and "without runAsNonRoot true" in said
    assert "warn and audit" in said and "Label the users' namespaces" in said


def test_the_default_loosened_is_medium() -> None:
    [line] = risks(with_defaults(snapshot(STACK), enforce="privileged"))
    assert (line.level, line.rule) == (MEDIUM, "pod-security-default-loosened")
    assert "baseline -> privileged" in line.summary and "root on the node" in line.summary


def test_a_warn_level_or_version_change_is_medium_and_says_what_it_does() -> None:
    [line] = risks(with_defaults(snapshot(STACK), warn="baseline", **{"enforce-version": "v1.33"}))
    assert (line.level, line.rule) == (MEDIUM, "pod-security-default-changed")
    assert "warn restricted -> baseline" in line.summary and "enforce-version v1.34 -> v1.33" in line.summary


def test_unchanged_stacks_give_nothing() -> None:
    assert risks(snapshot(STACK)) == []
    assert pod_security_default.assess(compare_stack(STACK, snapshot(STACK), snapshot(STACK))) == []
