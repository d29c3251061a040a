"""The ARP lesson on a real kernel: fill the neighbour table, first with the kernel's default
gc_thresh values and then with the image's, and count what the kernel refused.

Field notes (2,500-node post): every pod has its own IP, so the neighbour table overflowed
("neighbor table overflow!" in dmesg, DNS and TCP hanging) with the default thresholds; the
image raises them (sysctl/gpu-worker.yaml -> /etc/sysctl.d/90-kilonode.conf).

Two halves. On the node, as root, kilonode.node.arp_guest does the fill: `guest_command` sends
its source (the verify suite's test_arp_lesson.py does so over SSH, on the VM verify booted:
never on a host it shares, whose neighbours the first half would evict). Here, `Lesson` reads
the JSON it prints, `*_problems` judge it and `summary_lines` word it for the report.

What the kernel does, read in Linux 6.1 (Debian 12's kernel): net/core/neighbour.c in a 6.1
vendor tree (CodeLinaro-mirror/qsdk_oss_kernel_linux-ipq-6.1 @ f765b8ae: no mainline v6.1 copy
was at hand), and net/ipv4/arp.c (arp_tbl, arp_init) in a 6.x copy. The verify run confirmed
the first point on Debian 12's 6.1.0-56-cloud-amd64 (no gc_thresh in a namespace, ENOENT):

- There is one ARP table for the whole kernel (`arp_tbl`), shared by every network namespace
  (entries carry their device, hence their namespace), and gc_thresh1/2/3 are fields of that
  table. `neigh_sysctl_register()` points net/ipv4/neigh/default/gc_thresh* at `tbl->gc_thresh*`
  and registers that directory only for the parms with no device, which `arp_init()` does
  once, for init_net; a device's directory "terminates the table early", before gc_interval.
  `neightbl_set()` refuses threshold changes from any namespace but init_net (ENOENT). So a
  new namespace starts neither from the kernel defaults nor from a copy of init_net's values:
  it has none of its own, and its entries count against init_net's live values (the node's).
  The fill therefore sets in init_net what each half needs and puts the node's values back;
  the namespace keeps the fill's entries apart from the node's own and off its real links.
- `neigh_alloc()`: an entry not exempt from GC (`neigh_add()`: exempt when NUD_PERMANENT or
  NTF_EXT_LEARNED, so a permanent fill would prove nothing) counts in `gc_entries`; at
  >= gc_thresh3 (or >= gc_thresh2 with no flush for 5 s) it runs `neigh_forced_gc()`, which
  frees only entries not updated for 5 s (or FAILED/NOARP ones); when that frees nothing and
  the count is >= gc_thresh3 it logs "<table>: neighbor table overflow!"
  (`net_info_ratelimited`: at most 10 lines per 5 s), counts `table_fulls`, and
  `___neigh_create()` answers ENOBUFS. Fresh STALE entries are refused, not collected: the
  fill adds those, the way a node learns its peers' pod IPs.
- The kernel's defaults: `arp_tbl` has .gc_thresh1 = 128, .gc_thresh2 = 512, .gc_thresh3 = 1024.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# THRESHOLD_KEYS: the sysctls the guest sets, named here for the verify suite too
from kilonode.node.arp_guest import THRESHOLD_KEYS as THRESHOLD_KEYS
from kilonode.node.arp_guest import triple
from kilonode.node.ship import ARP_GUEST

# The kernel's own defaults (net/ipv4/arp.c, arp_tbl), written by hand: a check of "the image
# raised them" must not read them from the plan it checks.
KERNEL_DEFAULTS = (128, 512, 1024)
# Twice gc_thresh3: enough to fill the table and see refusals, few enough to be quick.
DEFAULTS_ATTEMPTS = 2 * KERNEL_DEFAULTS[2]
# The figure issue 12 asks the image's values to hold without a single refusal.
IMAGE_ATTEMPTS = 50_000
# The JUnit <testsuite> property that carries the figures from the verify suite to the report.
PROPERTY = "kilonode.arp_lesson"
OVERFLOW = "neighbor table overflow"  # the kernel's spelling

# --- this side: the figures, judged and worded ------------------------------------------------


@dataclass(frozen=True)
class FillRun:
    """One half: the table filled in a fresh namespace under one set of thresholds."""

    label: str
    thresholds: tuple[int, int, int]  # set in init_net for this half
    seen_in_netns: tuple[int, int, int]  # the table's thresholds as the namespace reads them
    attempted: int
    acknowledged: int  # adds the kernel answered with success
    failed: int
    errors: dict[str, int]  # errno name -> count
    entries_at_start: int  # the table's entries (every namespace's) before the fill
    inserted: int  # the link's entries afterwards (a dump of the namespace's table)
    table_fulls: int  # the kernel's count of refused entries during the fill (/proc/net/stat)
    log: tuple[str, ...]  # kernel log lines about the table during the fill
    fill_s: float
    total_s: float  # namespace set-up, fill, count, tear-down

    @property
    def overflow_lines(self) -> int:
        return sum(OVERFLOW in line for line in self.log)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FillRun:
        return cls(
            label=str(data["label"]),
            thresholds=triple(data["thresholds"]),
            seen_in_netns=triple(data["seen_in_netns"]),
            attempted=int(data["attempted"]),
            acknowledged=int(data["acknowledged"]),
            failed=int(data["failed"]),
            errors={str(k): int(v) for k, v in data["errors"].items()},
            entries_at_start=int(data["entries_at_start"]),
            inserted=int(data["inserted"]),
            table_fulls=int(data["table_fulls"]),
            log=tuple(str(line) for line in data["log"]),
            fill_s=float(data["fill_s"]),
            total_s=float(data["total_s"]),
        )


@dataclass(frozen=True)
class Lesson:
    kernel: str
    thresholds_before: tuple[int, int, int]  # the node's own, read before anything changed
    thresholds_after: tuple[int, int, int]
    netns_has_own_thresholds: bool  # net/ipv4/neigh/default/gc_thresh3 exists inside a namespace
    netns_change_refused: bool  # `ip ntable change ... thresh3` from inside a namespace failed
    netns_change_answer: str  # what it said (6.1: ENOENT, from neightbl_set)
    runs: tuple[FillRun, ...]
    total_s: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lesson:
        return cls(
            kernel=str(data["kernel"]),
            thresholds_before=triple(data["thresholds_before"]),
            thresholds_after=triple(data["thresholds_after"]),
            netns_has_own_thresholds=bool(data["netns_has_own_thresholds"]),
            netns_change_refused=bool(data["netns_change_refused"]),
            netns_change_answer=str(data.get("netns_change_answer", "")),
            runs=tuple(FillRun.from_json(run) for run in data["runs"]),
            total_s=float(data["total_s"]),
        )

    def run(self, label: str) -> FillRun:
        found = [run for run in self.runs if run.label == label]
        if len(found) != 1:
            raise KeyError(f"{len(found)} runs labelled {label!r} in {[r.label for r in self.runs]}")
        return found[0]


def parse(stdout: str) -> Lesson:
    """The node's JSON (the last line that is one: warnings may come before it)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError(f"no JSON in the lesson's output: {stdout[-500:]!r}")
    return Lesson.from_json(json.loads(lines[-1]))


