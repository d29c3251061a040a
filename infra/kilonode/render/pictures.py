"""Pictures of the plan (`kilonode explain STACK --html PATH`, issue 40): one self-contained HTML
page of inline SVG drawings, every figure taken from the plan.

- the address space: the VNet and its subnets to scale along the address range, each with its
  CIDR, purpose and fill (addresses the plan gives out against the subnet's size);
- the scale sets: each pool a row of its scale sets (each one InfiniBand fabric where the pool
  has InfiniBand), teams' scale sets coloured, autoscaled bounds written beside the pool;
- the join waves of a first `pulumi up` over time (kilonode.plan.resolve.joins.schedule, the
  same timeline `kilonode explain` and preflight's scheduling check read);
- budgets against their limits, one bar each, the limit's source in the bar's <title> (what a
  browser shows as a tooltip).

Pure: a plan in, text out. Every element is built as data (xml.etree.ElementTree) and
serialised by the standard library, which escapes text and attributes; no string is pasted into
markup. The page names nothing outside itself (no script, font, stylesheet or image by URL):
it opens offline and from a file.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from kilonode.plan import defaults
from kilonode.plan.model import ClusterPlan, NodePoolPlan
from kilonode.plan.resolve.joins import schedule

WIDTH = 960  # drawing width in user units (CSS pixels at 100 %)
LEFT = 20
ROW = 22
BAR_WIDTH = 420  # the budget bars' full length (the limit)
BOX = 30  # a scale set's box side
BOXES_PER_LINE = 28
# fills: free room, used room, a team's scale sets (cycled), shared ones, over a limit
FREE, USED, SHARED, OVER = "#e8e8e8", "#4a7bb7", "#9db8d9", "#c0392b"
TEAM_FILLS = ("#e39b3b", "#5aa469", "#a569bd", "#d35d6e", "#3ba6a0", "#8d6e63")

CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
svg { display: block; margin: 8px 0; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg text.small { font-size: 10px; }
"""


@dataclass(frozen=True)
class SubnetFill:
    """One subnet of the VNet: what it is for and how many of its addresses the plan gives out."""

    key: str  # control-plane, etcd, pool-<name> (the NAT gateways' subnet keys)
    cidr: IPv4Network
    purpose: str
    used: int


@dataclass(frozen=True)
class Bar:
    """One budget against its limit."""

    name: str
    used: int
    limit: int
    source: str
    hard: bool


def _el(tag: str, attrs: dict[str, object] | None = None, text: str | None = None,
        title: str | None = None) -> ET.Element:
    """An element with its attributes as text; `title` becomes a <title> child (SVG's tooltip)."""
    element = ET.Element(tag, {k: str(v) for k, v in (attrs or {}).items()})
    if title is not None:
        ET.SubElement(element, "title").text = title
        element[-1].tail = text
    else:
        element.text = text
    return element


def _svg(name: str, height: int, children: Iterable[ET.Element], label: str) -> ET.Element:
    # no xmlns: the HTML parser puts <svg> and its children in the SVG namespace itself (HTML Living
    # Standard, "parsing main inforeign": an <svg> start tag in HTML content), so the page holds no URL at all
    svg = _el("svg", {"id": name, "width": WIDTH + 2 * LEFT, "height": height,
                      "viewBox": f"0 0 {WIDTH + 2 * LEFT} {height}", "role": "img", "aria-label": label})
    svg.extend(children)
    return svg


def pool_ceiling(pool: NodePoolPlan) -> int:
    """The most nodes the pool may have: the autoscaler's ceiling, or its nodes."""
    return pool.autoscaling.max_nodes if pool.autoscaling else pool.nodes


