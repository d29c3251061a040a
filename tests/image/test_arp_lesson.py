"""The ARP lesson's parts that need no VM and no root: the rtnetlink messages and their
replies, the accounting of a fill against a kernel stand-in, the judging of figures, and the
way the figures travel (JUnit property -> verify-summary.json -> printed lines).

The real kernel runs it in the verify suite (node-image/verify/test_arp_lesson.py, on the VM
verify boots: tests/image/test_image_vm.py checks its figures); not on this machine, whose
shared ARP table the first half would shrink to the kernel's defaults."""

from __future__ import annotations

import base64
import copy
import errno
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kilonode.image import arp_lesson, verify
from kilonode.image.arp_lesson import Lesson
from kilonode.node import arp_guest

# What this machine's kernel (6.18) printed for the two halves, trimmed (log lines: 10 of the
# ratelimited "overflow" lines, kept as two).
FIGURES: dict[str, Any] = {
    "kernel": "6.18.44-fc-v595",
    "thresholds_before": [128, 512, 1024],
    "thresholds_after": [128, 512, 1024],
    "netns_has_own_thresholds": False,
    "netns_change_refused": True,
    "netns_change_answer": "RTNETLINK answers: No such file or directory",
    "runs": [
        {
            "label": "kernel defaults", "thresholds": [128, 512, 1024], "seen_in_netns": [128, 512, 1024],
            "entries_at_start": 3, "attempted": 2048, "acknowledged": 1024, "failed": 1024,
            "errors": {"ENOBUFS": 1024}, "inserted": 1024, "table_fulls": 1024,
            "log": ["neighbour: arp_cache: neighbor table overflow!"] * 2, "fill_s": 0.04, "total_s": 0.08,
        },
        {
            "label": "image", "thresholds": [80000, 90000, 100000], "seen_in_netns": [80000, 90000, 100000],
            "entries_at_start": 1, "attempted": 50000, "acknowledged": 50000, "failed": 0, "errors": {},
            "inserted": 50000, "table_fulls": 0, "log": [], "fill_s": 0.23, "total_s": 0.41,
        },
    ],
    "total_s": 0.49,
}


def lesson(**changes: Any) -> Lesson:
    data = copy.deepcopy(FIGURES)
    for label, fields in changes.items():
        run = next(r for r in data["runs"] if r["label"] == label.replace("_", " "))
        run.update(fields)
    return Lesson.from_json(data)


# --- rtnetlink ---------------------------------------------------------------------------------


def test_newneigh_is_an_exclusive_create_of_a_stale_ipv4_entry() -> None:
    message = arp_guest.newneigh(7, 42, arp_guest.address(0), arp_guest.lladdr(0), ack=False)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", message)
    assert (length, kind, seq, pid) == (len(message), 28, 7, 0)  # RTM_NEWNEIGH
    assert len(message) == 48 and len(message) % 4 == 0
    assert flags == 0x1 | 0x400 | 0x200  # REQUEST | CREATE | EXCL: no ACK, so only an error answers
    family, _, _, ifindex, state, ndm_flags, _ = struct.unpack_from("=BBHiHBB", message, 16)
    assert (family, ifindex, state, ndm_flags) == (socket.AF_INET, 42, 0x04, 0)  # NUD_STALE, not PERMANENT
    assert message[28:36] == struct.pack("=HH", 8, 1) + bytes((10, 250, 0, 2))  # NDA_DST
    assert message[36:46] == struct.pack("=HH", 10, 2) + bytes((2, 0, 0, 0, 0, 0))  # NDA_LLADDR
    acked = arp_guest.newneigh(7, 42, arp_guest.address(0), arp_guest.lladdr(0), ack=True)
    assert struct.unpack_from("=H", acked, 6)[0] == flags | 0x4