def overflow_problems(run: FillRun) -> list[str]:
    """What is missing for `run` to show the overflow (empty: it shows it)."""
    problems = []
    if run.failed == 0:
        problems.append(f"all {run.attempted} entries were taken: no overflow under {_slash(run.thresholds)}")
    if set(run.errors) - {"ENOBUFS"}:
        problems.append(f"refusals other than ENOBUFS: {run.errors}")
    if run.acknowledged + run.failed != run.attempted:
        problems.append(f"{run.acknowledged} taken + {run.failed} refused != {run.attempted} attempted")
    if run.inserted > run.thresholds[2]:
        problems.append(f"{run.inserted} entries on the link, above gc_thresh3 = {run.thresholds[2]}")
    if run.table_fulls < run.failed:
        problems.append(f"the kernel counted {run.table_fulls} table_fulls for {run.failed} refusals")
    if not run.overflow_lines:
        problems.append(f"no '{OVERFLOW}' in the kernel log (lines seen: {list(run.log)})")
    return problems


def capacity_problems(run: FillRun, attempts: int = IMAGE_ATTEMPTS) -> list[str]:
    """What stops `run` from showing the table holding `attempts` entries (empty: it holds)."""
    problems = []
    if run.attempted != attempts:
        problems.append(f"{run.attempted} entries attempted, not {attempts}")
    if run.failed or run.errors:
        problems.append(f"{run.failed} refused: {run.errors}")
    if run.inserted != run.attempted:
        problems.append(f"{run.inserted} of {run.attempted} entries on the link afterwards")
    if run.table_fulls:
        problems.append(f"the kernel counted {run.table_fulls} table_fulls")
    if run.overflow_lines:
        problems.append(f"'{OVERFLOW}' in the kernel log: {list(run.log)}")
    return problems


def summary_lines(lesson: Lesson) -> list[str]:
    """The figures as `kilonode image verify` prints them."""
    lines = [f"ARP lesson on kernel {lesson.kernel} (a fresh namespace each, veth with a /16, STALE entries):"]
    for run in lesson.runs:
        refused = f"{run.failed:,} refused" + (f" ({', '.join(sorted(run.errors))})" if run.errors else "")
        lines.append(
            f"  {run.label} {_slash(run.thresholds)}: {run.attempted:,} attempted, {run.inserted:,} inserted, "
            f"{refused}, {run.overflow_lines} '{OVERFLOW}' log line(s), fill {run.fill_s:.1f} s "
            f"(all {run.total_s:.1f} s)"
        )
    restored = "restored" if lesson.thresholds_after == lesson.thresholds_before else "NOT restored"
    lines.append(f"  the node's own thresholds {_slash(lesson.thresholds_before)} {restored}; "
                 f"the lesson took {lesson.total_s:.1f} s on the node")
    return lines


def _slash(values: tuple[int, ...]) -> str:
    return "/".join(str(v) for v in values)


def guest_command(runs: list[tuple[str, tuple[int, int, int], int]], python: str = "python3") -> str:
    """A shell command that runs kilonode.node.arp_guest with `python` (as root): each run is
    (label, thresholds, attempts). Shipped as kilonode.node.ship ships a command: the node
    needs nothing from kilonode, and a testinfra `host.run` has no stdin."""
    args = [arg for label, t, n in runs for arg in ("--run", f"{label}:{_slash(t)}:{n}")]
    command = ARP_GUEST.command(args, python)
    # sudo passes it on as one argument to `sh -c`: Linux takes at most 128 KiB in one (MAX_ARG_STRLEN)
    if len(command) > 100_000:
        raise ValueError(f"the lesson's command is {len(command):,} characters: too long for one argument")
    return command