def subnet_fills(plan: ClusterPlan) -> list[SubnetFill]:
    """Every subnet in address order: the control plane's (apiservers and the internal load
    balancer's frontend), etcd's (every member), each pool's (one NIC per node at its ceiling,
    each NIC with 1 + podsPerNode IP configurations: Azure CNI gives pods the node subnet's
    addresses, so a pool's nodes and pods share one subnet)."""
    net = plan.network
    static: list[IPv4Address] = [m.ip for c in plan.etcd_clusters for m in c.members]
    static += [i.ip for i in plan.control_plane.instances] + [plan.control_plane.load_balancer_ip]
    fills = [
        SubnetFill("control-plane", net.control_plane_subnet, "control plane: apiservers, internal load balancer",
                   sum(ip in net.control_plane_subnet for ip in static)),
        SubnetFill("etcd", net.etcd_subnet, "etcd: " + ", ".join(f"{c.role} ×{len(c.members)}"
                                                                 for c in plan.etcd_clusters),
                   sum(ip in net.etcd_subnet for ip in static)),
    ]
    fills += [SubnetFill(f"pool-{p.name}", p.subnet,
                         f"pool {p.name}: {pool_ceiling(p):,} nodes × {p.ip_configs_per_nic} IPs "
                         f"(node + {p.pods_per_node} pods)", pool_ceiling(p) * p.ip_configs_per_nic)
              for p in plan.node_pools]
    return sorted(fills, key=lambda f: int(f.cidr.network_address))


def _x(vnet: IPv4Network, address: int) -> float:
    return LEFT + (address - int(vnet.network_address)) / vnet.num_addresses * WIDTH


def address_space(plan: ClusterPlan) -> ET.Element:
    """The VNet as one strip, its subnets to scale on it; below, one label row per subnet with a
    leader line to where it lies and its fill as a bar."""
    vnet = plan.network.vnet_cidr
    fills = subnet_fills(plan)
    top, strip = 30, 36
    items = [_el("text", {"x": LEFT, "y": 20}, f"VNet {vnet}: {vnet.num_addresses:,} addresses"),
             _el("rect", {"class": "vnet", "x": LEFT, "y": top, "width": WIDTH, "height": strip, "fill": FREE},
                 title=f"VNet {vnet}: addresses no subnet holds are free")]
    for row, fill in enumerate(fills):
        start = int(fill.cidr.network_address)
        x0, x1 = _x(vnet, start), _x(vnet, start + fill.cidr.num_addresses)
        share = min(1.0, fill.used / fill.cidr.num_addresses)
        note = f"{fill.cidr} — {fill.purpose}: {fill.used:,} of {fill.cidr.num_addresses:,} addresses"
        items.append(_el("rect", {"class": "subnet", "data-cidr": str(fill.cidr), "x": f"{x0:.2f}", "y": top,
                                  "width": f"{max(x1 - x0, 0.5):.2f}", "height": strip, "fill": SHARED,
                                  "stroke": USED, "stroke-width": 0.5}, title=note))
        items.append(_el("rect", {"x": f"{x0:.2f}", "y": top + strip * (1 - share), "width": f"{max(x1 - x0, 0.5):.2f}",
                                  "height": f"{strip * share:.2f}", "fill": USED}, title=note))
        y = top + strip + 30 + row * ROW
        items.append(_el("line", {"x1": f"{(x0 + x1) / 2:.2f}", "y1": top + strip, "x2": LEFT + 4, "y2": y - 4,
                                  "stroke": "#999", "stroke-width": 0.5}))
        items += _fill_bar(LEFT + 8, y - 10, share)
        items.append(_el("text", {"class": "cidr", "x": LEFT + 96, "y": y}, str(fill.cidr)))
        items.append(_el("text", {"x": LEFT + 210, "y": y},
                         f"{fill.purpose} — {fill.used:,} / {fill.cidr.num_addresses:,} ({100 * share:.1f} %)"))
    return _svg("address-space", top + strip + 40 + len(fills) * ROW, items, "the VNet's address space")


def _fill_bar(x: float, y: float, share: float) -> list[ET.Element]:
    return [_el("rect", {"x": x, "y": y, "width": 80, "height": 12, "fill": FREE}),
            _el("rect", {"x": x, "y": y, "width": f"{80 * share:.2f}", "height": 12, "fill": USED})]


def _team_fills(plan: ClusterPlan) -> dict[str, str]:
    return {team.name: TEAM_FILLS[i % len(TEAM_FILLS)] for i, team in enumerate(plan.teams)}


def _pool_heading(pool: NodePoolPlan) -> str:
    fabric = (f"InfiniBand: one fabric per scale set (≤ {pool.max_vms_per_scale_set} VMs)"
              if pool.infiniband else f"no InfiniBand, ≤ {pool.max_vms_per_scale_set} VMs per scale set")
    scaling = pool.autoscaling
    bounds = f"autoscaled {scaling.min_nodes:,}–{scaling.max_nodes:,} nodes" if scaling else "fixed"
    return f"pool {pool.name}: {pool.nodes:,} × {pool.vm_size}, {bounds}, {len(pool.shards)} scale set(s); {fabric}"


