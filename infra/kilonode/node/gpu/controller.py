"""The GPU health taint controller: runs on each apiserver VM, reads every Node's GPUHealthy
condition (set by the agent on the node, kilonode.gpu.agent) and owns the GPU taints.

    python3 -m kilonode.gpu.controller --kubeconfig /etc/kubernetes/gpu-health-controller.kubeconfig

Level-triggered and idempotent: `decide(node)` looks at one Node as it is now and returns the
Node to write (or nothing) and the Events to record. Every write is a PUT carrying the
resourceVersion that was read, so the apiserver refuses it (409) if anything changed in
between; the controller then reads again and decides again. That makes one instance per
apiserver VM safe without leader election: two instances deciding on the same Node write
the same thing, and the second write is refused or changes nothing.

The rules (kilonode.gpu.protocol names the keys):
- True/Passed: remove the startup and check-running taints; remove the fault taint only if
  the Node's bootID differs from the boot the failure was seen in (a reboot whose checks
  passed). In the failing boot itself the agent never reports True (sticky per boot).
- False: remove the startup and check-running taints (the check has run) and add the fault
  taint once per failure, recording the failure's lastTransitionTime and bootID in
  annotations. A failure already recorded whose taint is gone was returned to service by a
  person: it is not tainted again.
- Unknown/ActiveCheckRequested: add the check-running taint (the agent waits for it before
  its idle re-check, so the scheduler places no GPU pod meanwhile).
- While a node carries the fault taint or the startup taint the autoscaler may not remove it
  (`cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"`): both make the node
  unready to the autoscaler (startup taints, so a fleet-wide fault halts it), and an unready
  node without work would otherwise be deleted after 20 minutes -- a faulty one with its
  evidence, a pending one while its agent waits for the NVSwitch fabric or runs its first
  check. The hold is set whether or not the agent has reported yet (the kubelet registers the
  startup taint before the agent's first condition), and goes when neither taint is left (the
  checks passed; a reboot whose checks passed, or a person, for a fault), and only if the
  controller set it: a hold someone else set is never removed.

With --metrics-file it keeps a record of its work for Prometheus (kilonode.gpu.metrics): when it
last had a current view of the Nodes, what it wrote, the conflicts and errors it met.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import protocol as p
from .metrics import ControllerRecord

CONTROLLER = "kilonode.io/gpu-health-controller"
# Bounds: retries of one Node's write on 409 Conflict; a watch's length (the server ends it);
# reconnects in a row that fail before the controller exits (systemd restarts it); a full
# list every RESYNC_S so a missed watch event is corrected within minutes.
CONFLICT_RETRIES = 5
WATCH_TIMEOUT_S = 300
FAILED_RECONNECTS_MAX = 10
RESYNC_S = 600


@dataclass
class Decision:
    node: dict[str, Any] | None  # the Node to PUT, or None: nothing to change
    events: list[dict[str, Any]] = field(default_factory=list)


def _without(taints: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [t for t in taints if t.get("key") != key]


def _has(taints: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    return next((t for t in taints if t.get("key") == key), None)


def decide(node: dict[str, Any], instance: str = "controller") -> Decision:
    """What to change on this Node, and the Events saying so. Pure."""
    condition = p.gpu_condition(node) or {}
    status, reason = condition.get("status"), condition.get("reason", "")
    taints: list[dict[str, Any]] = list(node.get("spec", {}).get("taints") or [])
    annotations: dict[str, str] = dict(node.get("metadata", {}).get("annotations") or {})
    before_taints, before_annotations = copy.deepcopy(taints), dict(annotations)
    notes: list[tuple[str, str, str]] = []  # (event type, reason, message)

    def remove(key: str, why: str) -> None:
        nonlocal taints
        present = _has(taints, key)
        if present is not None:
            taints = _without(taints, key)
            notes.append(("Normal", "GPUHealthTaintRemoved",
                          f"removed taint {key}={present.get('value', '')}:{present.get('effect')}: {why}"))

    def add(key: str, value: str, kind: str, why: str) -> None:
        nonlocal taints
        present = _has(taints, key)
        if present is not None and present.get("value") == value and present.get("effect") == p.EFFECT:
            return
        taints = [*_without(taints, key), p.taint(key, value)]
        notes.append((kind, "GPUHealthTaintAdded", f"added taint {key}={value}:{p.EFFECT}: {why}"))

    boot = p.boot_id(node)
    if status == "True" and reason == p.REASON_PASSED:
        remove(p.STARTUP_TAINT, "the GPU health checks passed")
        remove(p.CHECK_TAINT, "the idle GPU re-check passed")
        failed_boot = annotations.get(p.ANNOTATION_BOOT)
        if _has(taints, p.FAULT_TAINT) is not None and failed_boot and boot and boot != failed_boot:
            remove(p.FAULT_TAINT, f"the GPU health checks passed after a reboot (boot {boot}, "
                                  f"the failure was in boot {failed_boot})")
    elif status == "False":
        since = str(condition.get("lastTransitionTime", ""))
        remove(p.STARTUP_TAINT, "the GPU health checks have run")
        remove(p.CHECK_TAINT, "the idle GPU re-check has run")
        if annotations.get(p.ANNOTATION_SINCE) != since:
            # a failure not seen before; the same failure with its taint gone was returned
            # to service by a person
            add(p.FAULT_TAINT, p.label_value(reason), "Warning",
                f"GPU health check failed: {condition.get('message', reason)}")
            annotations[p.ANNOTATION_SINCE] = since
            annotations[p.ANNOTATION_BOOT] = boot
    elif status == "Unknown" and reason == p.REASON_CHECK_REQUESTED:
        add(p.CHECK_TAINT, p.CHECK_VALUE, "Normal", "the GPU health agent runs its idle active check")
    _hold_while_pending_or_faulty(taints, annotations, notes)
    if taints == before_taints and annotations == before_annotations:
        return Decision(None)
    changed = copy.deepcopy(node)
    changed.setdefault("spec", {})["taints"] = taints
    if not taints:
        del changed["spec"]["taints"]
    changed.setdefault("metadata", {})["annotations"] = annotations
    events = [p.node_event(node, kind=kind, reason=why, message=message, action="Taint",
                           controller=CONTROLLER, instance=instance) for kind, why, message in notes]
    return Decision(changed, events)


def _hold_while_pending_or_faulty(taints: list[dict[str, Any]], annotations: dict[str, str],
                                  notes: list[tuple[str, str, str]]) -> None:
    """Keep a faulty or pending node from the autoscaler's scale-down; release only a hold of
    its own (ANNOTATION_HELD), once neither taint is left."""
    faulty = _has(taints, p.FAULT_TAINT) is not None
    pending = _has(taints, p.STARTUP_TAINT) is not None
    if (faulty or pending) and annotations.get(p.SCALE_DOWN_DISABLED) != "true":
        annotations[p.SCALE_DOWN_DISABLED] = "true"
        annotations[p.ANNOTATION_HELD] = "true"
        notes.append(("Normal", "GPUHealthScaleDownDisabled",
                      "the cluster autoscaler may not remove this node while it carries the fault taint: "
                      "it stays, with its evidence, until a reboot or a person returns it" if faulty else
                      f"the cluster autoscaler may not remove this node while its GPU health checks are pending "
                      f"({p.STARTUP_TAINT}={p.STARTUP_VALUE}: the agent waits for the GPUs' NVSwitch fabric or "
                      "runs its first check, both bounded): the hold goes when they pass"))
    elif not (faulty or pending) and annotations.pop(p.ANNOTATION_HELD, None) is not None:
        annotations.pop(p.SCALE_DOWN_DISABLED, None)
        notes.append(("Normal", "GPUHealthScaleDownEnabled",
                      "the GPU health taints are gone: the cluster autoscaler may remove this node again"))


# --- the loop (needs an apiserver) ----------------------------------------------------------

def reconcile(client: Any, node: dict[str, Any], instance: str, log: Any = print,
              record: ControllerRecord | None = None) -> None:
    """decide + PUT, reading again on 409 Conflict, at most CONFLICT_RETRIES times; `record`
    counts the writes, their taints, the conflicts and the give-ups."""
    from .kubeapi import ApiError

    name = node["metadata"]["name"]
    record = record if record is not None else ControllerRecord(time.time())  # counted nowhere
    for _ in range(CONFLICT_RETRIES):
        decision = decide(node, instance)
        if decision.node is None:
            return
        try:
            client.replace_node(decision.node)
        except ApiError as error:
            if error.status == 409:
                record.conflicts += 1
                node = client.get_node(name)
                continue
            raise
        record.note_write(node, decision.node)
        for event in decision.events:
            log(f"{name}: {event['message'].splitlines()[0]}")
            try:
                client.create_event(event)
            except ApiError as error:
                record.event_errors += 1
                log(f"{name}: could not record the Event: {error}")
        return
    record.gave_up += 1
    log(f"{name}: gave up after {CONFLICT_RETRIES} conflicting writes; the next resync tries again")


class Recorder:
    """The controller's record and where it goes (None: kept in memory only). Writing it never
    stops the controller: a failure is logged once and tried again at the next save."""

    def __init__(self, path: Path | None, log: Any) -> None:
        self.record = ControllerRecord(time.time())
        self.path, self.log, self.failed = path, log, False

    def save(self, force: bool = False) -> None:
        if self.path is None:
            return
        try:
            self.record.save(self.path, time.time(), force)
            self.failed = False
        except OSError as error:
            if not self.failed:
                self.log(f"the metrics record cannot be written: {error}")
            self.failed = True


def run(client: Any, instance: str, log: Any = print, recorder: Recorder | None = None) -> None:
    """List, reconcile each, watch from the list's resourceVersion; list again every RESYNC_S
    or when the watch breaks. Exits (for systemd to restart) after FAILED_RECONNECTS_MAX
    failures in a row. A list reconciled, and a watch the apiserver ends normally, are each a
    current view of every Node: the record's last sync."""
    failures = 0
    recorder = recorder or Recorder(None, log)
    record = recorder.record
    recorder.save(force=True)
    while True:
        try:
            listing = client.list_nodes()
            items = listing.get("items", [])
            for node in items:
                reconcile(client, node, instance, log, record)
                recorder.save()
            version = listing["metadata"]["resourceVersion"]
            record.note_list(items, time.time())
            recorder.save(force=True)
            started = time.monotonic()
            while time.monotonic() - started < RESYNC_S:
                for event in client.watch("/api/v1/nodes", version, WATCH_TIMEOUT_S):
                    kind, obj = event.get("type"), event.get("object", {})
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old; list again
                        raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind in ("ADDED", "MODIFIED"):
                        reconcile(client, obj, instance, log, record)
                        recorder.save()
                record.last_sync = time.time()  # the apiserver ended the watch: nothing was missed
                recorder.save(force=True)
            failures = 0
        except Exception as error:  # any failure: log, pause, list again (bounded)
            failures += 1
            record.errors += 1
            recorder.save(force=True)
            log(f"error ({failures}/{FAILED_RECONNECTS_MAX}): {error}")
            if failures >= FAILED_RECONNECTS_MAX:
                raise SystemExit(1) from error
            time.sleep(min(60, 2 ** failures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kilonode.gpu.controller", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--decide", type=Path, metavar="NODE_JSON",
                        help="print the decision for one Node object (JSON) and exit; changes nothing")
    parser.add_argument("--metrics-file", type=Path, metavar="FILE",
                        help="keep a record of the controller's work there, for Prometheus (kilonode.gpu.metrics)")
    args = parser.parse_args(argv)
    import socket

    from .kubeapi import Client, KubeconfigError, load_kubeconfig

    instance = socket.gethostname()
    if args.decide:
        decision = decide(json.loads(args.decide.read_text()), instance)
        print(json.dumps({"node": decision.node, "events": decision.events}, indent=2))
        return 0
    if args.kubeconfig is None:
        parser.error("--kubeconfig is required (or --decide NODE_JSON)")
    try:
        client = Client(load_kubeconfig(args.kubeconfig))
    except KubeconfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    def log(line: str) -> None:
        print(line, flush=True)

    run(client, instance, log, Recorder(args.metrics_file, log))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
