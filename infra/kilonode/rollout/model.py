"""What a rollout sees and remembers. Plain data: `observe` builds a ClusterState from the Azure
and Kubernetes APIs, a test from a recorded JSON file; `decide` reads both and changes neither."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kilonode.node.gpu import protocol

# A scale set's progress through one rollout, in order. `failed` stops the rollout (paused) until
# the operator resumes it (the gate is tried again) or rolls back.
Phase = Literal["pending", "cordoned", "upgrading", "gating", "done", "failed"]
# The taint a rollout puts on every node not yet at its scale set's model (Policy.steer): with
# effect PreferNoSchedule the scheduler's TaintToleration score ranks those nodes last, never
# refusing them (kubernetes pkg/scheduler/framework/plugins/tainttoleration: Score counts the
# intolerable PreferNoSchedule taints), so a gang that restarts after a rollout cut it lands on a
# fabric already rolled, not on one the rollout takes next, while room lasts.
PENDING_TAINT_KEY = "kilonode.io/rollout-pending"
PENDING_TAINT_EFFECT = "PreferNoSchedule"
PHASES: tuple[Phase, ...] = ("pending", "cordoned", "upgrading", "gating", "done", "failed")
# The cluster autoscaler's per-node opt-out of scale-down: a candidate whose annotation is exactly
# "true" is skipped (kubernetes/autoscaler cluster-autoscaler/core/scaledown/eligibility/eligibility.go,
# HasNoScaleDownAnnotation, read at 0a11e9c1; FAQ "How can I prevent Cluster Autoscaler from scaling
# down a particular node?"). Nothing there, nor in processors/nodes/pre_filtering_processor.go, skips
# a cordoned node: a fabric the rollout keeps cordoned and empty through its upgrade, boot and hold
# is "unneeded" to an autoscaler run with kilonode's GPU threshold (kilonode.k8s.autoscaler) and
# is deleted after --scale-down-unneeded-time. So every node the rollout cordons carries it.
SCALE_DOWN_DISABLED = protocol.SCALE_DOWN_DISABLED
# Says the rollout set SCALE_DOWN_DISABLED (the autoscaler honours only the value "true", so the
# value cannot say whose it is): set with it in the same write, and the rollout removes only an
# annotation that carries it. One set by someone else (a person; the GPU health controller, which
# marks its own with kilonode.node.gpu.protocol.ANNOTATION_HELD) is left alone. On the Node rather
# than in the journal: written in the same patch as the annotation (no crash can separate the two),
# it outlives a journal set aside (`start --force`), and `kubectl get node` shows whose hold it is.
ROLLOUT_HOLD = "kilonode.io/rollout-held"


@dataclass(frozen=True)
class Instance:
    """One VM of a scale set and its Node (None: not registered, or not found)."""

    instance_id: str
    node: str | None
    latest_model: bool  # Azure's latestModelApplied: it runs the scale set's model (image, custom data)
    ready: bool = False  # the Node's Ready condition
    schedulable: bool = True  # not cordoned (spec.unschedulable false)
    gpu_pending: bool = False  # carries a GPU health taint (startup checks not passed, or a fault)
    # the Node's status.nodeInfo.bootID: it changes when the machine boots, so a gate can tell a
    # node reimaged into the model from one that has not gone down yet (its Ready still the old one)
    boot_id: str = ""
    # the instance's storageProfile.imageReference ('' where observe could not read it): compared
    # with its scale set's model image, since latestModelApplied alone can say "current" of an
    # instance whose image is not the model's (after a rollback) and cannot say whether the image
    # or only the custom data differs (kilonode.rollout.decide reimages only for the latter)
    image: str = ""
    steered: bool = False  # carries the rollout's PENDING_TAINT_KEY taint
    scale_down_disabled: bool = False  # SCALE_DOWN_DISABLED is "true", whoever set it
    held: bool = False  # carries ROLLOUT_HOLD: the rollout set SCALE_DOWN_DISABLED
    # The GPU health agent's GPUHealthy condition (kilonode.node.gpu.protocol.CONDITION): its status
    # ('' none) and lastTransitionTime (seconds since the epoch, 0 unknown). The agent keeps its
    # state per boot (in /run), so its first report in a boot always carries a lastTransitionTime
    # of that report (kilonode.node.gpu.agent._report): a verdict older than the reimage is the old boot's.
    gpu_condition: str = ""
    gpu_since: float = 0.0


@dataclass(frozen=True)
class ScaleSet:
    name: str
    pool: str
    infiniband: bool  # one fabric: taken whole, never in part (RDMA reaches only one scale set's VMs)
    instances: tuple[Instance, ...]
    model_image: str = ""  # the scale set model's storageProfile.imageReference ('' unknown)
    gpu: bool = False  # a GPU pool's: its gate needs each rebooted node's GPU verdict from the new boot

    def at_model(self, instance: Instance) -> bool:
        """Azure says the instance runs the model, and its image is the model's where both are known."""
        known = bool(self.model_image and instance.image)
        return instance.latest_model and (not known or instance.image == self.model_image)

    def image_changes(self, instance: Instance) -> bool:
        """Its image differs from the model's: updateInstances re-provisions its OS disk from the new
        image (a boot with the model's custom data), so no reimage follows. Unknown: False (reimage)."""
        return bool(self.model_image and instance.image and instance.image != self.model_image)

    @property
    def current(self) -> bool:
        """Every instance runs the scale set's model: nothing to roll."""
        return all(self.at_model(i) for i in self.instances)


