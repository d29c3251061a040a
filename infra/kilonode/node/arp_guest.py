"""The guest half of the ARP lesson (kilonode.image.arp_lesson holds the other half and the
kernel reading behind it): on the VM `kilonode image verify` booted, as root, fill the
neighbour table in a throwaway namespace under each run's gc_thresh values and print what the
kernel took and refused, as one JSON line.

Shipped as a command (kilonode.node.ship.ARP_GUEST): its source travels base64-encoded over
SSH and runs as __main__ under Debian 12's Python 3.11. Never on a host it shares: the first
half would evict that host's neighbours.

Not `ip -batch`: iproute2's `ipneigh_modify()` calls exit(2) when the kernel refuses an entry
(ip/ipneigh.c; seen with iproute2 6.1.0: `ip -force -batch` stopped at the first ENOBUFS), so
it cannot count the refusals. The fill speaks rtnetlink itself: RTM_NEWNEIGH messages packed
128 to a datagram, the kernel's answer to each one counted by errno.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

THRESHOLD_KEYS = tuple(f"net.ipv4.neigh.default.gc_thresh{i}" for i in (1, 2, 3))

# Inside the namespace: a veth (a pod's link type) with a /16, the way a node reaches a pod
# range on-link; the entries are 10.250.0.2 upwards with locally administered MACs.
LINK, PEER = "kn0", "kn1"
PREFIX = (10, 250)
MAX_ATTEMPTS = 65_533  # the /16's host addresses after the link's own .0.1
BATCH = 128  # RTM_NEWNEIGH messages per datagram; their error replies fit a default receive buffer

_THRESHOLD_FILES = tuple(f"/proc/sys/{k.replace('.', '/')}" for k in THRESHOLD_KEYS)
_ARP_STAT = "/proc/net/stat/arp_cache"

# rtnetlink (include/uapi/linux/netlink.h, rtnetlink.h, neighbour.h)
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_RTM_NEWNEIGH, _RTM_GETNEIGH = 28, 30
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE, _NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
_NDA_DST, _NDA_LLADDR = 1, 2
_NUD_STALE, _NUD_NOARP = 0x04, 0x40
_SOL_NETLINK, _NETLINK_CAP_ACK = 270, 10  # errors come back with the request's header only
_SO_RCVBUFFORCE = 33
_CLONE_NEWNET = 0x40000000
_HDR = struct.Struct("=IHHII")  # nlmsghdr
_NDMSG = struct.Struct("=BBHiHBB")
_RTA = struct.Struct("=HH")


def triple(values: Any) -> tuple[int, int, int]:
    first, second, third = (int(v) for v in values)
    return first, second, third


def address(index: int) -> bytes:
    """The `index`-th entry's IPv4 address: 10.250.0.2 upwards."""
    if not 0 <= index < MAX_ATTEMPTS:
        raise ValueError(f"entry {index} does not fit the /16")
    host = index + 2
    return bytes((*PREFIX, host >> 8, host & 0xFF))


def lladdr(index: int) -> bytes:
    return bytes((0x02, 0, 0, 0, index >> 8 & 0xFF, index & 0xFF))  # 02: locally administered


def newneigh(seq: int, ifindex: int, dst: bytes, mac: bytes, *, ack: bool) -> bytes:
    """RTM_NEWNEIGH for a STALE entry (create, fail if it exists), as `ip neigh add ... nud
    stale` sends it; an error always comes back, a success only when `ack`."""
    attrs = _RTA.pack(4 + len(dst), _NDA_DST) + dst + _RTA.pack(4 + len(mac), _NDA_LLADDR) + mac
    attrs += b"\0" * (-len(attrs) % 4)
    body = _NDMSG.pack(socket.AF_INET, 0, 0, ifindex, _NUD_STALE, 0, 0) + attrs
    flags = _NLM_F_REQUEST | _NLM_F_CREATE | _NLM_F_EXCL | (_NLM_F_ACK if ack else 0)
    return _HDR.pack(_HDR.size + len(body), _RTM_NEWNEIGH, flags, seq, 0) + body


