"""The twenty-first independent trace of `kilonode diff` on research-7500: the kubernetes plugin's `ttl 30` ->
`ttl 300` with `cache 300 { prefetch ... }` was only corefile-reloaded; cluster names' answers, NXDOMAIN included,
are then served up to 300 s old (coredns v1.12.1 plugin/kubernetes MinTTL, plugin/backend_lookup.go SOA,
plugin/cache computeTTL). Heads are the shipped stack with its Corefile edited in memory."""

from __future__ import annotations

from typing import Any

import pytest

from kilonode.review import coredns
from kilonode.review.compare import compare_stack
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _risks(head: dict[str, Any]) -> list[Any]:
    from kilonode.review import risks
    return risks.assess(compare_stack(STACK, snapshot(STACK), head), {})


def _rules(head: dict[str, Any], rule: str) -> list[Any]:
    return [r for r in _risks(head) if r.rule == rule]


def _corefile(head: dict[str, Any], *edits: tuple[str, str]) -> None:
    for r in head["resources"]:
        data = (r.get("inputs") or {}).get("data") or {}
        if r["type"] == coredns.CONFIGMAP and coredns.KEY in data:
            for old, new in edits:
                assert old in data[coredns.KEY]
                data[coredns.KEY] = data[coredns.KEY].replace(old, new)
            return
    raise AssertionError("no Corefile")


def test_ttl_and_cache_raised_to_300_is_high_and_names_the_rendezvous() -> None:
    head = snapshot(STACK)
    _corefile(head, ("ttl 30", "ttl 300"), ("cache 30", "cache 300 {\n       prefetch 10 1m 10%\n    }"))
    [line] = _rules(head, coredns.STALE_RULE)
    assert line.level == "high"
    assert "up to 300 s after the API changed it (was 30 s)" in line.summary
    assert "NXDOMAIN for it up to 300 s (was 30 s)" in line.summary
    assert "kubernetes `ttl 30`" in line.summary and "kubernetes `ttl 300`" in line.summary
    assert "rendezvous" in line.summary and "job-0.<service>" in line.summary and "new IP" in line.summary
    assert "Keep the kubernetes block's `ttl` at 30 or less" in line.summary
    assert _rules(head, "corefile-reloaded"), "the reload line stays"


def test_cache_alone_raised_keeps_cluster_answers_at_the_plugin_ttl() -> None:
    """`cache 300` with `ttl 30`: the kubernetes plugin's TTL still bounds cluster answers and their SOA."""
    head = snapshot(STACK)
    _corefile(head, ("cache 30", "cache 300"))
    assert not _rules(head, coredns.STALE_RULE)


def test_a_small_rise_is_medium_and_a_denial_minimum_counts() -> None:
    head = snapshot(STACK)
    _corefile(head, ("ttl 30", "ttl 20"), ("cache 30", "cache 30 {\n       denial 9984 30 30\n    }"))
    assert not _rules(head, coredns.STALE_RULE), "denial MINTTL 30 stays at the base's 30 s"
    base = snapshot(STACK)
    _corefile(base, ("ttl 30", "ttl 10"))
    head = snapshot(STACK)
    _corefile(head, ("ttl 30", "ttl 20"))
    [line] = coredns.stale_raised(compare_stack(STACK, base, head))
    assert line.level == "medium" and "up to 20 s" in line.summary and "(was 10 s)" in line.summary


def test_serve_stale_immediate_adds_its_duration() -> None:
    head = snapshot(STACK)
    _corefile(head, ("cache 30", "cache 30 {\n       serve_stale 5m\n    }"))
    [line] = _rules(head, coredns.STALE_RULE)
    assert line.level == "high" and "up to 330 s" in line.summary
    head = snapshot(STACK)
    _corefile(head, ("cache 30", "cache 30 {\n       serve_stale 5m verify\n    }"))
    assert not _rules(head, coredns.STALE_RULE)


@pytest.mark.parametrize("edit", [("errors", "errors\n    log"), ("loadbalance", "loadbalance\n    errors")])
def test_a_harmless_corefile_change_says_nothing_of_staleness(edit: tuple[str, str]) -> None:
    head = snapshot(STACK)
    _corefile(head, edit)
    assert not _rules(head, coredns.STALE_RULE)
    assert _rules(head, "corefile-reloaded")


def test_ttl_lowered_is_quiet() -> None:
    head = snapshot(STACK)
    _corefile(head, ("ttl 30", "ttl 5"))
    assert not _rules(head, coredns.STALE_RULE)


def test_the_windows_parser() -> None:
    text = ("cluster.local:53 {\n  kubernetes {\n  }\n  cache 60 {\n    success 100 20\n    disable denial\n  }\n}\n"
            ".:53 {\n  forward . /etc/resolv.conf\n  cache 300\n}\n")
    [(zone, (positive, negative, _))] = coredns.stale_windows(text).items()
    assert (zone, positive, negative) == ("cluster.local", 5, 0)  # the plugin's default ttl 5; denial off
    assert coredns.stale_windows(".:53 {\n  kubernetes cluster.local {\n    ttl 0\n  }\n}\n")["cluster.local"][:2] \
        == (0, 0)  # no cache in the block
