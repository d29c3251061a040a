"""The rollout's steps carried out: cordon and uncordon (a Node's spec.unschedulable), drain (the
Eviction API, pod by pod, as `kubectl drain` does), upgrade (the scale set's model applied to the
batch's instances, then those instances reimaged). Each long operation prints its progress and
is bounded; one that fails marks its scale set failed in the journal and pauses the rollout with
what failed and what to do (`fail`).

Cordon puts the cluster autoscaler's scale-down opt-out on each node in the same write
(model.SCALE_DOWN_DISABLED, with model.ROLLOUT_HOLD saying it is the rollout's: hold_patch), and
uncordon lifts it: a cordoned, drained fabric is otherwise "unneeded" and deleted by the
autoscaler during the upgrade, the boot or the hold (model.SCALE_DOWN_DISABLED says where upstream).

Drain, as kubectl drain (k8s.io/kubectl/pkg/drain): DaemonSet pods are left (their controller
would put them back; they go with the node), mirror pods too (the kubelet's static pods: the API
cannot evict them); finished pods need nothing. Every other pod gets an Eviction: 429 means a
PodDisruptionBudget does not allow it yet, retried every few seconds until the drain's deadline;
404 means it is gone already; anything else fails the drain. Then the drain waits (bounded) until
the evicted pods are gone from the node.

Why upgrade, and reimage only some: updateInstances (manualUpgrade) brings each instance to the
scale set's model; where the image version changes it re-provisions the OS disk from the new
image, a boot with the model's custom data, so a reimage after it would only boot the instance a
second time. Where only the custom data changed, updateInstances leaves the OS disk, and the
reimage boots each one from a fresh OS disk of the model so the new custom data runs, as on a new
VM. decide chooses, per instance of the batch (Action.reimage), from the instance's image
reference and the model's (kilonode.rollout.observe).

Safe to send again (a step that ended during an Azure call, its journal saying "upgrade" in
flight): updateInstances on an instance already at the model has nothing to apply, and decide
re-sends a reimage only to instances whose Node has not booted since the batch was taken. Where
Azure's first operation still runs, Azure refuses the second one as a conflict: the upgrade
fails, the rollout pauses, and `resume` sends it again once the first has ended.

Crash safety: `execute` calls `save` with the journal before each action (Progress.doing names
it, the phase decide entered already recorded) and after it (doing cleared), so a step that ends
mid-action leaves the journal saying what was in flight, and the next step carries it out again.

Least privilege. Azure (a custom role on the pools' resource group, `<cluster>-nodes`):
- Microsoft.Compute/virtualMachineScaleSets/read (the scale set)
- Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read (its instances: observe)
- Microsoft.Compute/virtualMachineScaleSets/manualUpgrade/action (updateInstances)
- Microsoft.Compute/virtualMachineScaleSets/reimage/action (reimage of the batch's instances)
Reading a long operation's status needs no other action (Azure answers it to whoever started it).
Kubernetes (a ClusterRole bound to the operator or the rollout's ServiceAccount):
- nodes: get, list, patch (observe; cordon and uncordon, each with the scale-down hold put on or
  lifted in the same write; the pending taint put and lifted)
- pods: list (observe's gang pods; the drain's pods on each node; a cut gang's pods elsewhere)
- pods/eviction: create (the drain)
- services/proxy: get on `monitoring/prometheus` (the alerts, unless --prometheus names a URL)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kilonode.k8s.gang import POD_GROUP_LABEL
from kilonode.node.gpu import protocol
from kilonode.rollout.model import (
    PENDING_TAINT_EFFECT,
    PENDING_TAINT_KEY,
    ROLLOUT_HOLD,
    SCALE_DOWN_DISABLED,
    Action,
    Journal,
)
from kilonode.rollout.observe import sdk_missing

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # the kubelet's static pods' mirror (corev1.MirrorPodAnnotationKey)


# --- the drain's choices: pure ---------------------------------------------------------------------

@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def eviction_candidates(pods: Iterable[Any]) -> tuple[list[PodRef], list[tuple[PodRef, str]]]:
    """The pods (V1Pod) a drain evicts, and those it leaves with why."""
    evict, left = [], []
    for pod in pods:
        meta = pod.metadata
        ref = PodRef(meta.namespace, meta.name, meta.uid or "")
        owners = meta.owner_references or []
        phase = pod.status.phase if pod.status else None
        if MIRROR_ANNOTATION in (meta.annotations or {}):
            left.append((ref, "a mirror pod (static, the kubelet's)"))
        elif any(o.kind == "DaemonSet" and o.controller for o in owners):
            left.append((ref, "a DaemonSet's pod"))
        elif phase in ("Succeeded", "Failed"):
            left.append((ref, f"finished ({phase})"))
        else:
            evict.append(ref)
    return evict, left


Outcome = Literal["evicted", "gone", "blocked", "error"]


def eviction_outcome(status: int) -> Outcome:
    """The Eviction API's answer: 201/200 evicted; 404 the pod is gone; 429 a PodDisruptionBudget
    does not allow it now (retry); anything else an error (500: several budgets match the pod)."""
    if status in (200, 201):
        return "evicted"
    if status == 404:
        return "gone"
    if status == 429:
        return "blocked"
    return "error"


@dataclass(frozen=True)
class Limits:
    """How long each operation may take (seconds) and how often the drain retries."""

    evict_s: float = 900.0  # a PodDisruptionBudget may hold a pod this long before the drain fails
    retry_s: float = 5.0  # kubectl drain retries a 429 every 5 s
    gone_s: float = 600.0  # evicted pods' grace periods to run out
    azure_s: float = 3600.0  # one updateInstances or reimage of a batch (100 GPU VMs)
    poll_s: float = 15.0  # progress lines this often


def hold_patch(node: Any, hold: bool, unschedulable: bool | None = None) -> dict[str, Any] | None:
    """The patch (a V1Node as read) that cordons or uncordons (`unschedulable`; None: neither) and
    puts on or lifts the rollout's scale-down hold; None where nothing changes. Put on only where
    SCALE_DOWN_DISABLED is not "true" already, then with ROLLOUT_HOLD beside it: a hold someone
    else set is theirs. Lifted only where ROLLOUT_HOLD is: the marker goes, and the annotation too
    unless the GPU health controller marked it its own meanwhile (ANNOTATION_HELD: it set the
    annotation between observe and this write), in which case the controller lifts it. The
    controller also puts its hold back at once on a node with a GPU fault or startup taint that
    this lifts (it watches Nodes: kilonode.node.gpu.controller._hold_while_pending_or_faulty)."""
    annotations = dict(node.metadata.annotations or {})
    body: dict[str, Any] = {}
    if unschedulable is not None and bool(node.spec and node.spec.unschedulable) != unschedulable:
        body["spec"] = {"unschedulable": unschedulable}
    if hold and annotations.get(SCALE_DOWN_DISABLED) != "true":
        body["metadata"] = {"annotations": {SCALE_DOWN_DISABLED: "true", ROLLOUT_HOLD: "true"}}
    elif not hold and ROLLOUT_HOLD in annotations:
        lift: dict[str, str | None] = {ROLLOUT_HOLD: None}
        if protocol.ANNOTATION_HELD not in annotations:
            lift[SCALE_DOWN_DISABLED] = None
        body["metadata"] = {"annotations": lift}
    return body or None


def retry_due(blocked_since: float, now: float, limits: Limits) -> bool:
    """Whether a blocked eviction is tried again (True) or the drain gives up (False)."""
    return now - blocked_since < limits.evict_s


# --- failures: pure ----------------------------------------------------------------------------------

def fail(journal: Journal, action: Action, error: BaseException, now: float) -> str:
    """Mark the action's scale set failed and pause the rollout with what to do. Returns the text."""
    todo = {
        "cordon": "check the operator's RBAC (nodes patch) and the apiserver",
        "uncordon": "check the operator's RBAC (nodes get, patch); `kubectl uncordon` the nodes by hand if needed "
                    f"and `kubectl annotate node NODE {SCALE_DOWN_DISABLED}- {ROLLOUT_HOLD}-` where {ROLLOUT_HOLD} is",
        "hold": "check the operator's RBAC (nodes get, patch), then `kilonode rollout resume`",
        "release": f"check the operator's RBAC (nodes get, patch); `kubectl annotate node NODE {SCALE_DOWN_DISABLED}- "
                   f"{ROLLOUT_HOLD}-` lifts it by hand",
        "taint": "check the operator's RBAC (nodes get, patch), then `kilonode rollout resume`",
        "untaint": f"check the operator's RBAC (nodes get, patch); `kubectl taint nodes NODE {PENDING_TAINT_KEY}-` "
                   "lifts it by hand",
        "evict": "see which of the gangs' pods remain (`kubectl get pods -A -l scheduling.x-k8s.io/pod-group`) "
                 "and the PodDisruptionBudgets that hold them, then `kilonode rollout resume`",
        "drain": "see which pods remain (`kubectl get pods -A --field-selector spec.nodeName=NODE`), the "
                 "PodDisruptionBudgets that hold them (`kubectl get pdb -A`), then `kilonode rollout resume`",
        "upgrade": "see the instances in the portal or `az vmss list-instances`; fix the cause (quota, image "
                   "replication, capacity), then `kilonode rollout resume`",
    }.get(action.kind, "see the error, then `kilonode rollout resume`")
    text = (f"{action.scale_set}: {action.kind} failed: {type(error).__name__}: {str(error).strip()[:500]}. "
            f"{todo}. Nodes cordoned so far stay cordoned (kilonode.rollout.execute)")
    progress = journal.of(action.scale_set)
    if action.kind not in ("taint", "untaint", "hold", "release"):
        progress.phase, progress.since, progress.why = "failed", now, f"{action.kind} failed"
    # else its phase stands: the steering taint and the hold are no step of the scale set's, and the next step
    # after `resume` computes it again from the nodes as they are
    progress.doing, progress.doing_nodes = "", ()  # resume retries it by its why
    journal.paused = text
    journal.log.append(f"{now:.0f} {action.scale_set} failed {action.kind}: {type(error).__name__}")
    return text


