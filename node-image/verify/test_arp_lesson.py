"""The ARP lesson on the booted node's own kernel (field notes: every pod has its own IP, so the
neighbour table overflowed with the kernel's default gc_thresh values).

In a fresh network namespace per half, on a veth with a /16, the table is filled with STALE
entries: first under the kernel's defaults (128/512/1024, written here by hand), where the
kernel must refuse entries with ENOBUFS and log "neighbor table overflow", then under the
image's values (the plan's), where 50,000 entries must all be taken. The thresholds are
kernel-wide (see kilonode/image/arp_lesson.py for the 6.1 source behind that), so each half
sets them in init_net and the node gets its own values back.

The figures go into the JUnit report as a <testsuite> property, and from there into
verify-summary.json's `arp` section and the lines `kilonode image verify` prints.
First boot only: the lesson is about the kernel, which a reboot does not change. Only on the
throwaway VM verify boots: on a live node (`--host`) the defaults half would evict its
neighbours and refuse new ones for a moment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import testinfra

from kilonode.image import arp_lesson
from kilonode.image.arp_lesson import IMAGE_ATTEMPTS, KERNEL_DEFAULTS, THRESHOLD_KEYS, Lesson
from kilonode.plan.model import NodePoolPlan

DEFAULTS, IMAGE = "kernel defaults", "image"


def image_thresholds(pool: NodePoolPlan) -> tuple[int, int, int]:
    values = {s.name: s.value for s in pool.sysctls}
    missing = [key for key in THRESHOLD_KEYS if key not in values]
    if missing:
        pytest.fail(f"the plan sets no {', '.join(missing)}: the image keeps the kernel's defaults")
    first, second, third = (int(values[key]) for key in THRESHOLD_KEYS)
    return first, second, third


@pytest.fixture(scope="module")
def lesson(host: testinfra.host.Host, pool: NodePoolPlan, ssh: dict[str, Any],
           record_testsuite_property: Callable[[str, object], None]) -> Lesson:
    """Both halves in one SSH command (one Python start on a slow guest); figures recorded
    before any check judges them, so a failing run still reports what it saw."""
    if not ssh.get("disposable"):
        pytest.skip("changes the node's kernel-wide neighbour thresholds: only on the VM verify boots")
    command = arp_lesson.guest_command([
        (DEFAULTS, KERNEL_DEFAULTS, arp_lesson.DEFAULTS_ATTEMPTS),
        (IMAGE, image_thresholds(pool), IMAGE_ATTEMPTS),
    ])
    started = time.monotonic()
    result = host.run(command)
    check_s = round(time.monotonic() - started, 1)
    assert result.rc == 0, f"the lesson exited {result.rc}: {result.stderr.strip()[-2000:]}"
    lesson = arp_lesson.parse(result.stdout)
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    record_testsuite_property(arp_lesson.PROPERTY, json.dumps({**figures, "check_s": check_s}))
    return lesson


def test_the_thresholds_are_the_whole_kernels_not_a_namespaces(lesson: Lesson) -> None:
    """What the procedure rests on: a namespace has no gc_thresh of its own and cannot set one;
    it reads the values just set in init_net."""
    assert not lesson.netns_has_own_thresholds, "a namespace has its own gc_thresh: set them there instead"
    assert lesson.netns_change_refused, "a namespace changed the ARP table's thresholds"
    assert "No such file or directory" in lesson.netns_change_answer  # ENOENT: neightbl_set's init_net-only rule
    for run in lesson.runs:
        assert run.seen_in_netns == run.thresholds, f"{run.label}: the namespace reads {run.seen_in_netns}"


def test_kernel_default_thresholds_overflow_the_neighbour_table(lesson: Lesson) -> None:
    run = lesson.run(DEFAULTS)
    assert run.thresholds == KERNEL_DEFAULTS
    assert arp_lesson.overflow_problems(run) == []


def test_image_thresholds_take_50000_neighbours(lesson: Lesson, pool: NodePoolPlan) -> None:
    run = lesson.run(IMAGE)
    assert run.thresholds == image_thresholds(pool)
    assert arp_lesson.capacity_problems(run, IMAGE_ATTEMPTS) == []


def test_the_node_gets_its_own_thresholds_back(lesson: Lesson) -> None:
    """Whatever they were (test_kernel_params.py judges them): the checks after this one see the node as booted."""
    assert lesson.thresholds_after == lesson.thresholds_before
