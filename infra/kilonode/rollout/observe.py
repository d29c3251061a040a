"""What a rollout reads before each step: a pool's scale sets from Azure, their Nodes and gang
pods from Kubernetes, the pool's alerts from Prometheus, joined into one ClusterState.

Each source is a pure parser (the SDK's model objects, or the JSON an API answers, in; our
dataclasses out), tested on the APIs' own reference payloads, and a thin call that only fetches:

- Azure (azure-mgmt-compute, ComputeManagementClient.virtual_machine_scale_set_vms.list): per
  instance its instanceId, latestModelApplied, osProfile.computerName and
  storageProfile.imageReference; virtual_machine_scale_sets.get for the model's
  virtualMachineProfile.storageProfile.imageReference (an instance is at the model only when
  both agree, and decide reimages only where the image does not change). No `expand`: the
  instance view (power state, statuses) is not needed, and leaving it out keeps the response
  small and the role to .../virtualMachines/read and .../virtualMachineScaleSets/read.
- Kubernetes (the official `kubernetes` client): each Node's Ready condition, spec.unschedulable,
  status.nodeInfo.bootID, the GPU health taints and the GPUHealthy condition's status and
  lastTransitionTime (kilonode.node.gpu.protocol), the autoscaler's scale-down-disabled
  annotation and the rollout's mark beside it (kilonode.rollout.model.ROLLOUT_HOLD); the pods that
  carry the PodGroup label (kilonode.k8s.gang.POD_GROUP_LABEL), as node -> "namespace/group".
- Prometheus: GET /api/v1/alerts, through the apiserver's service proxy to the cluster's
  Prometheus (kilonode.k8s.monitoring) or at a URL the operator gives; an alert counts for a pool
  when its `pool` label names it (the GPU pool alerts of kilonode.render.monitoring carry it).
  Prometheus unreachable, or an answer that is not one: the state says the alerts are unknown
  (ClusterState.alerts_unknown), which blocks every gate; it never reads as "no alert firing".
  A rollout started --without-alerts (Policy.without_alerts: the pool that runs that Prometheus)
  reads no alerts at all, and says so in alerts_unknown (any other pool's gate stays blocked).
- The cluster's Prometheus pod (kilonode.k8s.monitoring: StatefulSet `prometheus`, one replica,
  so its pod is `prometheus-0`, labelled app.kubernetes.io/name=prometheus, in `monitoring`):
  its Ready condition and spec.nodeName, what a --without-alerts gate waits on.

A node is found by name: kilonode's nodes register under their computer name lower-cased (the
kubelet lower-cases its hostname; no --hostname-override), and a Uniform scale set names each
instance computerNamePrefix (the shard's name, kilonode.azure.node_pool) + its instance ID in
base 36, six characters (kilonode.node.node_client_approver.rules says where that is written).

The SDKs are imported inside the thin calls: the rest of kilonode runs without them.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kilonode.k8s.gang import POD_GROUP_LABEL
from kilonode.node.gpu import protocol
from kilonode.plan.wellknown import POOL_LABEL
from kilonode.rollout.model import (
    PENDING_TAINT_KEY,
    ROLLOUT_HOLD,
    SCALE_DOWN_DISABLED,
    ClusterState,
    Instance,
    ScaleSet,
)

if TYPE_CHECKING:
    from kilonode.plan.model import ClusterPlan

INSTALL = "pip install 'kilonode[rollout]'"
# The cluster's Prometheus (kilonode.k8s.monitoring: Service `prometheus`, port `web` 9090, in the
# monitoring namespace), reached through the apiserver's service proxy.
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_SERVICE = "prometheus:web"
# Its pod: a StatefulSet's pods are named <statefulset>-<ordinal> (kubernetes
# pkg/controller/statefulset/stateful_set_utils.go getPodName), and carry the template's labels
# (kilonode.k8s.monitoring.PROMETHEUS_LABELS; tests/rollout/test_without_alerts.py holds the two equal).
PROMETHEUS_POD_PREFIX = "prometheus-"
PROMETHEUS_SELECTOR = "app.kubernetes.io/name=prometheus"
ALERT_POOL_LABEL = "pool"  # what kilonode.render.monitoring's GPU pool rules put on their alerts
GPU_TAINTS = (protocol.STARTUP_TAINT, protocol.FAULT_TAINT)
PAGE = 500  # list pages: a 7,500-node cluster's Nodes are never one response
DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class MissingSdk(RuntimeError):
    """An SDK the rollout needs is not installed (a RuntimeError: the CLI prints it as one line)."""


def sdk_missing(what: str, error: ImportError) -> MissingSdk:
    return MissingSdk(f"the rollout needs {what}, which is not installed ({error.name}): {INSTALL}")


# --- the scale sets the plan names ---------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str  # the scale set, also its computerNamePrefix
    pool: str
    infiniband: bool
    team: str | None = None  # the team whose reserved shard it is (None: shared capacity)
    gpu: bool = False  # a GPU pool's (its gate needs a GPU health pass from each node's new boot)


def targets(plan: ClusterPlan, pool: str) -> tuple[Target, ...]:
    """The pool's scale sets in the plan's order. Raises ValueError for a pool the plan lacks."""
    gpu = pool in {p.name for p in plan.gpu_pools}
    for candidate in plan.node_pools:
        if candidate.name == pool:
            return tuple(Target(s.name, pool, candidate.infiniband, s.team, gpu) for s in candidate.shards)
    raise ValueError(f"the plan has no pool {pool!r} (it has {', '.join(p.name for p in plan.node_pools)})")


# Alerts the gate checks itself, more strictly: KilonodeGpuHealthPending fires after an hour of a
# node carrying the startup taint, which the gate refuses at once (Instance.gpu_pending). Their
# `for:` needs no hold.
GATE_CHECKS_ITSELF = ("KilonodeGpuHealthPending",)
HOLD_DEFAULT_S = 600


def hold_s(plan: ClusterPlan, pool: str) -> int:
    """How long a gate is held once it passes: the longest `for:` among the alerts that can fire
    for the pool (a `pool` label in their result, the GPU pools' rules of kilonode.render.monitoring),
    so one has had time to fire; 10 minutes where none can (a pool without GPUs)."""
    from kilonode.render.monitoring import Alert, gpu_group, gpu_health_groups

    if pool not in {p.name for p in plan.gpu_pools}:
        return HOLD_DEFAULT_S
    groups = [g for g in (gpu_group(plan), *gpu_health_groups(plan)) if g is not None]
    durations = [_duration_s(r.duration) for g in groups for r in g.rules
                 if isinstance(r, Alert) and r.name not in GATE_CHECKS_ITSELF]
    return max(durations, default=HOLD_DEFAULT_S)


def _duration_s(text: str) -> int:
    """A Prometheus `for:` of one unit (1m, 15m, 1h) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]


