"""The pictures of the plan (kilonode.render.pictures, `kilonode explain --html`): each drawing's
structure against the plan of every shipped stack, and a page that names nothing outside itself.

The counts are checked against the plan's own fields and, where one exists, against a figure the
plan computes another way (the subnets' fills add up to the "VNet private IPs" budget, which
kilonode.plan.resolve.budgets counts from the config, not from the subnets)."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from ipaddress import IPv4Network
from pathlib import Path

import pytest

from kilonode.paths import REPO_ROOT
from kilonode.plan.model import ClusterPlan
from kilonode.render import pictures
from tests import shared

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


@pytest.fixture(params=shared.SHIPPED_STACKS)
def plan(request: pytest.FixtureRequest) -> ClusterPlan:
    return shared.plan(request.param)


def of_class(svg: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in svg.iter() if e.get("class") == name]


def plan_subnets(plan: ClusterPlan) -> set[str]:
    net = plan.network
    return {str(net.control_plane_subnet), str(net.etcd_subnet), *(str(p.subnet) for p in plan.node_pools)}


def test_every_subnet_is_drawn_once_inside_the_vnet_in_address_order_and_labelled(plan: ClusterPlan) -> None:
    svg = pictures.address_space(plan)
    rects = of_class(svg, "subnet")
    assert [r.get("data-cidr") for r in rects] == sorted(plan_subnets(plan), key=lambda c: IPv4Network(c)[0])
    strip = of_class(svg, "vnet")[0]
    left, right = float(strip.get("x", "")), float(strip.get("x", "")) + float(strip.get("width", ""))
    ends = [(float(r.get("x", "")), float(r.get("x", "")) + float(r.get("width", ""))) for r in rects]
    assert all(left <= x0 < x1 <= right + 0.01 for x0, x1 in ends)
    assert all(a[1] <= b[0] + 0.01 for a, b in itertools.pairwise(ends)), "subnets overlap"
    assert {t.text for t in of_class(svg, "cidr")} == plan_subnets(plan)


def test_subnet_widths_are_to_scale(plan: ClusterPlan) -> None:
    vnet = plan.network.vnet_cidr
    for rect in of_class(pictures.address_space(plan), "subnet"):
        size = 2 ** (32 - int(rect.get("data-cidr", "").split("/")[1]))
        assert float(rect.get("width", "")) == pytest.approx(max(0.5, size / vnet.num_addresses * pictures.WIDTH),
                                                             abs=0.01)


def test_the_subnets_fills_add_up_to_the_plans_vnet_budget(plan: ClusterPlan) -> None:
    vnet = next(b for b in plan.budgets if b.name == "VNet private IPs")
    fills = pictures.subnet_fills(plan)
    assert sum(f.used for f in fills) == vnet.used
    assert all(0 < f.used <= f.cidr.num_addresses for f in fills)


def test_one_box_per_scale_set_and_each_teams_boxes_are_its_shards(plan: ClusterPlan) -> None:
    svg = pictures.scale_sets(plan)
    boxes = of_class(svg, "scale-set")
    assert len(boxes) == sum(len(p.shards) for p in plan.node_pools)
    for team in plan.teams:
        assert sum(b.get("data-team") == team.name for b in boxes) == len(team.shards)
    headings = [t.text or "" for t in of_class(svg, "pool")]
    assert len(headings) == len(plan.node_pools)
    for pool, heading in zip(plan.node_pools, headings, strict=True):
        if pool.autoscaling:
            assert f"{pool.autoscaling.min_nodes:,}–{pool.autoscaling.max_nodes:,}" in heading
        assert ("InfiniBand: one fabric per scale set" in heading) == pool.infiniband


def test_one_bar_per_join_wave_holding_every_scale_set_in_time_order(plan: ClusterPlan) -> None:
    joins = plan.components.joins
    rows = pictures.wave_rows(plan)
    bars = of_class(pictures.join_waves(plan), "wave")
    assert len(bars) == len(rows) == len(joins.waves)
    assert sum(nodes for _, _, nodes, _ in rows) == sum(s.capacity for p in plan.node_pools for s in p.shards)
    starts = [float(b.get("x", "")) for b in bars]
    assert starts == sorted(starts)
    assert all(float(b.get("width", "")) > 0 for b in bars)
    assert max(end for _, end, _, _ in rows) <= joins.bring_up_min * 60


def test_every_budget_the_plan_checks_has_a_bar_with_its_source_as_tooltip(plan: ClusterPlan) -> None:
    bars = of_class(pictures.budgets(plan), "budget-bar")
    names = [b.get("data-name") for b in bars]
    assert names == [b.name for b in pictures.budget_bars(plan)]
    assert {b.name for b in plan.budgets} <= set(names)
    assert {f"subnet pool-{p.name} addresses" for p in plan.node_pools} <= set(names)
    assert len([n for n in names if n and n.startswith("NAT ")]) == len(plan.network.nat_gateways)
    sources = {b.name: b.source for b in plan.budgets}
    for bar in bars:
        title = bar.find("title")
        assert title is not None and title.text
        assert sources.get(bar.get("data-name", ""), "") in title.text


class References(HTMLParser):
    """Every attribute that could make a browser fetch something, and every <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.found.append("<script>")
        self.found += [f"{tag} {name}={value}" for name, value in attrs
                       if name in {"src", "href", "xlink:href", "srcset", "poster", "data", "action"}]


def test_the_page_references_nothing_outside_itself(plan: ClusterPlan) -> None:
    text = pictures.page(plan, "stack.yaml")
    parser = References()
    parser.feed(text)
    assert parser.found == []
    assert not re.search(r"https?://|url\(|@import", text)
    assert text.count("<svg") == len(pictures.DRAWINGS)


def test_text_from_outside_is_escaped() -> None:
    text = pictures.page(shared.plan("local"), '<script>alert("x")</script>.yaml')
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_explain_writes_the_page(tmp_path: Path) -> None:
    target = tmp_path / "local.html"
    result = subprocess.run([sys.executable, "-m", "kilonode", "explain", "local", "--html", str(target)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert target.read_text(encoding="utf-8") == pictures.page(shared.plan("local"), "stacks/Pulumi.local.yaml")