@dataclass(frozen=True)
class ClusterState:
    """What the rollout reads before each step."""

    scale_sets: tuple[ScaleSet, ...]
    gangs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> the PodGroups with a pod there
    firing: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pool -> alerts firing for it
    at: float = 0.0  # when it was read (seconds since the epoch)
    # why the pool's alerts could not be read ('' when they were): unknown alerts block every gate
    # and every new take, never pass them (Prometheus down, or evicted by this very rollout)
    alerts_unknown: str = ""
    # The cluster's Prometheus pod (kilonode.k8s.monitoring: StatefulSet `prometheus`, one replica,
    # in the monitoring namespace): its name and node ('' none bound), whether its Ready condition
    # is True, and why it could not be read ('' it was). Read for a Policy.without_alerts gate,
    # which waits on this instead of on the alerts that Prometheus would serve.
    prometheus_pod: str = ""
    prometheus_node: str = ""
    prometheus_ready: bool = False
    prometheus_unknown: str = ""

    def scale_set(self, name: str) -> ScaleSet | None:
        return next((s for s in self.scale_sets if s.name == name), None)


@dataclass(frozen=True)
class Policy:
    """How the rollout may go. Defaults are the cautious ones, each with its reason."""

    # The order scale sets are taken in: the canary first (a pool's first scale set, or a canary pool).
    order: tuple[str, ...]
    # Scale sets in progress at once after the canary: each is a whole fabric, and a GPU pool's
    # capacity drops by that many fabrics meanwhile.
    in_flight: int = 1
    # Instances of a scale set without InfiniBand upgraded at once (a fabric is always whole).
    batch: int = 50
    # The canary alone, then this long (seconds) with its gate passing before any other starts.
    soak_s: int = 1800
    # How long a gate may take (seconds) before the scale set is failed and the rollout pauses.
    gate_timeout_s: int = 3600
    # Take a fabric where a gang runs: only when the operator allows it (a maintenance window).
    # Each gang it cuts is evicted whole, on every node it runs on (a cross-fabric gang too).
    cut_gangs: bool = False
    # Pending scale sets cordoned ahead of their turn, in order, so no new gang lands there while
    # the rollout waits for the ones running there to finish (else a busy pool never frees a fabric).
    cordon_ahead: int = 1
    # How long a scale set may wait for its gangs (seconds) before the rollout pauses naming them.
    gang_wait_s: int = 86400
    # How long a gate must keep passing (seconds) before it passes: an alert's `for:` must have
    # had time to fire. The CLI sets the longest `for:` among the pool's alerts (kilonode.render.monitoring).
    hold_s: int = 600
    # Taint every node not yet rolled PreferNoSchedule (PENDING_TAINT_KEY), lifted once its batch
    # passes its gate: new and restarted gangs prefer the fabrics already rolled (and the new
    # instances a scale-out brings, at the model already), so a gang evicted once is not placed
    # where the rollout evicts it again. It never keeps a pod off a node that has room elsewhere only.
    steer: bool = True
    # The pool whose gates read no alerts ('' none): only the pool that runs the cluster's
    # Prometheus (kilonode.k8s.monitoring's nodeSelector; the CLI refuses any other), where the
    # rollout evicts the very Prometheus its gates would read, so alerting is dark for the whole
    # step (dark_alerting). Its gate needs, besides the node checks, that Prometheus is Ready again
    # (ClusterState.prometheus_ready), held hold_s; any other pool's alerts are still read and
    # still block (decide._alerts). `start --without-alerts` sets it, recorded here in the journal.
    without_alerts: str = ""