def test_addresses_fill_the_slash_16_without_its_network_link_or_broadcast_address() -> None:
    first, last = arp_guest.address(0), arp_guest.address(arp_guest.MAX_ATTEMPTS - 1)
    assert socket.inet_ntoa(first) == "10.250.0.2"  # .0.1 is the link's own
    assert socket.inet_ntoa(last) == "10.250.255.254"
    assert len({arp_guest.address(i) for i in range(0, arp_guest.MAX_ATTEMPTS, 97)}) == \
        len(range(0, arp_guest.MAX_ATTEMPTS, 97))
    assert len({arp_guest.lladdr(i) for i in range(arp_lesson.IMAGE_ATTEMPTS)}) == arp_lesson.IMAGE_ATTEMPTS
    with pytest.raises(ValueError):
        arp_guest.address(arp_guest.MAX_ATTEMPTS)


def nlmsg_error(seq: int, code: int) -> bytes:
    payload = struct.pack("=i", -code) + struct.pack("=IHHII", 16, 28, 0, seq, 0)
    return struct.pack("=IHHII", 16 + len(payload), 2, 0x100, seq, 0) + payload


def test_replies_split_a_datagram_and_read_each_errno() -> None:
    data = nlmsg_error(1, 0) + nlmsg_error(2, errno.ENOBUFS)
    found = [(kind, seq, arp_guest.error_of(payload)) for kind, seq, payload in arp_guest.replies(data)]
    assert found == [(2, 1, 0), (2, 2, errno.ENOBUFS)]
    with pytest.raises(ValueError, match="truncated"):
        list(arp_guest.replies(data[:-4]))