def computer_name(prefix: str, instance_id: str) -> str:
    """What Azure names a Uniform scale set's instance: prefix + base-36 instance ID, six digits."""
    number, digits = int(instance_id), ""
    while number:
        number, digit = divmod(number, 36)
        digits = DIGITS[digit] + digits
    return prefix + digits.rjust(6, "0")


# --- Azure ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Vm:
    instance_id: str
    node: str  # the Node it registers as (its computer name, lower-cased)
    latest_model: bool
    image: str = ""  # its storageProfile.imageReference (image_name), '' where the answer has none


def image_name(reference: Any) -> str:
    """An ImageReference (azure-mgmt-compute) as one comparable string: a gallery image version's
    resource ID (kilonode.azure.node_pool pins one), a shared or community gallery's ID, else
    publisher:offer:sku:version (exactVersion where Azure resolved `latest`); '' for none.
    Lower-cased: Azure resource IDs compare case-insensitively."""
    if reference is None:
        return ""
    for attribute in ("id", "shared_gallery_image_id", "community_gallery_image_id"):
        value = getattr(reference, attribute, None)
        if value:
            return str(value).lower()
    parts = [getattr(reference, a, None) or "" for a in ("publisher", "offer", "sku")]
    version = getattr(reference, "exact_version", None) or getattr(reference, "version", None) or ""
    return ":".join([*parts, version]).lower() if any(parts) else ""


def _storage_image(profile: Any) -> str:
    storage = getattr(profile, "storage_profile", None) if profile is not None else None
    return image_name(getattr(storage, "image_reference", None) if storage is not None else None)


def model_image(scale_set: Any) -> str:
    """A VirtualMachineScaleSet (virtual_machine_scale_sets.get) -> its model's image (image_name)."""
    return _storage_image(getattr(scale_set, "virtual_machine_profile", None))


