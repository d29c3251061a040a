"""Fewer apiservers: the load each one that stays carries (a sixth independent trace of kilonode diff
on research-7500: apiserver.replicas 5 -> 3 was told as replace-stops and vms-deleted only).

What the others say is true (machines deleted, `pulumi up` stopping at a fixed name); what it leaves
out is where the removed servers' work goes:

- every node's agents (the kubelet, kube-proxy, the CNI and the device plugins) hold long-lived watches
  on one apiserver, reached through the load balancer; with fewer servers the same watches spread over
  fewer: nodes / apiservers each (7,504 / 5 = 1,501 -> 7,504 / 3 = 2,502, +67%), and with them each
  server's watch fan-out, memory and CPU;
- kilonode sizes each apiserver's --max-requests-inflight and --max-mutating-requests-inflight from the
  nodes per apiserver it plans for (kilonode.plan.resolve.components apiserver_inflight: the nodes over
  replicas - 1, so one server may be down, in brackets: 1,500 + kilonode's levels' share / 500 from 500
  nodes per server, 3,000 / 1,000 past 3,000); fewer servers move each one up a bracket, so each admits
  about twice the concurrent requests, and the total the apiservers may have in flight at once (servers x
  (reads + mutating): kube-apiserver's server concurrency limit, which APF divides among its levels,
  k8s.io/apiserver server_run_options.go) grows rather than shrinks: more concurrent reads that miss the
  watch cache, and writes, reach etcd at once.

Both limits are read from each side's rendered kube-apiserver units (kilonode.review.flowcontrol
server_limit), the node count from the plan. Medium, whenever the count of apiservers drops.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding
from kilonode.review.flowcontrol import apiservers, server_limit
from kilonode.review.lifecycle import plan_of


def _nodes(entry: Mapping[str, Any] | None) -> int:
    return sum(int(p.get("nodes") or 0) for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping))


def load(diff: StackDiff) -> list[Finding]:
    was, now = apiservers(diff.base), apiservers(diff.head)
    if not was or not now or now >= was:
        return []
    nodes = _nodes(diff.head) or _nodes(diff.base)
    share_was, share_now = nodes / was, nodes / now
    old, new = server_limit(diff.base), server_limit(diff.head)
    if old and new:
        flags = (f"each server's --max-requests-inflight {old[1]:,} -> {new[1]:,} and "
                 f"--max-mutating-requests-inflight {old[2]:,} -> {new[2]:,} (the plan sizes them from the nodes "
                 "per apiserver: kilonode.plan.resolve.components apiserver_inflight), so the total the apiservers "
                 f"may have in flight at once goes {was} x {old[0]:,} = {was * old[0]:,} -> {now} x {new[0]:,} = "
                 f"{now * new[0]:,}: more concurrent requests reach etcd, not fewer")
    else:
        flags = "the inflight limits were not found in the rendered kube-apiserver units"
        diff.note("apiserver-load: an apiserver's --max-requests-inflight was not found in the rendered units, so "
                  "the concurrency before and after was not compared")
    return [Finding(MEDIUM, "apiserver-load", (
        f"apiservers {was} -> {now}: the {now} that stay carry every node's watches (the kubelets, kube-proxy, "
        f"the node agents: {nodes:,} nodes, about {share_was:,.0f} -> {share_now:,.0f} per server, "
        f"+{share_now / share_was - 1:.0%} each) and every client the removed ones served; {flags}. Before "
        "removing any, check the apiservers' memory and CPU against that share (each watch is held in the "
        "server's memory) and etcd's load (request latency, its leader's CPU and disk); prefer resizing the "
        "apiservers up first and removing them in a later change, one at a time"),
        ("apiserver.replicas",), cause="apiserver.replicas")]


def assess(diff: StackDiff) -> list[Finding]:
    return load(diff)