def scale_sets(plan: ClusterPlan) -> ET.Element:
    """Each pool a heading and its scale sets as boxes, BOXES_PER_LINE to a line; a box's height
    shows its capacity against the pool's per-scale-set limit, its colour its team."""
    colours = _team_fills(plan)
    items: list[ET.Element] = []
    y = 8
    for pool in plan.node_pools:
        y += 16
        items.append(_el("text", {"class": "pool", "x": LEFT, "y": y}, _pool_heading(pool)))
        y += 6
        groups = {g.shard: g for g in (pool.autoscaling.node_groups if pool.autoscaling else ())}
        for i, shard in enumerate(pool.shards):
            line, col = divmod(i, BOXES_PER_LINE)
            x, top = LEFT + col * (BOX + 4), y + line * (BOX + 4)
            group = groups.get(shard.name)
            tip = (f"{shard.name}: {shard.capacity} VMs, zone {shard.zone}"
                   + (", one InfiniBand fabric" if pool.infiniband else "")
                   + (f", team {shard.team}" if shard.team else ", shared")
                   + (f", autoscaled {group.min_size}–{group.max_size}" if group else ""))
            share = min(1.0, shard.capacity / pool.max_vms_per_scale_set)
            fill = colours.get(shard.team or "", SHARED)
            items.append(_el("rect", {"class": "scale-set", "data-team": shard.team or "", "x": x, "y": top,
                                      "width": BOX, "height": BOX, "fill": FREE, "stroke": fill}, title=tip))
            items.append(_el("rect", {"x": x, "y": f"{top + BOX * (1 - share):.2f}", "width": BOX,
                                      "height": f"{BOX * share:.2f}", "fill": fill}, title=tip))
            items.append(_el("text", {"class": "small", "x": x + 3, "y": top + 12}, f"{shard.index:03d}"))
        y += math.ceil(len(pool.shards) / BOXES_PER_LINE) * (BOX + 4)
    y += 10
    for i, (team, colour) in enumerate([*colours.items(), ("shared", SHARED)]):
        items.append(_el("rect", {"x": LEFT + i * 150, "y": y, "width": 12, "height": 12, "fill": colour}))
        items.append(_el("text", {"x": LEFT + i * 150 + 16, "y": y + 11}, f"team {team}" if team != "shared"
                         else "shared (no team)"))
    return _svg("scale-sets", y + 24, items, "the scale sets of each pool")


def wave_rows(plan: ClusterPlan) -> list[tuple[int, int, int, tuple[str, ...]]]:
    """(start s, created s, nodes, scale sets) of each wave of a first `pulumi up`: the plan's
    waves and gaps through the schedule kilonode.plan.resolve.joins runs (each scale set assumed
    to take SCALE_SET_CREATE_MIN to create)."""
    joins = plan.components.joins
    capacity = {s.name: s.capacity for p in plan.node_pools for s in p.shards}
    runs = schedule(joins.wave_gaps_s, [defaults.SCALE_SET_CREATE_MIN * 60] * len(joins.waves),
                    joins.in_flight_waves)
    return [(start, end, sum(capacity[n] for n in wave), wave)
            for (start, end), wave in zip(runs, joins.waves, strict=True)]


