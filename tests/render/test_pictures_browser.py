"""What a person sees of research-7500's `kilonode explain --html` page, checked in headless
Chromium (Debian's `chromium`, .ci/debian-packages.txt): the page as laid out, not as written.

A copy of the page gets two test-only inline scripts (allowed by a nonce added to the page's own
Content-Security-Policy, which otherwise allows nothing but inline styles) that measure every
drawing after layout and write the figures into the DOM as JSON; `--dump-dom` returns them.
The first also records any CSP violation: an external reference the page tried to load. The
shipped page itself holds no script. Chromium runs offline (host resolution mapped to nothing,
no proxy, no background networking), in its own process group, bounded by TIMEOUT_S and stopped
by its PID's group if it runs past it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from kilonode.render import pictures
from tests import shared

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium")
TIMEOUT_S = 90
WINDOW = (1100, 1900)
NONCE = "kilonode-test"
# Chromium's switches (chrome/common/chrome_switches.cc, content/public/common/content_switches.cc):
# no DNS for any host, no proxy, none of the browser's own background fetches, a fresh profile.
OFFLINE = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-proxy-server",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-extensions", "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}"]

# first in <head>: a violation is reported as the parser meets the reference, before the body's end
LISTEN = """
window.violations = [];
document.addEventListener('securitypolicyviolation', e => violations.push(e.blockedURI + ' ' + e.violatedDirective));
"""
# on load: laid out, and the violations' events (queued tasks) delivered
MEASURE = """
window.addEventListener('load', () => {
const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
const visible = e => { const [w, h] = box(e); return w > 0 && h > 0; };
const all = s => Array.from(document.querySelectorAll(s));
const out = {
  svgs: Object.fromEntries(all('svg').map(s => [s.id, box(s)])),
  cidrs: all('svg#address-space text.cidr').filter(visible).map(t => t.textContent),
  subnets: all('svg#address-space rect.subnet').map(r => [r.dataset.cidr, box(r)[0]]),
  scaleSets: all('svg#scale-sets rect.scale-set').filter(visible).length,
  waves: all('svg#join-waves rect.wave').filter(visible).length,
  budgets: all('svg#budgets rect.budget-bar').filter(visible)
    .map(r => [r.dataset.name, r.querySelector('title').textContent]),
  violations,
};
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
});
"""


def chromium(args: list[str], profile: Path) -> str:
    """Run Chromium with `args` in its own process group; its stdout. Past TIMEOUT_S the group is
    killed (by the PID this test started) and the test fails."""
    assert CHROMIUM is not None
    proc = subprocess.Popen([CHROMIUM, *OFFLINE, f"--user-data-dir={profile}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "HOME": str(profile)})
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium ran past {TIMEOUT_S} s")
    assert proc.returncode == 0, stderr[-2000:]
    return stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: run `make host-packages` (.ci/debian-packages.txt lists it)")
    folder = tmp_path_factory.mktemp("pictures")
    text = pictures.page(shared.plan("research-7500"), "stacks/Pulumi.research-7500.yaml")
    (folder / "research-7500.html").write_text(text, encoding="utf-8")
    return folder, text


def measure(folder: Path, text: str, name: str) -> dict:
    """The figures MEASURE reads from the page `text` as Chromium lays it out."""
    csp = f"{pictures.CSP}; script-src 'nonce-{NONCE}'"
    probe = (text.replace(pictures.CSP, csp, 1).replace("<head>", f'<head><script nonce="{NONCE}">{LISTEN}</script>', 1)
             .replace("</body>", f'<script nonce="{NONCE}">{MEASURE}</script></body>'))
    assert probe.count(NONCE) == 3
    (folder / f"{name}.html").write_text(probe, encoding="utf-8")
    dom = chromium(["--dump-dom", (folder / f"{name}.html").as_uri()], folder / f"profile-{name}")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, "the measuring script did not run"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


@pytest.fixture(scope="module")
def measured(page: tuple[Path, str]) -> dict:
    return measure(*page, "probe")


def test_each_drawing_is_laid_out_with_a_size(measured: dict) -> None:
    assert set(measured["svgs"]) == {name for name, _, _ in pictures.DRAWINGS}
    assert all(width > 0 and height > 0 for width, height in measured["svgs"].values())


def test_every_subnets_cidr_label_shows_and_each_subnet_is_drawn(measured: dict) -> None:
    plan = shared.plan("research-7500")
    cidrs = {str(plan.network.control_plane_subnet), str(plan.network.etcd_subnet),
             *(str(p.subnet) for p in plan.node_pools)}
    assert set(measured["cidrs"]) == cidrs
    assert {cidr for cidr, width in measured["subnets"] if width > 0} == cidrs


def test_one_box_shows_per_scale_set_and_one_bar_per_wave(measured: dict) -> None:
    plan = shared.plan("research-7500")
    assert measured["scaleSets"] == sum(len(p.shards) for p in plan.node_pools) == 79
    assert measured["waves"] == len(plan.components.joins.waves)


def test_every_budget_bar_shows_with_its_source(measured: dict) -> None:
    plan = shared.plan("research-7500")
    shown = dict(measured["budgets"])
    assert list(shown) == [bar.name for bar in pictures.budget_bars(plan)]
    for budget in plan.budgets:
        assert budget.source in shown[budget.name]


def test_the_page_loads_nothing_from_outside(measured: dict) -> None:
    assert measured["violations"] == []


def test_an_external_reference_would_be_blocked_and_seen(page: tuple[Path, str]) -> None:
    """The seeded break: an image from outside, which the page's CSP blocks and MEASURE reports."""
    folder, text = page
    seeded = text.replace("</h1>", '</h1><img src="http://example.invalid/x.png" alt="">', 1)
    assert any("example.invalid" in v for v in measure(folder, seeded, "seeded")["violations"])


def test_the_screenshot_is_a_picture_of_the_window(page: tuple[Path, str]) -> None:
    folder, _ = page
    shot = folder / "shot.png"
    chromium([f"--screenshot={shot}", (folder / "research-7500.html").as_uri()], folder / "profile-shot")
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    assert struct.unpack(">II", head[16:24]) == WINDOW
    assert shot.stat().st_size > 50_000  # a blank window compresses to a few kilobytes