class KernelStandIn:
    """A neighbour table that takes `room` entries and refuses the rest with ENOBUFS, replying
    the way rtnetlink does: an error for each refusal, an acknowledgement only when asked."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken: set[bytes] = set()
        self.queue: list[bytes] = []
        self.datagrams = 0

    def send(self, data: bytes) -> int:
        self.datagrams += 1
        for kind, seq, payload in arp_guest.replies(data):
            assert kind == 28
            dst = payload[16:20]
            code = 0 if len(self.taken) < self.room else errno.ENOBUFS
            if not code:
                self.taken.add(dst)
            wants_ack = bool(struct.unpack_from("=H", self._header(data, seq), 6)[0] & 0x4)
            if code or wants_ack:
                self.queue.append(nlmsg_error(seq, code))
        return len(data)

    @staticmethod
    def _header(data: bytes, seq: int) -> bytes:
        offset = 0
        while True:
            length, _, _, this, _ = struct.unpack_from("=IHHII", data, offset)
            if this == seq:
                return data[offset:offset + 16]
            offset += length

    def recv(self, _size: int) -> bytes:
        return self.queue.pop(0)


@pytest.mark.parametrize(("attempts", "room"), [(300, 1024), (2048, 1021), (129, 128), (128, 0)])
def test_fill_counts_what_the_kernel_took_and_refused(attempts: int, room: int) -> None:
    kernel = KernelStandIn(room)
    acknowledged, refused = arp_guest.fill(kernel, ifindex=3, attempts=attempts)  # type: ignore[arg-type]
    taken = min(room, attempts)
    assert acknowledged == taken == len(kernel.taken)
    assert refused == (Counter({"ENOBUFS": attempts - taken}) if attempts > taken else Counter())
    assert kernel.datagrams == -(-attempts // arp_guest.BATCH)
    assert kernel.queue == []  # every reply read: none left to be mistaken for the next batch's


# --- judging the figures -----------------------------------------------------------------------


def test_the_recorded_figures_show_the_lesson() -> None:
    taught = lesson()
    assert arp_lesson.overflow_problems(taught.run("kernel defaults")) == []
    assert arp_lesson.capacity_problems(taught.run("image")) == []


def test_a_table_that_took_everything_shows_no_overflow() -> None:
    """The negative case: had the defaults half held all its entries, the check fails, naming why."""
    roomy = lesson(kernel_defaults={"acknowledged": 2048, "failed": 0, "errors": {}, "inserted": 2048,
                                    "table_fulls": 0, "log": []}).run("kernel defaults")
    problems = arp_lesson.overflow_problems(roomy)
    assert any("no overflow" in p for p in problems)
    assert any("above gc_thresh3" in p for p in problems)
    assert any("kernel log" in p for p in problems)


def test_refusals_at_50000_fail_the_image_half() -> None:
    short = lesson(image={"acknowledged": 49000, "failed": 1000, "errors": {"ENOBUFS": 1000}, "inserted": 49000,
                          "table_fulls": 1000, "log": ["neighbour: arp_cache: neighbor table overflow!"]})
    problems = arp_lesson.capacity_problems(short.run("image"))
    assert len(problems) == 4, problems
    assert arp_lesson.capacity_problems(lesson().run("image"), attempts=60_000) == [
        "50000 entries attempted, not 60000"
    ]


def test_the_overflow_needs_enobufs_and_the_kernels_own_count() -> None:
    odd = lesson(kernel_defaults={"errors": {"ENOBUFS": 1000, "EINVAL": 24}, "table_fulls": 12})
    problems = arp_lesson.overflow_problems(odd.run("kernel defaults"))
    assert any("other than ENOBUFS" in p for p in problems)
    assert any("table_fulls" in p for p in problems)


def test_parse_takes_the_last_json_line_and_refuses_none() -> None:
    assert arp_lesson.parse("a warning\n" + json.dumps(FIGURES) + "\n") == lesson()
    with pytest.raises(ValueError, match="no JSON"):
        arp_lesson.parse("Traceback ...\n")
    with pytest.raises(KeyError):
        lesson().run("neither")


def test_summary_lines_give_both_halves_figures() -> None:
    lines = arp_lesson.summary_lines(lesson())
    assert "kernel 6.18.44-fc-v595" in lines[0]
    assert lines[1].strip().startswith("kernel defaults 128/512/1024: 2,048 attempted, 1,024 inserted, 1,024 refused "
                                       "(ENOBUFS), 2 'neighbor table overflow' log line(s), fill 0.0 s")
    assert lines[2].strip().startswith("image 80000/90000/100000: 50,000 attempted, 50,000 inserted, 0 refused, 0 ")
    assert "128/512/1024 restored" in lines[3]
    unrestored = Lesson.from_json({**FIGURES, "thresholds_after": [1, 2, 3]})
    assert "NOT restored" in arp_lesson.summary_lines(unrestored)[-1]


def test_the_guest_command_carries_the_whole_program(tmp_path: Path) -> None:
    """The source travels in the command and runs as __main__: an impossible run is refused by
    its own argument check (no root needed to get that far). It imports nothing of kilonode
    (the node has none): a kilonode that fails on import comes first on its path here."""
    command = arp_lesson.guest_command([("x", (1, 2, 3), 0)], python=sys.executable)
    [encoded] = re.findall(r'b64decode\("([A-Za-z0-9+/=]+)"\)', command)
    assert base64.b64decode(encoded) == Path(arp_guest.__file__).read_bytes()
    poisoned = tmp_path / "poison"
    (poisoned / "kilonode").mkdir(parents=True)
    (poisoned / "kilonode" / "__init__.py").write_text("raise ImportError('the guest imported kilonode')\n")
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60, check=False,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(poisoned)})
    assert result.returncode == 2 and "x:1/2/3:0: 1 to 65533 entries" in result.stderr, result.stderr


def test_the_poisoned_path_catches_a_guest_that_imports_kilonode(tmp_path: Path) -> None:
    """The check above can fail: the same poison stops a program that imports kilonode."""
    poisoned = tmp_path / "poison"
    (poisoned / "kilonode").mkdir(parents=True)
    (poisoned / "kilonode" / "__init__.py").write_text("raise ImportError('the guest imported kilonode')\n")
    result = subprocess.run([sys.executable, "-c", "import kilonode.node.arp_guest"], capture_output=True, text=True,
                            timeout=60, check=False, cwd=tmp_path,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(poisoned)})
    assert result.returncode == 1 and "the guest imported kilonode" in result.stderr, result.stderr


# --- how the figures reach the report ----------------------------------------------------------


JunitWithProperty = Callable[[Path, str], Path]


@pytest.fixture(scope="module")
def junit_with_property(tmp_path_factory: pytest.TempPathFactory) -> JunitWithProperty:
    """A JUnit XML written by pytest itself, the way the verify suite records the figures: one
    pytest run per value for the module (each a second), copied into the test's `tmp_path`."""
    written: dict[str, Path] = {}

    def junit(tmp_path: Path, value: str) -> Path:
        if value not in written:
            run = tmp_path_factory.mktemp("junit")
            (run / "none.ini").write_text("[pytest]\n")
            (run / "test_record.py").write_text(textwrap.dedent(f"""
                def test_record(record_testsuite_property):
                    record_testsuite_property({arp_lesson.PROPERTY!r}, {value!r})
            """))
            written[value] = run / "junit.xml"
            subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(run / "test_record.py"),
                 f"--junitxml={written[value]}", "-o", "junit_suite_name=first-boot", "-o", "junit_family=xunit2",
                 "--rootdir", str(run), "-c", str(run / "none.ini")],
                # JUnit XML is pytest's own: the installed plugins (hypothesis, xdist, ...) need not load
                cwd=run, capture_output=True, text=True, timeout=120, check=True,
                env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
            )
        copy = tmp_path / "junit.xml"
        shutil.copyfile(written[value], copy)
        return copy

    return junit


