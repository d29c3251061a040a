"""collector-narrowed: node-exporter's own flags narrowing away the devices (or the collectors) the alerts read.

From the eighteenth independent trace on research-7500 (PR 3): `--collector.infiniband.device-include` narrowed to
`^mlx5_ib[0-9]+$`, the naming of Azure's HPC images, on kilonode's image, whose HCAs rdma-core names `ib*`
(kilonode.plan.defaults.exporters NODE_EXPORTER_FLAGS says why its own filter takes both namings). The review saw a
DaemonSet rollout; every node_infiniband_* series went from both InfiniBand pools, and every InfiniBand alert with
it. What node-exporter does with its flags (prometheus/node_exporter@v1.12.1, the version the catalogue pins):

- a device filter: collector/device_filter.go l.25-41, `ignored` is true where the exclude pattern matches or the
  include pattern does not, each Go regexp.MatchString (unanchored: a pattern anchors itself with ^...$); the
  InfiniBand collector skips an ignored device before reading any of its ports (collector/infiniband_linux.go
  l.145, l.171), so none of its series exist;
- the collectors: each registers `--collector.<name>` with its default state (collector/collector.go l.59-74;
  meminfo, loadavg, pressure, diskstats, filesystem, netdev, infiniband, conntrack are all defaultEnabled at
  v1.12.1: meminfo.go l.30, loadavg.go l.31, pressure_linux.go l.54, diskstats_linux.go, filesystem_common.go
  l.95, netdev_common.go l.50, infiniband_linux.go l.44, conntrack_linux.go l.44); `--no-collector.<name>` turns
  one off, and `--collector.disable-defaults` turns off every one not named on the command line
  (DisableDefaultCollectors, l.83-91).

Judged on the node-exporter DaemonSet's container args at each side, against device names of kilonode's node image
(IMAGE_DEVICES), for the collectors whose metrics an alert rule reads: where the base collected some of those
devices and the head collects none (or the collector is off), the series go from every node the DaemonSet runs on
(InfiniBand: the pools with InfiniBand links), high where an alert reads them; where the head collects only some
of the forms the base did, medium. A pattern Python's `re` does not read as Go's RE2 would is not judged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from kilonode.review import alerting, placement
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

DAEMONSET = "kubernetes:apps/v1:DaemonSet"
_IMAGE = "node-exporter"

# collector -> the metric-name prefix of its series (collector/<name>*.go at v1.12.1: namespace "node" and the
# collector's subsystem)
COLLECTOR_METRICS: dict[str, str] = {
    "meminfo": "node_memory_", "loadavg": "node_load", "pressure": "node_pressure_", "diskstats": "node_disk_",
    "filesystem": "node_filesystem_", "netdev": "node_network_", "infiniband": "node_infiniband_",
    "conntrack": "node_nf_conntrack_",
}
DEFAULT_ENABLED = frozenset(COLLECTOR_METRICS)  # every one above is defaultEnabled at v1.12.1

# collector -> (an example device name of each naming form kilonode's node image gives; whose nodes have them)
# InfiniBand: Debian's rdma-core 44.0 (node-image/packages/infiniband.txt) renames each HCA by its udev rule
# 60-rdma-persistent-naming.rules, `rdma_rename %k NAME_FALLBACK`: an InfiniBand link layer takes "ib" with the
# onboard index, the slot, or the PCI path (ibo<n>, ibs<n>, ibp<bus>s<slot>, ibP<domain>p<bus>s<slot>;
# linux-rdma/rdma-core kernel-boot/rdma_rename.c), which is why kilonode's own filter (NODE_EXPORTER_FLAGS) takes
# `ib[osSpP][0-9].*` beside Azure HPC images' mlx5_ib<n>. netdev: the Azure VM's synthetic NIC, eth0.
IB_POOLS = "infiniband"
IMAGE_DEVICES: dict[str, tuple[tuple[str, ...], str]] = {
    "infiniband": (("ibo0", "ibs1", "ibp24s0", "ibP257p0s0"), IB_POOLS),
    "netdev": (("eth0",), "all"),
}


def _args(container: Mapping[str, Any]) -> list[str]:
    """The command line as kingpin reads it: `--flag=value` and `--flag value` both to `--flag=value`."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    found: list[str] = []
    for i, word in enumerate(words):
        if word.startswith("--") and "=" not in word and (word.endswith("-include") or word.endswith("-exclude")) \
                and i + 1 < len(words):
            found.append(f"{word}={words[i + 1]}")
        else:
            found.append(word)
    return found


def _container(entry: Mapping[str, Any] | None) -> tuple[str, str, Mapping[str, Any]] | None:
    for r in (entry or {}).get("resources") or []:
        if not isinstance(r, Mapping) or r.get("type") != DAEMONSET:
            continue
        inputs = r.get("inputs") or {}
        pod = (((inputs.get("spec") or {}).get("template") or {}).get("spec") or {})
        for c in pod.get("containers") or []:
            if _IMAGE in str(c.get("image") or ""):
                meta = inputs.get("metadata") or {}
                return str(meta.get("namespace") or "default"), str(meta.get("name")), c
    return None