# --- the calls ----------------------------------------------------------------------------------------

@dataclass
class Executor:
    """Carries actions out against the cluster: the kubernetes ApiClient and a
    ComputeManagementClient (or anything with their methods), the pools' resource group."""

    kube: Any
    compute: Any
    resource_group: str
    say: Callable[[str], None] = print
    limits: Limits = field(default_factory=Limits)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.kube)

    def cordon(self, nodes: Sequence[str], unschedulable: bool = True) -> None:
        """Cordon each node and put the rollout's scale-down hold on it, or uncordon it and lift
        the hold, in one write per node (hold_patch)."""
        changed = self._nodes(nodes, lambda found: hold_patch(found, unschedulable, unschedulable))
        self.say(f"  {'cordoned' if unschedulable else 'uncordoned'} {len(nodes)} nodes "
                 f"({SCALE_DOWN_DISABLED} {'put on' if unschedulable else 'lifted from'} {changed})")

    def hold(self, nodes: Sequence[str], present: bool = True) -> None:
        """The scale-down hold alone (decide._holds: a node that lost it, or kept it)."""
        changed = self._nodes(nodes, lambda found: hold_patch(found, present))
        self.say(f"  {SCALE_DOWN_DISABLED} {'put on' if present else 'lifted from'} {changed} nodes")

    def _nodes(self, nodes: Sequence[str], patch: Callable[[Any], dict[str, Any] | None]) -> int:
        """Read each node, patch it with what `patch` makes of it (None: nothing to change),
        carrying the resourceVersion read: a 409 (the GPU health controller or agent wrote first)
        reads it again, a few times at most. Returns how many hold annotations changed."""
        from kubernetes.client.exceptions import ApiException

        core, changed = self._core(), 0
        for node in nodes:
            for _attempt in range(5):
                found = core.read_node(node)
                body = patch(found)
                if body is None:
                    break
                try:
                    core.patch_node(node, {**body, "metadata": {**body.get("metadata", {}),
                                                                "resourceVersion": found.metadata.resource_version}})
                    changed += "annotations" in body.get("metadata", {})
                    break
                except ApiException as error:
                    if int(error.status or 0) != 409:
                        raise
            else:
                raise RuntimeError(f"{node}: it kept changing under 5 writes in a row")
        return changed

    def taint(self, nodes: Sequence[str], present: bool = True) -> None:
        """Put the rollout's PreferNoSchedule taint on each node, or lift it. A Node's taints are one
        list with no merge key (core/v1 NodeSpec.taints), so a patch replaces all of them: each write
        carries the resourceVersion it read, and a 409 (another writer, such as the GPU health agent
        adding its own taint, came first) reads the node again, a few times at most."""
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        wanted = {"key": PENDING_TAINT_KEY, "effect": PENDING_TAINT_EFFECT}
        changed = 0
        for node in nodes:
            for _attempt in range(5):
                found = core.read_node(node)
                taints = [core.api_client.sanitize_for_serialization(t) for t in (found.spec.taints or [])]
                has = any(t.get("key") == PENDING_TAINT_KEY for t in taints)
                if has == present:
                    break
                kept = [t for t in taints if t.get("key") != PENDING_TAINT_KEY] + ([wanted] if present else [])
                try:
                    core.patch_node(node, {"metadata": {"resourceVersion": found.metadata.resource_version},
                                           "spec": {"taints": kept}})
                    changed += 1
                    break
                except ApiException as error:
                    if int(error.status or 0) != 409:
                        raise
            else:
                raise RuntimeError(f"{node}: its taints kept changing under 5 writes in a row")
        done = "tainted" if present else "untainted"
        self.say(f"  {done} {changed} nodes ({PENDING_TAINT_KEY}:{PENDING_TAINT_EFFECT})")

    def drain(self, nodes: Sequence[str]) -> None:
        core = self._core()
        pending: list[PodRef] = []
        for node in nodes:
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            evict, left = eviction_candidates(pods)
            pending += evict
            for ref, why in left:
                self.say(f"  {node}: leaves {ref}: {why}")
        self.say(f"  evicting {len(pending)} pods from {len(nodes)} nodes")
        evicted = self._evict_all(core, pending)
        self._wait_gone(core, nodes, evicted)

    def evict_groups(self, groups: Sequence[str], nodes: Sequence[str]) -> None:
        """Evict every pod of each PodGroup ("namespace/group") wherever it runs, as a drain evicts
        (PodDisruptionBudgets respected), and wait until they are gone from `nodes`: a gang the
        rollout cuts is evicted whole, never left running in part on another fabric."""
        core = self._core()
        pending: list[PodRef] = []
        for group in groups:
            namespace, _, name = group.partition("/")
            pods = core.list_namespaced_pod(namespace, label_selector=f"{POD_GROUP_LABEL}={name}").items
            evict, _ = eviction_candidates(pods)
            pending += evict
        self.say(f"  evicting {len(pending)} pods of gangs {', '.join(groups)} (on {len(nodes)} nodes elsewhere too)")
        self._wait_gone(core, nodes, self._evict_all(core, pending))

    def _evict_all(self, core: Any, pending: list[PodRef]) -> list[PodRef]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        start, evicted, last = self.clock(), [], 0.0
        while pending:
            blocked = []
            for ref in pending:
                body = client.V1Eviction(metadata=client.V1ObjectMeta(name=ref.name, namespace=ref.namespace))
                try:
                    core.create_namespaced_pod_eviction(ref.name, ref.namespace, body)
                    outcome: Outcome = "evicted"
                except ApiException as error:
                    outcome = eviction_outcome(int(error.status or 0))
                    if outcome == "error":
                        raise RuntimeError(f"evicting {ref}: HTTP {error.status} {error.reason}") from None
                if outcome == "evicted":
                    evicted.append(ref)
                elif outcome == "blocked":
                    blocked.append(ref)
            pending = blocked
            if not pending:
                break
            if not retry_due(start, self.clock(), self.limits):
                raise TimeoutError(f"{len(pending)} pods still held by PodDisruptionBudgets after "
                                   f"{self.limits.evict_s:.0f} s: {', '.join(map(str, pending[:5]))}")
            if self.clock() - last >= self.limits.poll_s:
                held = ", ".join(map(str, pending[:3]))
                self.say(f"  {len(pending)} pods held by PodDisruptionBudgets, retrying ({held})")
                last = self.clock()
            self.sleep(self.limits.retry_s)
        return evicted

    def _wait_gone(self, core: Any, nodes: Sequence[str], evicted: Sequence[PodRef]) -> None:
        waiting, start = {r.uid for r in evicted}, self.clock()
        while waiting:
            left = set()
            for node in nodes:
                pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
                left |= {p.metadata.uid for p in pods} & waiting
            waiting = left
            if not waiting:
                break
            if self.clock() - start > self.limits.gone_s:
                raise TimeoutError(f"{len(waiting)} evicted pods still on the nodes after {self.limits.gone_s:.0f} s")
            self.say(f"  {len(waiting)} evicted pods still terminating")
            self.sleep(self.limits.poll_s)
        self.say(f"  drained: {len(evicted)} pods evicted")

    def upgrade(self, scale_set: str, instances: Sequence[str], reimage: Sequence[str] = ()) -> None:
        try:
            from azure.mgmt.compute.models import (
                VirtualMachineScaleSetReimageParameters,
                VirtualMachineScaleSetVMInstanceRequiredIDs,
            )
        except ImportError as error:
            raise sdk_missing("azure-mgmt-compute", error) from None
        sets = self.compute.virtual_machine_scale_sets
        if instances:
            ids = list(instances)
            self._wait(f"{scale_set}: updateInstances ({len(ids)} instances)", sets.begin_update_instances(
                self.resource_group, scale_set, VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=ids)))
        if reimage:
            ids = list(reimage)
            self._wait(f"{scale_set}: reimage ({len(ids)} instances)", sets.begin_reimage(
                self.resource_group, scale_set, VirtualMachineScaleSetReimageParameters(instance_ids=ids)))

    def _wait(self, what: str, poller: Any) -> None:
        """An Azure long-running operation (LROPoller): progress every poll_s, bounded by azure_s."""
        start = self.clock()
        while not poller.done():
            if self.clock() - start > self.limits.azure_s:
                raise TimeoutError(f"{what} still {poller.status()} after {self.limits.azure_s:.0f} s "
                                   "(it goes on in Azure; `kilonode rollout resume` once it ends)")
            self.say(f"  {what}: {poller.status()} ({self.clock() - start:.0f} s)")
            poller.wait(timeout=self.limits.poll_s)
        poller.result()  # raises HttpResponseError where the operation failed
        self.say(f"  {what}: done in {self.clock() - start:.0f} s")


