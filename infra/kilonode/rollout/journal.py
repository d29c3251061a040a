"""The rollout's journal on disk: JSON, written whole to a temporary file and renamed over the old
one, so a rollout stopped at any point (a crash, Ctrl-C, a lost laptop lid) resumes from the
last step it recorded, never from half a file."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kilonode.rollout.model import PHASES, Journal, Policy, Progress

VERSION = 1


def dumps(journal: Journal) -> str:
    return json.dumps({"version": VERSION, **asdict(journal)}, indent=2, sort_keys=True) + "\n"


def loads(text: str, source: str = "the journal") -> Journal:
    try:
        raw: dict[str, Any] = json.loads(text)
        if raw.get("version") != VERSION:
            raise ValueError(f"version {raw.get('version')!r}, this kilonode reads version {VERSION}")
        progress = {}
        for name, p in raw["progress"].items():
            if p["phase"] not in PHASES:
                raise ValueError(f"{name}: phase {p['phase']!r} is none of {', '.join(PHASES)}")
            # the fields after boot_ids came later: a journal written before them reads with their defaults
            progress[name] = Progress(phase=p["phase"], since=float(p["since"]), why=str(p["why"]),
                                      gangs_cut=tuple(p["gangs_cut"]), taken=tuple(p["taken"]),
                                      boot_ids=dict(p["boot_ids"]), doing=str(p.get("doing", "")),
                                      doing_nodes=tuple(p.get("doing_nodes", ())),
                                      cordoned_ahead=tuple(p.get("cordoned_ahead", ())),
                                      gangs_since=float(p.get("gangs_since", 0.0)),
                                      passing_since=float(p.get("passing_since", 0.0)),
                                      upgrade_sent={str(n): float(t) for n, t in p.get("upgrade_sent", {}).items()})
        policy = raw["policy"]
        return Journal(stack=str(raw["stack"]), target=str(raw["target"]),
                       policy=Policy(**{**policy, "order": tuple(policy["order"])}), progress=progress,
                       paused=str(raw["paused"]), canary_passed_at=float(raw["canary_passed_at"]),
                       log=[str(line) for line in raw["log"]], prometheus=str(raw.get("prometheus", "")))
    except KeyError as error:
        raise ValueError(f"{source} cannot be read: it has no {error}; it was not changed") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source} cannot be read: {error}; it was not changed") from None


def load(path: Path) -> Journal:
    return loads(path.read_text(encoding="utf-8"), str(path))


def save(journal: Journal, path: Path) -> None:
    """Replace `path` with the journal, atomically (same directory, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(dumps(journal))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Busy(RuntimeError):
    """Another process holds the journal (kilonode.rollout.journal.locked)."""


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the journal for one process: a second `kilonode rollout run` or `step` on the same
    journal (a colleague's terminal, a forgotten tmux pane) would take the same scale set twice and
    each overwrite the other's record. An exclusive flock on `<journal>.lock`, released when the
    process ends however it ends (the kernel drops it with the file), naming who holds it. It
    guards processes on one machine and one filesystem (flock(2); over NFS only where the server
    supports it): the journal is one operator's file (docs/operations.md says where to keep it)."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise Busy(f"{path}: {holder} is running this rollout; wait for it to stop (or stop it), then run "
                       "again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def pause_request(path: Path) -> Path:
    """Where `kilonode rollout pause` leaves its request while a process holds the journal: the
    holder reads it at its next step (take_pause_request), so a pause is never lost to the
    holder's next save over the journal."""
    return path.with_name(path.name + ".pause")


def take_pause_request(journal: Journal, path: Path, now: float) -> bool:
    """Apply a waiting pause request to the journal and remove it; True where there was one."""
    request = pause_request(path)
    try:
        why = request.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return False
    journal.paused = f"paused by the operator: {why}"
    journal.log.append(f"{now:.0f} paused: {why}")
    request.unlink(missing_ok=True)
    return True


def set_aside(path: Path, now: float) -> Path:
    """Move an existing journal out of the way (`start --force`), kept beside it with the time in
    its name: it holds what the earlier rollout did (its gangs_cut, its log), which a rollback needs."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    aside = path.with_name(f"{path.stem}.{stamp}Z{path.suffix}")
    number = 1
    while aside.exists():  # two in one second: never overwrite one set aside
        aside, number = path.with_name(f"{path.stem}.{stamp}Z.{number}{path.suffix}"), number + 1
    os.replace(path, aside)
    return aside


def resume(journal: Journal, now: float) -> list[str]:
    """Clear the pause; each failed scale set goes back to the step that failed: a cordon or drain
    (kilonode.rollout.execute.fail: why "cordon failed", "evict failed", "drain failed") to pending,
    its batch to be taken again; an upgrade to cordoned, to be upgraded again; a gate (decide's
    timeout) to its gate. Every wait for gangs starts again (a pause past gang_wait_s).
    Returns what changed, for the operator."""
    said = []
    for progress in journal.progress.values():
        progress.gangs_since = 0.0
    for name, progress in journal.progress.items():
        if progress.phase != "failed":
            continue
        if progress.why in ("cordon failed", "evict failed", "drain failed"):
            progress.phase, progress.why, progress.taken = "pending", "drain retried", ()
            said.append(f"{name}: its batch is taken again (cordon, drain)")
        elif progress.why == "upgrade failed":
            progress.phase, progress.why = "cordoned", "upgrade retried"
            said.append(f"{name}: its upgrade is tried again")
        else:
            progress.phase, progress.why = "gating", "resumed"
            said.append(f"{name}: its gate is tried again")
        progress.since = now
        journal.log.append(f"{now:.0f} {name} {progress.phase} {progress.why}")
    if journal.paused:
        said.append(f"no longer paused ({journal.paused.split('.')[0]})")
        journal.paused = ""
    journal.log.append(f"{now:.0f} resumed")
    return said