def replies(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, payload) of each netlink message in one datagram."""
    offset = 0
    while offset + _HDR.size <= len(data):
        length, kind, _flags, seq, _pid = _HDR.unpack_from(data, offset)
        if length < _HDR.size or offset + length > len(data):
            raise ValueError(f"truncated netlink message at {offset}: length {length} of {len(data)}")
        yield kind, seq, data[offset + _HDR.size: offset + length]
        offset += (length + 3) & ~3


def error_of(payload: bytes) -> int:
    """NLMSG_ERROR's errno (0: an acknowledgement)."""
    return -struct.unpack_from("=i", payload)[0]


def fill(sock: socket.socket, ifindex: int, attempts: int, batch: int = BATCH) -> tuple[int, Counter[str]]:
    """Add `attempts` entries; (acknowledged, refusals by errno name). The kernel handles each
    datagram inside send() and queues its replies in order; the last message of each batch asks
    for an acknowledgement, so its reply closes the batch."""
    refused: Counter[str] = Counter()
    seq = 0
    for start in range(0, attempts, batch):
        count = min(batch, attempts - start)
        last = seq + count
        sock.send(b"".join(
            newneigh(seq + k + 1, ifindex, address(start + k), lladdr(start + k), ack=k == count - 1)
            for k in range(count)
        ))
        closed = False
        while not closed:
            for kind, reply_seq, payload in replies(sock.recv(1 << 16)):
                if kind != _NLMSG_ERROR:
                    continue
                code = error_of(payload)
                if code:
                    refused[errno.errorcode.get(code, str(code))] += 1
                closed = closed or reply_seq == last
        seq = last
    return attempts - sum(refused.values()), refused


def count_entries(sock: socket.socket, ifindex: int) -> int:
    """Entries on `ifindex` in the socket's namespace, by an RTM_GETNEIGH dump."""
    sock.send(_HDR.pack(_HDR.size + _NDMSG.size, _RTM_GETNEIGH, _NLM_F_REQUEST | _NLM_F_DUMP, 1 << 30, 0)
              + _NDMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0))
    found = 0
    while True:
        for kind, _seq, payload in replies(sock.recv(1 << 20)):
            if kind == _NLMSG_DONE:
                return found
            if kind == _NLMSG_ERROR:
                raise OSError(error_of(payload), "neighbour dump failed")
            if kind == _RTM_NEWNEIGH:
                _family, _p1, _p2, index, state, _flags, _type = _NDMSG.unpack_from(payload)
                found += index == ifindex and not state & _NUD_NOARP


def read_thresholds() -> tuple[int, int, int]:
    return triple(Path(path).read_text().split()[0] for path in _THRESHOLD_FILES)


def write_thresholds(values: tuple[int, int, int]) -> None:
    for path, value in zip(_THRESHOLD_FILES, values, strict=True):
        Path(path).write_text(f"{value}\n")


def table_stat() -> tuple[int, int]:
    """(entries, table_fulls) of the ARP table, all namespaces together (/proc/net/stat/arp_cache,
    in init_net only: one hex row per CPU, `entries` the same in each, table_fulls last)."""
    rows = [row.split() for row in Path(_ARP_STAT).read_text().split("\n")[1:] if row.strip()]
    return int(rows[0][0], 16), sum(int(row[-1], 16) for row in rows)


class KernelLog:
    """Kernel log records written after it was opened (/dev/kmsg, the ring buffer dmesg reads)."""

    def __init__(self) -> None:
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        self.read()  # skip what is already there

    def read(self) -> list[str]:
        lines = []
        while True:
            try:
                record = os.read(self.fd, 8192).decode(errors="replace")
            except BlockingIOError:
                return lines
            except BrokenPipeError:  # records overwritten before we read them; reading goes on
                continue
            lines.append(record.partition(";")[2].split("\n", 1)[0])

    def close(self) -> None:
        os.close(self.fd)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=check)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def seen_thresholds(namespace: str) -> tuple[int, int, int]:
    """The ARP table's thresholds as `ip ntable` reads them from inside `namespace`."""
    text = _ip("-n", namespace, "ntable", "show", "name", "arp_cache").stdout
    found = [re.search(rf"\bthresh{i} (\d+)", text) for i in (1, 2, 3)]
    if not all(found):
        raise ValueError(f"no thresholds in `ip ntable show`: {text[:300]!r}")
    return triple(m.group(1) for m in found if m)