def compute_client(subscription_id: str) -> Any:
    try:
        from azure.identity import DefaultAzureCredential
        from azure.mgmt.compute import ComputeManagementClient
    except ImportError as error:
        raise sdk_missing("azure-mgmt-compute and azure-identity", error) from None
    return ComputeManagementClient(DefaultAzureCredential(), subscription_id)


def describe(action: Action) -> str:
    """One line for an action, as `step` prints it (and --dry-run)."""
    what = {"cordon": f"cordon {len(action.nodes)} nodes", "drain": f"drain {len(action.nodes)} nodes",
            "upgrade": f"upgrade {len(action.instances)} instances, reimage {len(action.reimage)}",
            "evict": f"evict gangs {', '.join(action.groups)} whole ({len(action.nodes)} nodes elsewhere)",
            "uncordon": f"uncordon {len(action.nodes)} nodes",
            "taint": f"taint {len(action.nodes)} nodes {PENDING_TAINT_KEY}:{PENDING_TAINT_EFFECT}",
            "untaint": f"lift {PENDING_TAINT_KEY} from {len(action.nodes)} nodes",
            "hold": f"put {SCALE_DOWN_DISABLED} on {len(action.nodes)} nodes",
            "release": f"lift the rollout's {SCALE_DOWN_DISABLED} from {len(action.nodes)} nodes",
            }.get(action.kind, action.kind)
    where = f"{action.scale_set}: " if action.scale_set else ""
    return f"{where}{what}" + (f" ({action.why})" if action.why else "")


