"""The stacks the plan and render benchmarks scale research-7500 to (imported by bench_plan.py and
bench_render.py, which run with bench/ first on sys.path).

`scaled(nodes)` is research-7500 with `nodes` InfiniBand GPU nodes in place of its 7,500, all
else kept (control plane, teams, the system and monitoring pools), so that what grows is what a
bigger cluster grows: scale sets (one per 100 InfiniBand nodes), their role assignments and
join-wave timers. What has to change for the stack to validate at that size, and why:

- hostNetwork pods only (podsPerNode 0): Azure counts at most 65,536 private IPs in a VNet,
  and research-7500's 4 IPs a node would stop at about 16,000 nodes;
- a /15 address space, so /16- and /17-sized pool subnets align (the IP count stays capped),
  with the subnets left to the planner (the recorded ones are research-7500's sizes);
- 17 SNAT ports per node (16 IPs x 64,512 ports of one NAT gateway per pool subnet);
- the monitoring pool on Standard_E104ids_v5: the cluster's Prometheus needs more than the 14
  CPUs E16ds_v5 leaves it past about 9,000 nodes (47 at 30,000);
- pools of at most 15,000 nodes (more pools past 30,000: copies of the A100 pool). This once
  kept each pool's custom data under Azure's 64 KiB, when the fabric-label script named each
  scale set (~48 base64 bytes apiece); it names runs of them now and does not grow
  (kilonode.render.pool.fabric_script), and the cap stays so the figures stay comparable.

The largest such stack that validates is 24,900 nodes (whole scale sets of 100): at 25,000 the
cluster would be 25,017 VMs with its control plane, system and monitoring nodes, past the 25,000
VMs Azure allows per subscription and region (catalog limits.yaml vmsPerSubscriptionRegion).
Until that limit was known to the planner the variants went to 59,000 nodes; figures measured
at 30,000 and 59,000 are not comparable with these.

`many_pools(count)` is a stack of `count` small pools whose subnets are all unrecorded: what
the subnet planner places.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = "research-7500"
POOL_MAX_NODES = 15_000
LARGEST_VALID = 24_900  # nodes: see the module's docstring
MIDDLE = 15_000  # the other size timed between research-7500 and LARGEST_VALID


def base_document() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{BASE}.yaml").read_text())
    return document


def scaled_document(nodes: int, name: str) -> dict[str, Any]:
    """research-7500's stack document with `nodes` InfiniBand nodes (the module's docstring)."""
    document = base_document()
    cluster = document["config"]["kilonode:cluster"]
    cluster["name"] = name
    cluster["network"] = {"vnetCidr": "10.0.0.0/15", "minSnatPortsPerNode": 17}
    pools: list[dict[str, Any]] = cluster["nodePools"]
    [monitoring] = [p for p in pools if p.get("monitoring")]
    monitoring["vmSize"] = "Standard_E104ids_v5"
    infiniband = [p for p in pools if p.get("infiniband")]
    count = max(len(infiniband), math.ceil(nodes / POOL_MAX_NODES))
    for i in range(len(infiniband), count):
        extra = copy.deepcopy(infiniband[0]) | {"name": f"{infiniband[0]['name']}-{i}"}
        pools.insert(pools.index(infiniband[-1]) + 1, extra)
        infiniband.append(extra)
    each = nodes // count // 100 * 100  # whole scale sets of 100
    for i, pool in enumerate(infiniband):
        pool.update(nodes=nodes - each * (count - 1) if i == 0 else each, podsPerNode=0)
        pool.pop("subnet", None)
    return document


def scaled(nodes: int, directory: Path) -> Path:
    """A stack file of research-7500 with `nodes` InfiniBand nodes, written in `directory`."""
    name = f"scaled-{nodes}"
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(scaled_document(nodes, name), sort_keys=False))
    return path


def many_pools(count: int) -> dict[str, Any]:
    """A cluster value of `count` pools of 4 to 63 nodes with 0, 1 or 3 pod IPs each (subnets of
    /29 to /24, mixed, so first fit has gaps to search), none of them recorded; the first pool
    is the monitoring pool (one E16ds_v5) the cluster's Prometheus needs."""
    pools: list[dict[str, Any]] = [
        {"name": f"p{i}", "nodes": 4 + (i * 37) % 60, "podsPerNode": [0, 1, 3][i % 3],
         "vmSize": "Standard_D4ds_v5", "gpusPerNode": 0}
        for i in range(count)
    ]
    pools[0] |= {"nodes": 1, "vmSize": "Standard_E16ds_v5", "monitoring": True,
                 "taints": ["dedicated=monitoring:NoSchedule"]}
    return {"name": f"pools-{count}", "etcd": {"main": {"members": 5}, "events": {"members": 3}},
            "apiserver": {"replicas": 3}, "nodePools": pools,
            # required (kilonode.config.tokens): within the longest lifetime of whenever the bench runs
            "joinTokens": {"current": {"generation": 1, "expires": _token_expiry()}}}


def _token_expiry() -> str:
    from datetime import timedelta

    from kilonode.config import tokens

    return (tokens.now() + timedelta(days=tokens.JOIN_TOKEN_MAX_DAYS // 2)).strftime("%Y-%m-%dT00:00:00Z")


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write a bench's results (and print them); exit 1 when a case missed its target (`ok`
    false), so `make bench` fails on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))
    if not all(section.get("ok", True) for section in results.values() if isinstance(section, dict)):
        sys.exit(1)