def vms_from_azure(scale_set: str, vms: Iterable[Any]) -> tuple[Vm, ...]:
    """VirtualMachineScaleSetVM models (azure-mgmt-compute) -> Vm, by instance ID. An instance
    the list shows without latestModelApplied (a minimal answer, one being created) counts as
    not at the model; one without osProfile gets the name Azure derives from its instance ID."""
    found = []
    for vm in vms:
        instance_id = vm.instance_id or str(vm.id or "").rpartition("/")[2]
        if not instance_id:
            continue
        os_profile = getattr(vm, "os_profile", None)
        name = getattr(os_profile, "computer_name", None) if os_profile is not None else None
        if not name:
            name = computer_name(scale_set, instance_id) if instance_id.isdigit() else ""
        latest = bool(getattr(vm, "latest_model_applied", False))
        found.append(Vm(instance_id, name.lower(), latest, _storage_image(vm)))
    return tuple(sorted(found, key=lambda v: (len(v.instance_id), v.instance_id)))


def list_vms(subscription_id: str, resource_group: str,
             names: Iterable[str]) -> dict[str, tuple[str, tuple[Vm, ...]]]:
    """The thin call: each scale set's model image and instances, with DefaultAzureCredential
    (az login, a managed identity, or AZURE_* environment variables)."""
    try:
        from azure.identity import DefaultAzureCredential
        from azure.mgmt.compute import ComputeManagementClient
    except ImportError as error:
        raise sdk_missing("azure-mgmt-compute and azure-identity", error) from None
    client = ComputeManagementClient(DefaultAzureCredential(), subscription_id)
    return {name: (model_image(client.virtual_machine_scale_sets.get(resource_group, name)),
                   vms_from_azure(name, client.virtual_machine_scale_set_vms.list(resource_group, name)))
            for name in names}


# --- Kubernetes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeFacts:
    ready: bool
    schedulable: bool
    gpu_pending: bool
    boot_id: str
    steered: bool = False  # carries the rollout's pending taint (kilonode.rollout.model.PENDING_TAINT_KEY)
    scale_down_disabled: bool = False  # the autoscaler's opt-out is "true" (kilonode.rollout.model.SCALE_DOWN_DISABLED)
    held: bool = False  # the rollout set it (kilonode.rollout.model.ROLLOUT_HOLD)
    gpu_condition: str = ""  # the GPUHealthy condition's status ('' none)
    gpu_since: float = 0.0  # its lastTransitionTime, seconds since the epoch (0 unknown)


def _seconds(when: Any) -> float:
    """A condition's time as the client gives it (a datetime; a string in a raw answer) -> epoch s."""
    if when is None or when == "":
        return 0.0
    if isinstance(when, str):
        from datetime import datetime

        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    return float(when.timestamp())


