"""node-join: seeded breaks. Each plants one fault in a shipped stack's plan, graph or render,
at a fixed clock, and the check must name it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from kilonode.preflight.checks import node_join
from kilonode.preflight.model import Inputs
from kilonode.render.control_plane import NODE_CLIENT_APPROVER_SERVICE
from tests import shared
from tests.preflight.conftest import artefacts, inputs_of

# research-7500's tokens: current generation 2 until 2027-11-30, previous 1 until 2027-02-28
# (the tests' pinned now, tests/conftest.py: the stack loader judges the tokens' lifetime there)
BEFORE = datetime(2026, 12, 1, tzinfo=UTC)


def at(inputs: Inputs, now: datetime) -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in node_join.check(dataclasses.replace(inputs, now=now))]


def test_the_shipped_stacks_tokens_are_fine_today(shipped: str) -> None:
    assert at(inputs_of(shipped), BEFORE) == []


def test_a_token_near_its_expiry_warns_and_an_expired_one_breaks() -> None:
    inputs = inputs_of("research-7500")
    near = at(inputs, datetime(2027, 11, 10, tzinfo=UTC))
    [(level, what)] = [(lv, wt) for lv, w, wt in near if w == "joinTokens.current (generation 2)"]
    assert level == "warn" and "in 20 day(s)" in what
    found = at(inputs, datetime(2027, 11, 30, tzinfo=UTC))
    assert ("break", "joinTokens.current (generation 2)") in [(lv, w) for lv, w, _ in found]
    # the previous generation past its expiry only asks to be removed
    assert [lv for lv, w, _ in found if w.startswith("joinTokens.previous")] == ["warn"]
    assert at(inputs, datetime(2027, 3, 1, tzinfo=UTC))[0][:2] == ("warn", "joinTokens.previous (generation 1)")


def test_a_token_without_expiry_breaks() -> None:
    plan = shared.plan("local")
    tokens = tuple(t.model_copy(update={"expires": None}) for t in plan.join_tokens)
    inputs = dataclasses.replace(inputs_of("local"), plan=plan.model_copy(update={"join_tokens": tokens}))
    [(level, where, what)] = at(inputs, BEFORE)
    assert (level, where) == ("break", "joinTokens") and "never expire" in what


def test_a_token_valid_beyond_the_longest_lifetime_breaks_by_the_loaders_rule() -> None:
    """The stack loader refuses such a file (kilonode.config.tokens); preflight judges the same rule
    as of its own now (--at), so a plan that reaches it another way is a break too."""
    plan = shared.plan("local")
    tokens = tuple(t.model_copy(update={"expires": "9999-12-31T00:00:00Z"}) for t in plan.join_tokens)
    inputs = dataclasses.replace(inputs_of("local"), plan=plan.model_copy(update={"join_tokens": tokens}))
    [(level, where, what)] = at(inputs, BEFORE)
    assert (level, where) == ("break", "joinTokens.current (generation 1)") and "more than 365 days" in what


def test_kubeadms_blanket_nodeclient_approval_breaks() -> None:
    files, graph = artefacts("local")
    graph["resources"].append({
        "type": "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "name": "planted", "parent": None,
        "inputs": {"metadata": {"name": "kubeadm:node-autoapprove-bootstrap"},
                   "roleRef": {"kind": "ClusterRole", "name": node_join.NODECLIENT_ROLE},
                   "subjects": [{"kind": "Group", "name": "system:bootstrappers"}]},
    })
    [(level, where, what)] = at(inputs_of("local", files, graph), BEFORE)
    assert (level, where) == ("break", "ClusterRoleBinding kubeadm:node-autoapprove-bootstrap")
    assert "any node name" in what


def test_apiservers_without_the_approver_break() -> None:
    files, graph = artefacts("local")
    for key in [k for k in files if k.startswith("apiserver-") and k.endswith("/user-data")]:
        files[key] = files[key].replace(NODE_CLIENT_APPROVER_SERVICE, "kilonode-something-else.service")
    [(level, where, what)] = at(inputs_of("local", files, graph), BEFORE)
    assert (level, where) == ("break", "apiserver-0") and "no VM of any pool joins" in what


def test_preflight_judges_expiry_as_of_at_or_kilonode_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """One clock: --at sets KILONODE_NOW, which Inputs reads; a time without a zone is refused
    by name (a token's expiry against a local time would be off by hours)."""
    from kilonode.preflight.model import NOW_ENV, InputError, clock, parse_time

    monkeypatch.setenv(NOW_ENV, "2027-11-29T23:00:00Z")
    assert clock() == datetime(2027, 11, 29, 23, tzinfo=UTC)
    monkeypatch.setenv(NOW_ENV, "2027-11-30T01:00:00+02:00")
    assert clock() == datetime(2027, 11, 29, 23, tzinfo=UTC)
    with pytest.raises(InputError, match="--at: '2027-11-30' has no time zone"):
        parse_time("2027-11-30", "--at")
    with pytest.raises(InputError, match="KILONODE_NOW: 'soon' is not a time"):
        monkeypatch.setenv(NOW_ENV, "soon")
        clock()