def join_waves(plan: ClusterPlan) -> ET.Element:
    """A Gantt chart: one row per wave, created (dark) then booting to Ready (light), against
    minutes since the first wave could start; a line where the plan says the last node is Ready."""
    joins = plan.components.joins
    rows = wave_rows(plan)
    ready_s = defaults.NODE_READY_MIN * 60
    span = max(joins.bring_up_min * 60, max((end + ready_s for _, end, _, _ in rows), default=60))
    label_w = 300
    scale = (WIDTH - label_w) / span
    items = [_el("text", {"x": LEFT, "y": 16},
                 f"{len(rows)} wave(s), ≤ {joins.wave_nodes} nodes each, {joins.in_flight_waves} in flight at most; "
                 f"sized for {joins.sized_for_per_min} nodes/min. Dark: created (~{defaults.SCALE_SET_CREATE_MIN} min "
                 f"assumed); light: to Ready ({defaults.NODE_READY_MIN} min); red: the last node Ready")]
    for k, (start, end, nodes, wave) in enumerate(rows):
        y = 28 + k * 18
        first, last = (name.removeprefix(f"{plan.cluster}-") for name in (wave[0], wave[-1]))
        items.append(_el("text", {"class": "small", "x": LEFT, "y": y + 11},
                         f"wave {k}: {nodes:,} nodes, {first}" + (f"…{last} ({len(wave)})" if len(wave) > 1 else "")))
        tip = (f"wave {k}: {len(wave)} scale set(s), {nodes:,} nodes; starts {start / 60:.0f} min, created "
               f"{end / 60:.0f} min, Ready {(end + ready_s) / 60:.0f} min: " + ", ".join(wave))
        x = LEFT + label_w + start * scale
        items.append(_el("rect", {"class": "wave", "x": f"{x:.2f}", "y": y, "width": f"{(end - start) * scale:.2f}",
                                  "height": 14, "fill": USED}, title=tip))
        items.append(_el("rect", {"x": f"{LEFT + label_w + end * scale:.2f}", "y": y,
                                  "width": f"{ready_s * scale:.2f}", "height": 14, "fill": SHARED}, title=tip))
    bottom = 28 + len(rows) * 18
    items += _time_axis(LEFT + label_w, bottom, scale, span)
    done = LEFT + label_w + joins.bring_up_min * 60 * scale
    items.append(_el("line", {"x1": f"{done:.2f}", "y1": 24, "x2": f"{done:.2f}", "y2": bottom, "stroke": OVER},
                     title=f"the last node Ready: {joins.bring_up_min} min (plan.components.joins.bring_up_min)"))
    return _svg("join-waves", bottom + 34, items, "the join waves of a first pulumi up")


def _time_axis(x0: float, y: float, scale: float, span: int) -> list[ET.Element]:
    """Ticks every 5, 10 or 30 minutes, whichever gives at most about a dozen."""
    minutes = span / 60
    step = next((s for s in (5, 10, 30, 60) if minutes / s <= 12), 120)
    items = [_el("line", {"x1": x0, "y1": y, "x2": f"{x0 + span * scale:.2f}", "y2": y, "stroke": "#555"})]
    for tick in range(0, int(minutes) + 1, step):
        x = x0 + tick * 60 * scale
        items.append(_el("line", {"x1": f"{x:.2f}", "y1": y, "x2": f"{x:.2f}", "y2": y + 4, "stroke": "#555"}))
        items.append(_el("text", {"class": "small", "x": f"{x - 8:.2f}", "y": y + 16}, f"{tick} min"))
    return items


def budget_bars(plan: ClusterPlan) -> list[Bar]:
    """Every budget the plan checks: its own list (plan.budgets), then each pool subnet's
    addresses, each NAT gateway's SNAT ports per machine against the stack's floor, the
    Prometheus pod's memory against what its VM leaves it, and the nodes a first `pulumi up`
    admits per minute against what the apiservers' join seats serve."""
    bars = [Bar(b.name, b.used, b.limit, b.source, b.hard) for b in plan.budgets]
    bars += [Bar(f"subnet {f.key} addresses", f.used, f.cidr.num_addresses,
                 f"{f.cidr}: {f.purpose}; the plan sizes it (kilonode.plan.resolve.network), Azure keeps a few "
                 "addresses of every subnet for itself", True)
             for f in subnet_fills(plan) if f.key.startswith("pool-")]
    bars += [Bar(f"NAT {g.name}: SNAT port floor per machine", g.min_ports_per_node, g.ports_per_node,
                 f"{g.public_ips} public IPs (/{g.prefix_length} prefix) × Azure's SNAT ports per IP, shared by "
                 f"{g.nodes:,} machines (NatGatewayPlan.ports_per_node), against network.minSnatPortsPerNode", True)
             for g in plan.network.nat_gateways]
    bars += _prometheus_bar(plan)
    joins = plan.components.joins
    bars.append(Bar("node joins/min admitted on a first pulumi up", joins.admitted_per_min, joins.sized_for_per_min,
                    f"the apiservers' join seats (--max-requests-inflight "
                    f"{plan.components.apiserver_max_requests_inflight} + --max-mutating-requests-inflight "
                    f"{plan.components.apiserver_max_mutating_requests_inflight}): {joins.reason}", False))
    return bars


