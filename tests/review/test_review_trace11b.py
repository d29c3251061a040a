"""Two changes an independent trace of `kilonode diff` on research-7500 found under-reported (trace 11b), each on the
stack's recorded snapshot changed by hand: kube-apiserver `--event-ttl=24h` (24x the Events in the Events etcd, whose
quota is 8 GiB) and CoreDNS's `forward . /etc/resolv.conf` -> `forward . 8.8.8.8 1.1.1.1` (off Azure DNS)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kilonode.review import control_flags, coredns
from kilonode.review.compare import compare_stack
from kilonode.review.finding import HIGH, MEDIUM, Finding
from tests.review.snapshots import snapshot

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACK = "research-7500"


def _apiserver(head: dict[str, Any], flags: str) -> None:
    for path in list(head["files"]):
        if path.endswith("kube-apiserver.service"):
            assert "--profiling=false" in head["files"][path]
            head["files"][path] = head["files"][path].replace("--profiling=false", "--profiling=false \\\n    " + flags)


def _flags(head: dict[str, Any], stack: str = STACK) -> list[Finding]:
    return control_flags.assess(compare_stack(stack, snapshot(stack), head))


def test_event_ttl_24h_is_high_with_the_break_even_and_what_to_watch() -> None:
    head = snapshot(STACK)
    _apiserver(head, "--event-ttl=24h")
    [line] = _flags(head)
    assert line.level == HIGH and line.rule == control_flags.EVENT_TTL_RAISED_RULE
    assert "(unset) -> 24h" in line.summary and "24x" in line.summary
    assert "8,589,934,592" in line.summary and "under 76/s" in line.summary and "1,819/s" in line.summary
    assert "341 MiB" in line.summary and "7,504 nodes" in line.summary
    assert 'etcd_mvcc_db_total_size_in_bytes{job="kilonode-etcd-events"}' in line.summary
    assert "KilonodeEtcdDatabaseNearQuota" in line.summary and "KilonodeEtcdNoSpace" in line.summary
    assert "etcd.events.quotaBackendBytes" in line.summary and "keep 1h" in line.summary
    assert len(line.subjects) == 5  # every apiserver; the generic line says nothing more


def test_event_ttl_doubled_is_medium_and_lowered_is_medium() -> None:
    head = snapshot(STACK)
    _apiserver(head, "--event-ttl=2h")
    [line] = _flags(head)
    assert line.level == MEDIUM and line.rule == control_flags.EVENT_TTL_RAISED_RULE and "under 909/s" in line.summary
    head = snapshot(STACK)
    _apiserver(head, "--event-ttl=30m")
    [line] = _flags(head)
    assert line.level == MEDIUM and line.rule == control_flags.EVENT_TTL_LOWERED_RULE
    assert "30 min" in line.summary and "kubectl describe" in line.summary


def test_event_ttl_at_its_default_spelled_out_is_the_generic_line_only() -> None:
    head = snapshot(STACK)
    _apiserver(head, "--event-ttl=1h0m0s")
    [line] = _flags(head)
    assert line.rule == control_flags.CHANGED_RULE and "--event-ttl (unset) -> 1h0m0s" in line.summary


def test_a_small_stack_raising_the_ttl_is_medium() -> None:
    head = snapshot("local")
    _apiserver(head, "--event-ttl=24h")
    [line] = _flags(head, "local")
    assert line.rule == control_flags.EVENT_TTL_RAISED_RULE and line.level == MEDIUM


def test_the_event_size_is_a_kubelet_event_measured() -> None:
    """EVENT_OBJECT_BYTES is this Event's compact JSON, as the catalogue's objects are measured."""
    pod = "train-llm-worker-1234-7f9c4d8b6-x2k9p"
    node = "research-7500-a100-ib-000000"
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{pod}.17f3a9c2b1d4e5f6", "namespace": "team-language",
                     "uid": "0b7e2c1a-3f4d-4e5a-9b8c-7d6e5f4a3b2c", "resourceVersion": "123456789",
                     "creationTimestamp": "2026-01-15T10:00:00Z",
                     "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                                        "time": "2026-01-15T10:00:00Z", "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:count": {}, "f:firstTimestamp": {}, "f:involvedObject": {},
                                                     "f:lastTimestamp": {}, "f:message": {}, "f:reason": {},
                                                     "f:reportingComponent": {}, "f:reportingInstance": {},
                                                     "f:source": {"f:component": {}, "f:host": {}},
                                                     "f:type": {}}}]},
        "involvedObject": {"kind": "Pod", "namespace": "team-language", "name": pod,
                           "uid": "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d", "apiVersion": "v1",
                           "resourceVersion": "123456000", "fieldPath": "spec.containers{worker}"},
        "reason": "Pulled",
        "message": 'Successfully pulled image "registry.example/research/train:2026.01.15-abcdef0" in 1m2.345s '
                   "(1m2.345s including waiting). Image size: 21474836480 bytes.",
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": "2026-01-15T10:00:00Z", "lastTimestamp": "2026-01-15T10:00:00Z", "count": 1,
        "type": "Normal", "eventTime": None, "reportingComponent": "kubelet", "reportingInstance": node,
    }
    assert len(json.dumps(event, separators=(",", ":"))) == control_flags.EVENT_OBJECT_BYTES


def _corefile(head: dict[str, Any], old: str, new: str) -> None:
    for r in head["resources"]:
        data = (r.get("inputs") or {}).get("data") or {}
        if r["type"] == coredns.CONFIGMAP and coredns.KEY in data:
            assert old in data[coredns.KEY]
            data[coredns.KEY] = data[coredns.KEY].replace(old, new)
            return
    raise AssertionError("no Corefile")


def _dns(head: dict[str, Any], base: dict[str, Any] | None = None) -> list[Finding]:
    return coredns.upstream_off_azure(compare_stack(STACK, base or snapshot(STACK), head))


def test_forward_to_public_resolvers_is_medium_without_private_endpoints() -> None:
    head = snapshot(STACK)
    _corefile(head, "forward . /etc/resolv.conf", "forward . 8.8.8.8 1.1.1.1")
    [line] = _dns(head)
    assert line.level == MEDIUM and line.rule == coredns.UPSTREAM_RULE
    assert "`forward . /etc/resolv.conf` -> `forward . 8.8.8.8 1.1.1.1`" in line.summary
    assert "168.63.129.16" in line.summary and "NAT gateways (5 in this stack)" in line.summary
    assert "no private endpoint" in line.summary and "keep `forward . /etc/resolv.conf`" in line.summary.lower()
    rules = {f.rule for f in coredns.assess(compare_stack(STACK, snapshot(STACK), head))}
    assert rules == {"corefile-reloaded", coredns.UPSTREAM_RULE}


def test_forward_off_azure_is_high_where_the_stack_has_a_private_endpoint() -> None:
    head = snapshot(STACK)
    _corefile(head, "forward . /etc/resolv.conf", "forward . tls://1.1.1.1")
    head["resources"].append({"type": "azure-native:network:PrivateEndpoint", "name": "registry-pe", "parent": None,
                              "protect": False, "custom": True, "inputs": {}})
    [line] = _dns(head)
    assert line.level == HIGH and "azure-native:network:PrivateEndpoint" in line.summary


@pytest.mark.parametrize("new", ["forward . 168.63.129.16", "forward . dns://168.63.129.16:53 8.8.8.8",
                                 "forward . /etc/resolv.conf 8.8.8.8"])
def test_upstreams_still_through_azure_dns_say_nothing(new: str) -> None:
    head = snapshot(STACK)
    _corefile(head, "forward . /etc/resolv.conf", new)
    assert _dns(head) == []


def test_a_zone_forwarded_elsewhere_beside_the_root_says_nothing() -> None:
    head = snapshot(STACK)
    _corefile(head, "forward . /etc/resolv.conf", "forward example.org 8.8.8.8\n    forward . /etc/resolv.conf")
    assert _dns(head) == []


def test_the_corefile_parser() -> None:
    text = ".:53 {\n  errors # a comment\n  forward . /etc/resolv.conf {\n    max_concurrent 1000\n  }\n}\n" \
           "example.org:53 {\n  forward . 8.8.8.8\n}\n"
    assert coredns.forwards(text) == {(".:53", "."): ("/etc/resolv.conf",), ("example.org:53", "."): ("8.8.8.8",)}


def test_the_shipped_stacks_unchanged_give_nothing() -> None:
    for stack in ("local", "research-2500", "research-7500"):
        same = compare_stack(stack, snapshot(stack), snapshot(stack))
        assert control_flags.assess(same) == []
        assert coredns.assess(same) == []