def test_merge_puts_the_figures_in_the_summary_and_the_printed_lines(
    tmp_path: Path, junit_with_property: JunitWithProperty
) -> None:
    junit = junit_with_property(tmp_path, json.dumps({**FIGURES, "check_s": 9.5}))
    report = verify.VerifyReport(junit=tmp_path / "merged.xml")
    verify.merge([junit], report.junit, report)
    assert report.arp is not None and report.arp["phase"] == "first-boot" and report.arp["check_s"] == 9.5
    verify.write_summary(report, tmp_path / "verify-summary.json")
    summary = json.loads((tmp_path / "verify-summary.json").read_text())
    assert summary["arp"]["runs"][1]["inserted"] == 50000 and summary["passed"] is True
    printed = verify.arp_summary_lines(report)
    assert printed[:-1] == arp_lesson.summary_lines(lesson())[:-1]
    assert printed[-1].endswith("the lesson took 0.5 s on the node (9.5 s as a check, SSH included)")
    assert arp_lesson.PROPERTY in (tmp_path / "merged.xml").read_text()  # the merged JUnit keeps it too


def test_a_report_without_the_lesson_says_nothing_of_it(tmp_path: Path) -> None:
    report = verify.VerifyReport(junit=tmp_path / "merged.xml")
    assert verify.arp_summary_lines(report) == []
    verify.write_summary(report, tmp_path / "summary.json")
    assert json.loads((tmp_path / "summary.json").read_text())["arp"] is None


def test_unreadable_figures_are_kept_and_named_not_fatal(
    tmp_path: Path, junit_with_property: JunitWithProperty
) -> None:
    junit = junit_with_property(tmp_path, "{not json")
    report = verify.VerifyReport(junit=tmp_path / "merged.xml")
    verify.merge([junit], report.junit, report)
    assert report.arp == {"phase": "first-boot", "unreadable": "{not json"}
    assert verify.arp_summary_lines(report)[0].startswith("ARP lesson: figures unreadable (KeyError")


def test_verify_prints_the_figures_as_progress_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, junit_with_property: JunitWithProperty
) -> None:
    """The wiring in verify_image: the phase's property becomes printed lines and the summary's
    `arp` (phases stubbed: the real run is tests/image/test_image_vm.py's)."""
    junit = junit_with_property(tmp_path, json.dumps({**FIGURES, "check_s": 9.5}))

    class StubManifest:
        data: ClassVar[dict[str, Any]] = {"pool": "cpu"}

    monkeypatch.setattr(verify.Manifest, "for_image", lambda _image: StubManifest())
    monkeypatch.setattr(verify, "run_phase", lambda phase, **_kwargs: junit)
    printed: list[str] = []
    report = verify.verify_image(tmp_path / "absent.raw", workdir=tmp_path / "work",
                                 host=verify.SshTarget("debian", "127.0.0.1"), progress=printed.append)
    assert printed == [*arp_lesson.summary_lines(lesson())[:-1], printed[-1]]
    assert printed[-1].endswith("(9.5 s as a check, SSH included)")
    summary = json.loads((tmp_path / "work" / "verify-summary.json").read_text())
    assert summary["arp"] == report.arp and summary["arp"]["runs"][0]["failed"] == 1024