def _prometheus_bar(plan: ClusterPlan) -> list[Bar]:
    """The Prometheus pod's memory (request = limit) against the share of its VM the plan lets it
    take (kilonode.plan.resolve.monitoring _fits), where the VM size is in the catalogue."""
    prom = plan.prometheus
    pool = next((p for p in plan.node_pools if prom is not None and p.name == prom.pool), None)
    if prom is None or pool is None or pool.memory_gib is None:
        return []
    room = math.floor(pool.memory_gib * defaults.PROMETHEUS_VM_MEMORY_PERCENT / 100)
    return [Bar("Prometheus memory (GiB)", prom.memory_gib, room,
                f"head {prom.head_bytes / 1024**3:.1f} GiB + margin + queries = {prom.memory_gib} GiB, against "
                f"{defaults.PROMETHEUS_VM_MEMORY_PERCENT}% of {pool.vm_size}'s {pool.memory_gib} GiB "
                "(kilonode.plan.resolve.monitoring)", True)]


def budgets(plan: ClusterPlan) -> ET.Element:
    """One bar per budget: its full length the limit, its fill the use (red past the limit, the
    bar then drawn full with the overflow written), the source as the tooltip."""
    items: list[ET.Element] = []
    x_bar = LEFT + 300
    for row, bar in enumerate(budget_bars(plan)):
        y = 8 + row * ROW
        share = bar.used / bar.limit if bar.limit else math.inf
        fill = OVER if share > 1 else USED
        tip = f"{bar.name}: {bar.used:,} of {bar.limit:,}{'' if bar.hard else ' (soft)'} — {bar.source}"
        items.append(_el("text", {"class": "small", "x": LEFT, "y": y + 12}, bar.name))
        items.append(_el("rect", {"class": "budget-bar", "data-name": bar.name, "x": x_bar, "y": y,
                                  "width": BAR_WIDTH, "height": 14, "fill": FREE}, title=tip))
        items.append(_el("rect", {"x": x_bar, "y": y, "width": f"{BAR_WIDTH * min(1.0, share):.2f}", "height": 14,
                                  "fill": fill}, title=tip))
        items.append(_el("text", {"class": "small", "x": x_bar + BAR_WIDTH + 6, "y": y + 12},
                         f"{bar.used:,} / {bar.limit:,} ({100 * share:.1f} %)" + ("" if bar.hard else " soft")))
    return _svg("budgets", 16 + len(budget_bars(plan)) * ROW, items, "budgets against their limits")


DRAWINGS = (
    ("address-space", "The address space", address_space),
    ("scale-sets", "Scale sets and their InfiniBand fabrics", scale_sets),
    ("join-waves", "Join waves of a first pulumi up", join_waves),
    ("budgets", "Budgets against their limits (hover a bar for the limit's source)", budgets),
)


def page(plan: ClusterPlan, source: str) -> str:
    """The whole page: a heading, then each drawing under its own heading. `source` names the
    stack file the plan came from (shown, never fetched)."""
    html = ET.Element("html", {"lang": "en"})
    head = ET.SubElement(html, "head")
    ET.SubElement(head, "meta", {"charset": "utf-8"})
    # the browser fetches nothing for it even if an external reference crept in: no source but
    # the inline styles is allowed (CSP Level 3 §6.1.3 default-src; <meta> delivery, §4.3)
    ET.SubElement(head, "meta", {"http-equiv": "Content-Security-Policy", "content": CSP})
    ET.SubElement(head, "title").text = f"kilonode explain {plan.cluster}"
    ET.SubElement(head, "style").text = STYLE
    body = ET.SubElement(html, "body")
    ET.SubElement(body, "h1").text = (f"{plan.cluster} ({source}): {plan.total_nodes:,} nodes, Kubernetes "
                                      f"{plan.kubernetes_version}, {plan.location}")
    for name, heading, draw in DRAWINGS:
        section = ET.SubElement(body, "section", {"id": f"section-{name}"})
        ET.SubElement(section, "h2").text = heading
        section.append(draw(plan))
    return "<!DOCTYPE html>\n" + ET.tostring(html, encoding="unicode", method="html") + "\n"
