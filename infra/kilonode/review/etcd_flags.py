"""etcd's own compaction retention raised while the apiservers compact (`etcd-retention-moot`,
medium; the eighth independent trace of kilonode diff on research-7500, PR04: etcd-main's
autoCompactionRetention 1h -> 8h "for debugging" was reported only as the five members' replacement).

kube-apiserver compacts every etcd it writes to on its own timer: --etcd-compaction-interval, default
5 minutes (k8s.io/apiserver pkg/storage/storagebackend/config.go DefaultCompactInterval; kilonode's
apiserver unit does not set it, kilonode.render.control_plane). Each run compacts to the revision the
run before observed (k8s.io/apiserver pkg/storage/etcd3/compact.go, compactor: "compact keys with
versions lower than given revision"), so a store keeps about 5 to 10 minutes of history, whatever
etcd's own --auto-compaction-retention says; etcd's periodic compaction (etcd server/etcdserver/api/
v3compactor/periodic.go) is the backstop with every apiserver down. A retention raised above the
apiservers' interval keeps no more history, and the change still replaces every member of the cluster
(the etcd members' custom data changes: see the replacement lines). Said where the head's apiserver
unit leaves the interval at its default or sets one shorter than the new retention.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from kilonode.review.apiserver_flags import UNIT as APISERVER_UNIT
from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding

RULE = "etcd-retention-moot"
ETCD_UNIT = "etc/systemd/system/etcd.service"
APISERVER_INTERVAL_S = 300  # k8s.io/apiserver storagebackend DefaultCompactInterval: 5 * time.Minute
_RETENTION = re.compile(r"--auto-compaction-retention=(\S+)")
_INTERVAL = re.compile(r"--etcd-compaction-interval=(\S+)")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNITS = {"h": 3600, "m": 60, "s": 1}


def seconds(text: str) -> float | None:
    """A Go duration ("1h", "90m", "1h30m") in seconds; etcd's periodic mode also takes a bare number
    of hours (etcd embed/config.go: "1" means one hour)."""
    text = text.rstrip("\\").strip("'\"")
    if re.fullmatch(r"\d+", text):
        return int(text) * 3600.0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def retentions(files: Mapping[str, str]) -> dict[str, str]:
    """etcd cluster (etcd-main, etcd-events, etcd-leases) -> its members' retention flag."""
    found = {}
    for path, text in files.items():
        if path.endswith(ETCD_UNIT) and (match := _RETENTION.search(text)):
            found[path.split("/", 1)[0].rsplit("-", 1)[0]] = match.group(1).rstrip("\\")
    return found


def apiserver_interval(files: Mapping[str, str]) -> float:
    """The shortest compaction interval any apiserver unit sets (its default where none does; 0 is off)."""
    found = [seconds(m.group(1)) for path, text in files.items() if path.endswith(APISERVER_UNIT)
             for m in [_INTERVAL.search(text)] if m]
    known = [s for s in found if s is not None]
    return min(known) if known else APISERVER_INTERVAL_S


def assess(diff: StackDiff) -> list[Finding]:
    before = retentions((diff.base or {}).get("files") or {})
    head_files = (diff.head or {}).get("files") or {}
    after = retentions(head_files)
    interval = apiserver_interval(head_files)
    found = []
    for cluster in sorted(c for c in after if c in before and before[c] != after[c]):
        was, now = seconds(before[cluster]), seconds(after[cluster])
        if was is None or now is None or now <= was or not 0 < interval < now:
            continue
        found.append(Finding(MEDIUM, RULE, (
            f"{cluster}: --auto-compaction-retention {before[cluster]} -> {after[cluster]} keeps no more history: "
            f"the apiservers compact this store every {interval / 60:g} min (kube-apiserver "
            "--etcd-compaction-interval, default 5m: k8s.io/apiserver storagebackend DefaultCompactInterval), each "
            "time to the revision the run before saw, so etcd holds 5 to 10 minutes of history whatever its own "
            "retention (etcd's periodic compaction is the backstop with every apiserver down). The change still "
            "replaces every member (see the replacement lines). For history to debug with, keep etcd snapshots "
            "(the stack's etcd backups) or the apiservers' audit log"), (cluster,)))
    return found
