"""Trace 12a on research-7500: the Secrets encryption provider changed secretbox -> aesgcm
(kilonode.plan.encryption) was reported as `apiservers-all` alone; the head's
EncryptionConfiguration no longer lists the key every stored Secret was written with, which
`encryption-provider-dropped` reports high, with the documented rotation. A rotation's first step
(the new key second, the old one still first) and the shipped stacks unchanged give nothing."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.plan.encryption import provider_keys
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH
from kilonode.review.risks import Risk, assess
from tests.review.snapshots import snapshot
from tests.shared import SHIPPED_STACKS

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"
RULE = "encryption-provider-dropped"


def with_providers(entry: dict[str, Any], providers: list[str]) -> dict[str, Any]:
    """The snapshot with plan.yaml's secretsEncryption replaced, as the pull request's plan writes it."""
    text = entry["files"]["plan.yaml"]
    old = "secretsEncryption:\n" + "".join(f"- {p}\n" for p in provider_keys())
    assert old in text, "plan.yaml lists the providers as a block sequence"
    entry["files"]["plan.yaml"] = text.replace(old, "secretsEncryption:\n" + "".join(f"- {p}\n" for p in providers))
    return entry


def found(head: dict[str, Any], base: dict[str, Any] | None = None, stack: str = STACK) -> list[Risk]:
    return [r for r in assess(compare_stack(stack, base or snapshot(stack), head), {}) if r.rule == RULE]


def test_the_plan_lists_the_write_provider_first_without_its_key() -> None:
    assert provider_keys() == ("secretbox:kilonode-1", "identity")


def test_secretbox_replaced_by_aesgcm_is_high_with_the_rotation() -> None:
    [risk] = found(with_providers(snapshot(STACK), ["aesgcm:kilonode-1", "identity"]))
    assert risk.level == HIGH
    assert "k8s:enc:secretbox:v1:kilonode-1" in risk.summary and "unreadable" in risk.summary
    assert "add aesgcm:kilonode-1 second, after secretbox:kilonode-1" in risk.summary


def test_a_new_key_name_alone_drops_the_old_key_too() -> None:
    assert found(with_providers(snapshot(STACK), ["secretbox:kilonode-2", "identity"]))


def test_the_rotations_steps_are_silent() -> None:
    second = with_providers(snapshot(STACK), ["secretbox:kilonode-1", "aesgcm:kilonode-2", "identity"])
    assert found(second) == []
    first = with_providers(snapshot(STACK), ["aesgcm:kilonode-2", "secretbox:kilonode-1", "identity"])
    assert found(first, base=second) == []


def test_a_base_without_the_field_is_silent() -> None:
    base = snapshot(STACK)
    base["files"]["plan.yaml"] = base["files"]["plan.yaml"].replace("secretsEncryption:", "removedField:")
    assert found(with_providers(snapshot(STACK), ["aesgcm:kilonode-1", "identity"]), base=base) == []


def test_the_shipped_stacks_unchanged_give_nothing() -> None:
    for stack in SHIPPED_STACKS:
        assert found(snapshot(stack), stack=stack) == []