def enabled(args: Sequence[str]) -> set[str]:
    """The collectors (of COLLECTOR_METRICS) node-exporter runs with these args."""
    on = set() if "--collector.disable-defaults" in args else set(DEFAULT_ENABLED)
    for word in args:
        name = word.split("=", 1)[0]
        if name.startswith("--no-collector.") and name.count(".") == 1:
            on.discard(name.removeprefix("--no-collector."))
        elif name.startswith("--collector.") and name.count(".") == 1 and name != "--collector.disable-defaults":
            collector = name.removeprefix("--collector.")
            if collector in COLLECTOR_METRICS and word.partition("=")[2].lower() != "false":
                on.add(collector)
    return on


def collected(args: Sequence[str], collector: str, names: Sequence[str]) -> set[str] | None:
    """Which of `names` the collector reads with these args (its device filter, device_filter.go l.38-41); None
    where a pattern does not compile here."""
    if collector not in enabled(args):
        return set()
    values = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in args if "=" in w}
    include = values.get(f"--collector.{collector}.device-include", "")
    exclude = values.get(f"--collector.{collector}.device-exclude", "")
    try:
        accept = re.compile(include) if include else None
        ignore = re.compile(exclude) if exclude else None
    except re.error:
        return None
    return {n for n in names if not ((ignore and ignore.search(n)) or (accept and not accept.search(n)))}


def _where(diff: StackDiff, namespace: str, name: str, scope: str) -> str:
    """The nodes that lose the series: the DaemonSet's nodes by pool (preflight's placement model), the InfiniBand
    pools' only for the InfiniBand collector."""
    ib = {str(p.get("name")) for p in plan_of(diff.head).get("nodePools") or []
          if isinstance(p, Mapping) and p.get("infinibandLinks")}
    roles = placement.daemonset_nodes(diff, namespace, name)
    if roles is None:
        return f"the InfiniBand pools ({', '.join(sorted(ib))})" if scope == IB_POOLS else "every node"
    pools: dict[str, int] = {}
    for role, count in roles.items():
        pool = role.split(".", 1)[0].removeprefix("pool-") if role.startswith("pool-") else role
        if scope != IB_POOLS or pool in ib:
            pools[pool] = pools.get(pool, 0) + count
    return f"{sum(pools.values()):,} nodes (" + ", ".join(f"{p} {n:,}" for p, n in sorted(pools.items())) + ")"


def _alerts(entry: Mapping[str, Any] | None, prefix: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The alerts reading the prefix's series (through recording rules), and those of them that would fire instead
    (the series on the right of an `unless`, or inside absent(): the expression returns a series when they are
    gone)."""
    rules = alerting.alert_rules(entry)
    reads = alerting._per_alert(rules, lambda expr: {m for m in alerting.metric_names(expr) if m.startswith(prefix)})
    severities = sorted({alerting._severity(r) for r in rules if str(r.get("alert")) in reads})
    inverted = sorted({str(r["alert"]) for r in rules if str(r.get("alert")) in reads
                       and _inverts(str(r["expr"]), prefix)})
    return severities, inverted


def _inverts(expr: str, prefix: str) -> bool:
    text = expr.replace(" ", "")
    return prefix in text.split("unless", 1)[1] if "unless" in text else f"absent({prefix}" in text


def narrowed(diff: StackDiff) -> list[Finding]:
    base, head = _container(diff.base), _container(diff.head)
    if base is None or head is None:
        return []
    namespace, name, _ = base
    before, after = _args(base[2]), _args(head[2])
    if before == after:
        return []
    found = []
    for collector, prefix in COLLECTOR_METRICS.items():
        names, scope = IMAGE_DEVICES.get(collector, ((), "all"))
        if names:
            was, now = collected(before, collector, names), collected(after, collector, names)
            if was is None or now is None or not was or now >= was:
                continue
        elif collector not in enabled(before) or collector in enabled(after):
            continue
        else:
            was, now = {"(all)"}, set()
        severities, inverted = _alerts(diff.head, prefix)
        if not severities:
            continue
        off = collector not in enabled(after)
        why = (f"node-exporter's {collector} collector is off at the head (--no-collector.{collector}, or "
               "--collector.disable-defaults without it: collector/collector.go l.59-91, as pinned)") if off else (
               f"node-exporter's --collector.{collector}.device-include/exclude at the head no longer matches "
               + ("any" if not now else "some") + " of the device names kilonode's node image gives (an example of "
               f"each form: {', '.join(sorted(was - now))}"
               + (": rdma-core's persistent naming, kilonode.plan.defaults.exporters NODE_EXPORTER_FLAGS"
                  if collector == "infiniband" else "") + "), and the collector skips a filtered device before "
               "reading it (prometheus/node_exporter collector/device_filter.go l.38-41 as pinned, Go's unanchored "
               "MatchString)")
        whole = off or not now
        blind = {(a, sev) for a, sev in severities if not (whole and a in inverted)} or set(severities)
        fires = (f"; {', '.join(inverted)} read{'s' if len(inverted) == 1 else ''} them through `unless`/absent and "
                 "fires instead, on every one of those nodes") if inverted and whole else ""
        found.append(Finding(HIGH if whole else MEDIUM, "collector-narrowed", (
            f"{why}: " + ("every" if whole else f"on a node whose devices are named {', '.join(sorted(was - now))}"
                           " (the image names all of a node's one way), every") + f" {prefix}* series goes from "
            f"{_where(diff, namespace, name, scope)}, and {alerting._said(blind)} can no longer fire on "
            f"them{fires}. Keep the filter matching the image's names (kilonode's own: NODE_EXPORTER_FLAGS), or "
            "rewrite the alerts in the same change"),
            tuple(sorted({a for a, _ in severities})), cause=f"node-exporter {collector} narrowed"))
    return found