def run_half(label: str, thresholds: tuple[int, int, int], attempts: int, facts: dict[str, Any]) -> dict[str, Any]:
    """One half in its own namespace: set the thresholds (init_net: the only place they live),
    fill, count, tear down."""
    started = time.monotonic()
    namespace = f"kn-arp-{os.getpid()}"
    _ip("netns", "add", namespace)
    try:
        _ip("-n", namespace, "link", "add", LINK, "type", "veth", "peer", "name", PEER)
        _ip("-n", namespace, "addr", "add", f"{PREFIX[0]}.{PREFIX[1]}.0.1/16", "dev", LINK)
        for link in (LINK, PEER):
            _ip("-n", namespace, "link", "set", link, "up")
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        _setns(target)
        try:
            # a socket stays in the namespace it was made in: the fill needs no `ip netns exec`
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            ifindex = socket.if_nametoindex(LINK)
            facts["netns_has_own_thresholds"] = os.path.exists(_THRESHOLD_FILES[2])
        finally:
            _setns(home)
            os.close(home)
            os.close(target)
        # the value it would set is the one this half sets in init_net next: harmless if it took
        change = _ip("-n", namespace, "ntable", "change", "name", "arp_cache", "thresh3", str(thresholds[2]),
                     check=False)
        facts["netns_change_refused"] = change.returncode != 0
        facts["netns_change_answer"] = (change.stderr or change.stdout).strip()[:200]
        with sock:
            sock.setsockopt(_SOL_NETLINK, _NETLINK_CAP_ACK, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 4 << 20)
            sock.settimeout(60)  # a reply that never comes fails the run instead of hanging it
            write_thresholds(thresholds)
            seen = seen_thresholds(namespace)
            log = KernelLog()
            try:
                entries, fulls = table_stat()
                t = time.monotonic()
                acknowledged, refused = fill(sock, ifindex, attempts)
                fill_s = time.monotonic() - t
                fulls = table_stat()[1] - fulls
                lines = [line for line in log.read() if "neighbo" in line or "callbacks suppressed" in line]
            finally:
                log.close()
            inserted = count_entries(sock, ifindex)
    finally:
        # deleting the link flushes its entries at once; `netns del` alone leaves them to a
        # deferred clean-up, and the next half would start on a fuller table
        _ip("-n", namespace, "link", "del", LINK, check=False)
        _ip("netns", "del", namespace, check=False)
    return {
        "label": label,
        "thresholds": list(thresholds),
        "seen_in_netns": list(seen),
        "entries_at_start": entries,
        "attempted": attempts,
        "acknowledged": acknowledged,
        "failed": sum(refused.values()),
        "errors": dict(refused),
        "inserted": inserted,
        "table_fulls": fulls,
        "log": lines[:20],
        "fill_s": round(fill_s, 2),
        "total_s": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fill the ARP table in a throwaway namespace (root).")
    parser.add_argument("--run", action="append", required=True, metavar="LABEL:T1/T2/T3:ATTEMPTS")
    args = parser.parse_args(argv)
    halves = []
    for spec in args.run:
        label, thresholds, attempts = spec.rsplit(":", 2)
        if not 0 < int(attempts) <= MAX_ATTEMPTS:
            parser.error(f"{spec}: 1 to {MAX_ATTEMPTS} entries")
        halves.append((label, triple(thresholds.split("/")), int(attempts)))
    started = time.monotonic()
    before = read_thresholds()
    facts: dict[str, Any] = {}
    runs = []
    try:
        for label, thresholds, attempts in halves:
            runs.append(run_half(label, thresholds, attempts, facts))
    finally:
        write_thresholds(before)  # the node keeps its own values whatever happened
    print(json.dumps({
        "kernel": os.uname().release,
        "thresholds_before": list(before),
        "thresholds_after": list(read_thresholds()),
        **facts,
        "runs": runs,
        "total_s": round(time.monotonic() - started, 2),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