CARRIED = ("cordon", "evict", "drain", "upgrade", "uncordon", "taint", "untaint", "hold", "release")


def _carry(executor: Executor, action: Action) -> None:
    if action.kind in ("cordon", "uncordon"):
        executor.cordon(action.nodes, unschedulable=action.kind == "cordon")
    elif action.kind in ("taint", "untaint"):
        executor.taint(action.nodes, present=action.kind == "taint")
    elif action.kind in ("hold", "release"):
        executor.hold(action.nodes, present=action.kind == "hold")
    elif action.kind == "evict":
        executor.evict_groups(action.groups, action.nodes)
    elif action.kind == "drain":
        executor.drain(action.nodes)
    else:
        executor.upgrade(action.scale_set, action.instances, action.reimage)


def execute(actions: Iterable[Action], journal: Journal, executor: Executor, now: float,
            save: Callable[[Journal], None] = lambda journal: None) -> list[str]:
    """Carry out each cordon, evict, drain, upgrade, uncordon in order; stop at the first failure
    (the scale set failed, the rollout paused: `fail`). `save` writes the journal before each
    action, with the action in flight (Progress.doing), and after it. Returns what was done."""
    done = []
    for action in actions:
        if action.kind not in CARRIED:
            continue
        executor.say(describe(action))
        progress = journal.of(action.scale_set)
        progress.doing = action.kind
        progress.doing_nodes = action.nodes if action.kind in ("uncordon", "release") else ()
        save(journal)
        try:
            _carry(executor, action)
        except Exception as error:  # any failure pauses the rollout with its text
            done.append(f"FAILED {fail(journal, action, error, now)}")
            save(journal)
            return done
        progress.doing, progress.doing_nodes = "", ()
        save(journal)
        done.append(describe(action))
    return done