def node_facts(node: Any) -> tuple[str, NodeFacts]:
    """A V1Node (the kubernetes client's model) -> its name and what the gate reads."""
    spec, status = node.spec, node.status
    conditions = (status.conditions if status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    gpu = next((c for c in conditions if c.type == protocol.CONDITION), None)
    taints = (spec.taints if spec else None) or []
    info = status.node_info if status else None
    annotations = node.metadata.annotations or {}
    return node.metadata.name, NodeFacts(
        ready=ready, schedulable=not (spec and spec.unschedulable),
        gpu_pending=any(t.key in GPU_TAINTS for t in taints), boot_id=(info.boot_id if info else "") or "",
        steered=any(t.key == PENDING_TAINT_KEY for t in taints),
        scale_down_disabled=annotations.get(SCALE_DOWN_DISABLED) == "true", held=ROLLOUT_HOLD in annotations,
        gpu_condition=str(gpu.status or "") if gpu else "",
        gpu_since=_seconds(gpu.last_transition_time) if gpu else 0.0)


def gangs_from_pods(pods: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """V1Pods -> node -> the PodGroups ("namespace/group") with a pod bound there and not finished."""
    found: dict[str, set[str]] = defaultdict(set)
    for pod in pods:
        group = (pod.metadata.labels or {}).get(POD_GROUP_LABEL)
        node = pod.spec.node_name if pod.spec else None
        phase = pod.status.phase if pod.status else None
        if group and node and phase not in ("Succeeded", "Failed"):
            found[node].add(f"{pod.metadata.namespace}/{group}")
    return {node: tuple(sorted(groups)) for node, groups in sorted(found.items())}


def kube_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient from a kubeconfig (KUBECONFIG, ~/.kube/config), or in-cluster credentials."""
    try:
        from kubernetes import client, config
    except ImportError as error:
        raise sdk_missing("the kubernetes client", error) from None
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except config.ConfigException:
        if kubeconfig:
            raise
        config.load_incluster_config()
    return client.ApiClient()


def _pages(call: Any, **kwargs: Any) -> Iterable[Any]:
    """Every item of a paginated list call (limit/continue)."""
    token = None
    while True:
        answer = call(limit=PAGE, _continue=token, **kwargs) if token else call(limit=PAGE, **kwargs)
        yield from answer.items
        # `var_continue` in the client's pydantic models (37), `_continue` before
        token = getattr(answer.metadata, "var_continue", None) or getattr(answer.metadata, "_continue", None)
        if not token:
            return


def list_nodes_and_gangs(api: Any, pools: Iterable[str]) -> tuple[dict[str, NodeFacts], dict[str, tuple[str, ...]]]:
    """The thin call: the pools' Nodes (by their kilonode.io/pool label) and every gang pod."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    selector = f"{POOL_LABEL} in ({','.join(sorted(pools))})"
    nodes = dict(node_facts(n) for n in _pages(core.list_node, label_selector=selector))
    gangs = gangs_from_pods(_pages(core.list_pod_for_all_namespaces, label_selector=POD_GROUP_LABEL,
                                   field_selector="status.phase!=Succeeded,status.phase!=Failed"))
    return nodes, gangs


# --- Prometheus ----------------------------------------------------------------------------------

def firing_from_alerts(payload: Mapping[str, Any], pools: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Prometheus' /api/v1/alerts answer -> pool -> the names of its alerts firing (pending ones,
    not yet past their `for`, do not count)."""
    if payload.get("status") != "success":
        raise ValueError(f"Prometheus answered {payload.get('status')!r}: {payload.get('error', '')}")
    wanted, found = set(pools), defaultdict(set)
    for alert in payload.get("data", {}).get("alerts", []):
        labels = alert.get("labels", {})
        if alert.get("state") == "firing" and labels.get(ALERT_POOL_LABEL) in wanted:
            found[labels[ALERT_POOL_LABEL]].add(labels.get("alertname", "?"))
    return {pool: tuple(sorted(names)) for pool, names in sorted(found.items())}


def read_firing(api: Any, url: str | None, pools: Iterable[str]) -> tuple[dict[str, tuple[str, ...]], str]:
    """The pools' firing alerts, or ({}, why they are unknown). Any failure to read them (Prometheus
    down, evicted by this rollout, the proxy refusing, an answer that is not Prometheus') makes
    them unknown, which blocks every gate: a gate never passes on alerts it could not read."""
    try:
        return firing_from_alerts(fetch_alerts(api, url), pools), ""
    except Exception as error:  # unknown, whatever the cause; the text says which
        where = url or f"{PROMETHEUS_NAMESPACE}/{PROMETHEUS_SERVICE} through the apiserver"
        return {}, f"Prometheus at {where}: {type(error).__name__}: {str(error).strip()[:200]}"


def fetch_alerts(api: Any, url: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """The thin call: GET /api/v1/alerts at `url`, or through the apiserver's service proxy."""
    if url:
        import urllib.request

        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/alerts", timeout=timeout_s) as answer:
            return dict(json.loads(answer.read()))
    from kubernetes import client

    answer = client.CoreV1Api(api).connect_get_namespaced_service_proxy_with_path(
        PROMETHEUS_SERVICE, PROMETHEUS_NAMESPACE, "api/v1/alerts", _preload_content=False,
        _request_timeout=timeout_s)
    return dict(json.loads(getattr(answer, "data", answer)))


@dataclass(frozen=True)
class PrometheusPod:
    name: str = ""  # '' none found
    node: str = ""  # spec.nodeName ('' not bound: Pending)
    ready: bool = False  # its Ready condition is True


def prometheus_from_pods(pods: Iterable[Any]) -> PrometheusPod:
    """V1Pods of the monitoring namespace -> the cluster's Prometheus pod: one named
    prometheus-<ordinal> and not being deleted. An evicted pod terminates for up to its grace
    period (300 s, kilonode.k8s.monitoring) on its old node, and its replacement has
    the same name (getPodName), so it is created only once that one is gone: one read mid-deletion
    is never taken for Prometheus Ready again. A Ready one first, else a bound one."""
    found = []
    for pod in pods:
        name = pod.metadata.name or ""
        if not name.startswith(PROMETHEUS_POD_PREFIX) or pod.metadata.deletion_timestamp is not None:
            continue
        conditions = (pod.status.conditions if pod.status else None) or []
        ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
        node = (pod.spec.node_name if pod.spec else None) or ""
        found.append(PrometheusPod(name, node, ready and bool(node)))
    return max(found, key=lambda p: (p.ready, bool(p.node), p.name), default=PrometheusPod())


def read_prometheus(api: Any) -> tuple[PrometheusPod, str]:
    """The thin call: the Prometheus pod, or (none, why it could not be read)."""
    from kubernetes import client

    try:
        pods = client.CoreV1Api(api).list_namespaced_pod(PROMETHEUS_NAMESPACE, label_selector=PROMETHEUS_SELECTOR)
        return prometheus_from_pods(pods.items), ""
    except Exception as error:  # unknown, whatever the cause: a gate waiting on it does not pass
        return PrometheusPod(), f"{PROMETHEUS_NAMESPACE}/{PROMETHEUS_POD_PREFIX}*: {type(error).__name__}: " \
            f"{str(error).strip()[:200]}"


# --- joined ---------------------------------------------------------------------------------------

def scale_set_state(target: Target, vms: Iterable[Vm], nodes: Mapping[str, NodeFacts],
                    image: str = "") -> ScaleSet:
    """One scale set as the rollout sees it: each instance with its Node (None: not registered),
    and the model's image (`image`, '' unknown)."""
    instances = []
    for vm in vms:
        facts = nodes.get(vm.node)
        if facts is None:
            instances.append(Instance(vm.instance_id, None, vm.latest_model, image=vm.image))
        else:
            instances.append(Instance(vm.instance_id, vm.node, vm.latest_model, ready=facts.ready,
                                      schedulable=facts.schedulable, gpu_pending=facts.gpu_pending,
                                      boot_id=facts.boot_id, image=vm.image, steered=facts.steered,
                                      scale_down_disabled=facts.scale_down_disabled, held=facts.held,
                                      gpu_condition=facts.gpu_condition, gpu_since=facts.gpu_since))
    return ScaleSet(target.name, target.pool, target.infiniband, tuple(instances), model_image=image,
                    gpu=target.gpu)


@dataclass(frozen=True)
class Sources:
    """Where observe reads: the subscription, the kubeconfig, Prometheus (None: the service proxy).
    without_alerts: the pool a --without-alerts rollout rolls ('' none): no alerts are read."""

    subscription_id: str
    kubeconfig: str | None = None
    context: str | None = None
    prometheus_url: str | None = None
    without_alerts: str = ""


def observe(plan: ClusterPlan, sets: Iterable[Target], sources: Sources) -> ClusterState:
    """The cluster now, for the scale sets `sets` (targets() of a pool, or a part of it)."""
    sets = tuple(sets)
    pools = sorted({t.pool for t in sets})
    vms = list_vms(sources.subscription_id, plan.node_resource_group, [t.name for t in sets])
    api = kube_client(sources.kubeconfig, sources.context)
    nodes, gangs = list_nodes_and_gangs(api, pools)
    if sources.without_alerts:
        # not read, and said: decide passes over them for that pool only, any other stays blocked
        firing, unknown = {}, f"not read: the rollout was started --without-alerts for pool {sources.without_alerts}"
    else:
        firing, unknown = read_firing(api, sources.prometheus_url, pools)
    prometheus, prometheus_unknown = read_prometheus(api)
    return ClusterState(tuple(scale_set_state(t, vms[t.name][1], nodes, vms[t.name][0]) for t in sets),
                        gangs=gangs, firing=firing, at=time.time(), alerts_unknown=unknown,
                        prometheus_pod=prometheus.name, prometheus_node=prometheus.node,
                        prometheus_ready=prometheus.ready, prometheus_unknown=prometheus_unknown)


# --- a recorded state (`--state FILE`, `--record FILE`) --------------------------------------------

def state_to_json(state: ClusterState) -> str:
    return json.dumps(asdict(state), indent=2, sort_keys=True) + "\n"


def state_from_json(text: str, source: str = "the state") -> ClusterState:
    """A ClusterState as state_to_json wrote it. Raises ValueError naming what is wrong."""
    try:
        raw = json.loads(text)
        sets = tuple(ScaleSet(str(s["name"]), str(s["pool"]), bool(s["infiniband"]),
                              tuple(Instance(**i) for i in s["instances"]), str(s.get("model_image", "")),
                              bool(s.get("gpu", False)))
                     for s in raw["scale_sets"])
        return ClusterState(sets, gangs={n: tuple(g) for n, g in raw.get("gangs", {}).items()},
                            firing={p: tuple(a) for p, a in raw.get("firing", {}).items()},
                            at=float(raw.get("at", 0.0)), alerts_unknown=str(raw.get("alerts_unknown", "")),
                            prometheus_pod=str(raw.get("prometheus_pod", "")),
                            prometheus_node=str(raw.get("prometheus_node", "")),
                            prometheus_ready=bool(raw.get("prometheus_ready", False)),
                            prometheus_unknown=str(raw.get("prometheus_unknown", "")))
    except KeyError as error:
        raise ValueError(f"{source} cannot be read: it has no {error}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source} cannot be read: {error}") from None