def dark_alerting(pool: str) -> str:
    """What `status` and `step` say of a Policy.without_alerts rollout, every time."""
    return f"alerting is dark while pool {pool} rolls: its Prometheus is the one evicted"


@dataclass
class Progress:
    """One scale set's place in the journal."""

    phase: Phase = "pending"
    since: float = 0.0  # when it entered the phase
    why: str = ""  # why it is failed, or what it waits for
    gangs_cut: tuple[str, ...] = ()  # the PodGroups whose pods its drain evicted (cut_gangs)
    taken: tuple[str, ...] = ()  # the instances this batch took (cordoned, drained, upgraded)
    boot_ids: dict[str, str] = field(default_factory=dict)  # node -> its boot ID when it was taken
    # node -> when the upgrade that boots it was last sent (decide's `now`): the GPU verdict the gate
    # takes must be newer (Instance.gpu_since), so never the old boot's
    upgrade_sent: dict[str, float] = field(default_factory=dict)
    # The action being carried out when the journal was last saved ('' none): saved before the
    # action and cleared after it, so a step that died mid-action (a drain, an Azure call) is
    # carried out again by the next step instead of being taken as done.
    doing: str = ""
    doing_nodes: tuple[str, ...] = ()  # the nodes of an uncordon in flight (taken is cleared by then)
    cordoned_ahead: tuple[str, ...] = ()  # nodes cordoned ahead of its turn (Policy.cordon_ahead)
    gangs_since: float = 0.0  # when it began waiting only for its gangs (0: it does not)
    passing_since: float = 0.0  # when its gate began passing (0: it does not), for Policy.hold_s


@dataclass
class Journal:
    """What a rollout has done, kept in a file between runs (kilonode.rollout.journal)."""

    stack: str
    target: str  # what the scale sets move to, as the operator named it (an image version, a commit)
    policy: Policy
    progress: dict[str, Progress] = field(default_factory=dict)
    paused: str = ""  # why it is paused; empty while it runs
    canary_passed_at: float = 0.0
    log: list[str] = field(default_factory=list)
    # Prometheus' URL given at start (the monitoring pool's rollout needs one outside the pool)
    prometheus: str = ""

    def of(self, name: str) -> Progress:
        return self.progress.setdefault(name, Progress())


@dataclass(frozen=True)
class Action:
    """One step `execute` carries out, or a reason to wait; `decide` returns them in order."""

    # cordon also puts the rollout's scale-down hold on each node (SCALE_DOWN_DISABLED, ROLLOUT_HOLD)
    # and uncordon lifts it; hold and release do only that, where a node lost its hold or kept it
    kind: Literal["cordon", "evict", "drain", "upgrade", "uncordon", "taint", "untaint", "hold", "release", "wait",
                  "pause", "done"]
    scale_set: str = ""
    nodes: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()  # upgrade: updateInstances on these
    why: str = ""
    reimage: tuple[str, ...] = ()  # upgrade: then reimage these (their image did not change)
    groups: tuple[str, ...] = ()  # evict: every pod of these PodGroups ("namespace/group"), wherever it runs
