"""In-cluster objects whose change costs more than the resource diff says (independent trace of
kilonode diff on research-7500, findings 5 to 7):

- a replaced Service: pulumi-kubernetes replaces an object that keeps its fixed metadata.name
  delete-before-replace (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go, Diff:
  `deleteBeforeReplace := len(replaces) > 0 && !metadata.IsAutonamed(newInputs) &&` same name
  and namespace; read in the search index's copy, not at the pinned provider's tag), so the
  Service is gone from the delete on, stays gone if the create fails, and comes back with
  another ClusterIP;
- network.serviceCidr moved on a running cluster: kube-dns is such a Service, and its new
  ClusterIP lies outside the default ServiceCIDR `kubernetes`, which the apiservers created from
  the old range and never change (kubernetes/kubernetes
  pkg/controlplane/controller/defaultservicecidr/default_servicecidr_controller.go, sync and
  syncStatus: only a single- to dual-stack upgrade updates it, a mismatch is only reported as
  the event KubernetesDefaultServiceCIDRInconsistent; read at 04d6b4f1 in the search index, not
  at the pinned v1.34.2 tag); moving the range is a manual procedure (kubernetes.io "Kubernetes
  Default Service CIDR Reconfiguration", "Extend Service IP Ranges"); and the running kubelets
  keep the clusterDNS their instance's model gave them until it is upgraded;
- Prometheus restarted: a new pod (any pod-template change, its node resized or replaced) alerts
  nothing until it has replayed its WAL and scraped for each rule's `for:`. Its TSDB is on a
  claim of the StatefulSet's volumeClaimTemplates (kilonode.k8s.monitoring, docs/monitoring.md
  "Storage"), which the new pod mounts again, so the history stays, unless the change moves the
  data off that claim: to an emptyDir (lost with the pod), to a claim of another name (a new empty
  disk), or deletes the claim with the StatefulSet (persistentVolumeClaimRetentionPolicy
  whenDeleted: Delete); each side's StatefulSet says which (_data_volume). Its resources and
  retention are sized from the node count (kilonode.plan.resolve.monitoring), so a pool-size
  change alone can do it;
- an image whose tag moves under the same digest: a reference with both runs the digest and
  ignores the tag (Docker since 1.13, which the docker runtime's cri-dockerd pulls through:
  aws/amazon-ecs-agent#4256, "Docker simply ignores the tag during image pull"; docker/cli#2018,
  "<tag> is ignored"; containerd resolves a reference with a digest by the digest), so the
  pods keep running the old image while the stack names the new tag.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kilonode.plan import defaults
from kilonode.review.compare import CREATE, DELETE, REPLACE, UPDATE, ResourceChange, StackDiff, covers
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of
from kilonode.review.rules import VMSS

SERVICE = "kubernetes:core/v1:Service"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
COREDNS = "coredns"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"
WORKLOADS = {f"kubernetes:apps/v1:{k}" for k in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet")} | {
    "kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob", "kubernetes:core/v1:Pod"}
DNS_SERVICE = "kube-dns"
PROMETHEUS = "prometheus"
SERVICE_CIDR_CAUSE = "network.serviceCidr"


def _inputs(record: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = (record or {}).get("inputs")
    return found if isinstance(found, Mapping) else {}


def _meta(record: Mapping[str, Any] | None) -> tuple[str, str]:
    meta = _inputs(record).get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _cluster_ip(record: Mapping[str, Any] | None) -> str:
    return str((_inputs(record).get("spec") or {}).get("clusterIP") or "")


def _running(diff: StackDiff) -> bool:
    """The base is a deployed cluster: it has in-cluster objects to lose."""
    return any(str(r.get("type", "")).startswith("kubernetes:") for r in (diff.base or {}).get("resources", []))


def service_cidr(diff: StackDiff) -> list[Finding]:
    was = (plan_of(diff.base).get("controlPlane") or {})
    now = (plan_of(diff.head).get("controlPlane") or {})
    old, new = was.get("serviceCidr"), now.get("serviceCidr")
    if not old or not new or old == new or not _running(diff):
        return []
    dns_was, dns_now = was.get("clusterDnsIp", "?"), now.get("clusterDnsIp", "?")
    return [Finding(HIGH, "service-cidr-moved", (
        f"network.serviceCidr {old} -> {new} on a running cluster: cluster DNS is gone. The {DNS_SERVICE} Service "
        f"(a fixed name) is replaced for its new ClusterIP {dns_now}, and pulumi-kubernetes deletes a fixed-name "
        f"object before creating it again, so the Service goes first; its new ClusterIP lies outside the default "
        f"ServiceCIDR `kubernetes`, which the apiservers made from {old} and never change (the defaultservicecidr "
        "controller only reports the mismatch), so no range holds it and the create fails; and every running "
        f"kubelet keeps clusterDNS {dns_was} until its instance is upgraded to the new model, so its pods ask an "
        "address no Service answers. The other Services keep their ClusterIPs in the old range. Keep serviceCidr; "
        "to add addresses, add a ServiceCIDR beside it (kubernetes.io \"Extend Service IP Ranges\"); replacing the "
        "range is kubernetes.io's manual \"Kubernetes Default Service CIDR Reconfiguration\", not a `pulumi up`"),
        ("plan.yaml controlPlane.serviceCidr",), cause=SERVICE_CIDR_CAUSE)]


def services_replaced(diff: StackDiff) -> list[Finding]:
    """Every replaced Service, one line per cause: deleted before it is created, a new ClusterIP."""
    moved = bool(service_cidr(diff))
    groups: dict[str, list[ResourceChange]] = {}
    for c in diff.resources:
        if c.type == SERVICE and c.action == REPLACE:
            groups.setdefault(c.reason() or "an input that forces a new Service", []).append(c)
    found = []
    for why, changes in sorted(groups.items()):
        named = ", ".join(f"{'/'.join(_meta(c.base))} (ClusterIP {_cluster_ip(c.base) or 'allocated'} -> "
                          f"{_cluster_ip(c.head) or 'allocated anew'})" for c in changes)
        found.append(Finding(MEDIUM, "service-replaced", (
            f"{len(changes)} Service(s) replaced ({why}): {named}. pulumi-kubernetes deletes a fixed-name object "
            "before it creates the new one, so each Service is absent from the delete on, and stays absent if the "
            "create fails (`pulumi up` stops there); its ClusterIP changes, so whatever holds the old address "
            "(a kubelet's clusterDNS, a client's configuration, a cached DNS answer) loses it"),
            tuple(c.name for c in changes), cause=SERVICE_CIDR_CAUSE if moved and "clusterIP" in why else why))
    return found


def _template(record: Mapping[str, Any] | None) -> Any:
    return ((_inputs(record).get("spec") or {}).get("template"))


def _prometheus_changes(diff: StackDiff) -> list[ResourceChange]:
    return [c for c in diff.resources if c.type == STATEFULSET and c.action != CREATE
            and _meta(c.base)[1] == PROMETHEUS]


def _sizing_only(change: ResourceChange) -> bool:
    """Only the resources, GOMAXPROCS and the retention flags moved: the plan's sizing, which follows
    the node count (kilonode.plan.resolve.monitoring)."""
    paths = [i.path for i in change.inputs if not i.ignored]
    sized = ("spec.template.spec.containers[].resources", "spec.template.spec.containers[].env",
             "spec.template.spec.containers[].args", "spec.template.spec.volumes[].emptyDir")
    return bool(paths) and all(covers(p, sized) for p in paths)


# The pool fields Prometheus's sizing reads (kilonode.plan.resolve.monitoring series_terms, per_node_series):
# targets per pool, and per node the pods (cAdvisor, kube-state-metrics) and GPUs.
_SIZING_FIELDS = ("nodes", "podsPerNode", "maxPods", "gpusPerNode")


def _sizing_causes(diff: StackDiff) -> str:
    """What moved among the plan's inputs to Prometheus's sizing ("pool h100-ib podsPerNode 3 -> 8"), else a
    general phrase."""
    def pools(entry: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
        return {str(p.get("name")): p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping)}

    before, after = pools(diff.base), pools(diff.head)
    moved = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            moved.append(f"pool {name} {'added' if old is None else 'removed'}")
            continue
        fields = [(f, old.get(f), new.get(f)) for f in _SIZING_FIELDS]
        fields.append(("autoscaling.maxNodes", (old.get("autoscaling") or {}).get("maxNodes"),
                       (new.get("autoscaling") or {}).get("maxNodes")))
        changed = [f"{f} {a} -> {b}" for f, a, b in fields if a != b and not (f == "maxPods" and any(
            g == "podsPerNode" and x != y for g, x, y in fields))]  # maxPods follows podsPerNode: said once
        if changed:
            moved.append(f"pool {name} {', '.join(changed)}")
    if moved:
        return "; ".join(moved)
    # No pool input moved: the plan's own Prometheus figures did (a default or a hand edit), said as they are
    figures = _figures_moved(diff, _SIZING_FIGURES)
    return ("the plan's own figures, no pool input: " + ", ".join(figures)) if figures else \
        "neither a pool input nor a plan figure: the StatefulSet's rendering itself (kilonode.k8s.monitoring)"


def _figures_moved(diff: StackDiff, names: tuple[str, ...]) -> list[str]:
    """"prometheus.<figure> <before> -> <after>" for each of the plan's Prometheus figures among `names`
    that differs between the sides."""
    old_prom, new_prom = (plan_of(e).get("prometheus") or {} for e in (diff.base, diff.head))
    return [f"prometheus.{k} {old_prom.get(k)} -> {new_prom.get(k)}"
            for k in sorted(old_prom.keys() | new_prom.keys())
            if k in names and old_prom.get(k) != new_prom.get(k)]


# plan.yaml prometheus figures that reach the pod template (kilonode.k8s.monitoring): its sizing,
# which follows the series the plan estimates (the query gates follow its cores and memory,
# kilonode.plan.defaults.monitoring), and its behaviour, which no series count moves: how long a query
# may run, how often it scrapes and evaluates its rules, how its WAL is written. A behaviour figure
# moved is said as a behaviour change, not as sizing (the sixteenth trace, PR 12: --query.timeout)
_SIZING_FIGURES = ("cpus", "memoryGib", "diskGib", "retentionDays", "retentionSizeGib",
                   "queryMaxConcurrency", "queryMaxSamples")
_BEHAVIOUR_FIGURES = ("queryTimeout", "perNodeIntervalS", "controlPlaneIntervalS", "walCompression")
_RETENTION = "--storage.tsdb.retention.time="


def _prometheus_arg(record: Mapping[str, Any] | None, prefix: str) -> str | None:
    """The value of the Prometheus container's argument `prefix<value>` in the StatefulSet's pod template."""
    spec = (_template(record) or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        for arg in container.get("args") or [] if container.get("name") == PROMETHEUS else []:
            if str(arg).startswith(prefix):
                return str(arg)[len(prefix):]
    return None


def _retention_days(record: Mapping[str, Any] | None) -> float | None:
    """The Prometheus container's --storage.tsdb.retention.time in days (its unit letters: y w d h m s)."""
    text = _prometheus_arg(record, _RETENTION)
    parts = re.findall(r"(\d+)(ms|y|w|d|h|m|s)", text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"y": 365, "w": 7, "d": 1, "h": 1 / 24, "m": 1 / 1440, "s": 1 / 86400, "ms": 1 / 86400000}
    return sum(int(n) * scale[u] for n, u in parts)


def _days(value: float) -> str:
    return f"{value:g} d" if value >= 1 else f"{value * 24:g} h"


DATA_DIR = "/prometheus"  # where the container keeps its TSDB (kilonode.k8s.monitoring DATA_DIR)


def _data_volume(record: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """Where a Prometheus StatefulSet keeps DATA_DIR: ("claim", template name) for a volumeClaimTemplate,
    ("emptyDir", volume) for an emptyDir, (its source kind, volume) for anything else; None where
    there is no StatefulSet or no mount of DATA_DIR."""
    spec = _inputs(record).get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    mounts = [m for c in pod.get("containers") or [] if c.get("name") == PROMETHEUS
              for m in c.get("volumeMounts") or [] if str(m.get("mountPath", "")).rstrip("/") == DATA_DIR]
    if not mounts:
        return None
    name = str(mounts[0].get("name"))
    if name in {str((t.get("metadata") or {}).get("name")) for t in spec.get("volumeClaimTemplates") or []}:
        return "claim", name
    for volume in pod.get("volumes") or []:
        if volume.get("name") == name:
            kind = next((k for k in volume if k != "name"), "unknown")
            return kind, name
    return None


def _claim_template(record: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    spec = _inputs(record).get("spec") or {}
    return next((t.get("spec") or {} for t in spec.get("volumeClaimTemplates") or []
                 if (t.get("metadata") or {}).get("name") == name), {})


def _deletes_claims(record: Mapping[str, Any] | None) -> bool:
    """The StatefulSet's claims go with it (persistentVolumeClaimRetentionPolicy whenDeleted: Delete;
    Retain, the default, keeps them: apps/v1 StatefulSetPersistentVolumeClaimRetentionPolicy)."""
    policy = (_inputs(record).get("spec") or {}).get("persistentVolumeClaimRetentionPolicy") or {}
    return policy.get("whenDeleted") == "Delete"


def _history(c: ResourceChange) -> tuple[bool, str]:
    """(whether the new pod starts with the old pod's history, why), from the StatefulSet on each side."""
    before = _data_volume(c.base)
    after = None if c.action == DELETE else _data_volume(c.head)
    if before is None or before[0] != "claim":
        where = f"an {before[0]}" if before and before[0] == "emptyDir" else (
            f"a {before[0]} volume" if before else "no volume the review can read")
        return False, f"its TSDB is {where} on the node, so all of its history is gone"
    claim = f"{before[1]}-{PROMETHEUS}-0"  # the StatefulSet controller's claim name: <template>-<set>-<ordinal>
    if c.action in (REPLACE, DELETE) and _deletes_claims(c.base):
        return False, (f"its claim {claim} is deleted with the StatefulSet (persistentVolumeClaimRetentionPolicy "
                       "whenDeleted: Delete), and with it all of its history")
    if c.action == DELETE:
        return True, (f"its history stays on the claim {claim} (not deleted with the StatefulSet), but nothing runs "
                      "Prometheus until a StatefulSet of that name and claim template mounts it again")
    if after is None or after[0] != "claim":
        return False, (f"its TSDB moves from the claim {claim} to "
                       + (f"an {after[0]}" if after else "no volume the review can read")
                       + ": the new pod starts empty and all of its history stays behind on that claim (kept: "
                         "Retain), read by nothing")
    if after[1] != before[1]:
        return False, (f"its claim template is renamed {before[1]} -> {after[1]}: the new pod gets a new, empty claim "
                       f"({after[1]}-{PROMETHEUS}-0) and all of its history stays behind on {claim}, read by nothing")
    old, new = _claim_template(c.base, before[1]), _claim_template(c.head, after[1])
    moved = "" if old == new else (
        f"; the claim template's new spec ({'; '.join(_claim_changes(old, new))}) does not reach {claim}: the "
        "StatefulSet controller creates a claim only where none exists (kubernetes pkg/controller/statefulset/"
        "stateful_pod_control.go createMissingPersistentVolumeClaims, read in the search index's copy, not at the "
        "cluster's tag), so resize the claim itself (its class "
        "allows expansion) or it keeps its old size")
    return True, (f"its history stays on its claim {claim}, a managed disk the new pod mounts again "
                  "(docs/monitoring.md, \"Storage\")" + moved)


def _claim_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    def size(spec: Mapping[str, Any]) -> Any:
        return ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    changes = [f"{k} {old.get(k)} -> {new.get(k)}" for k in ("storageClassName", "accessModes")
               if old.get(k) != new.get(k)]
    if size(old) != size(new):
        changes.append(f"storage {size(old)} -> {size(new)}")
    return changes or ["other fields"]


def _node_history(diff: StackDiff) -> tuple[bool, str]:
    """Whether a new pod on a replaced or resized node keeps the history: the head's StatefulSet's
    volume (the base's where it is gone)."""
    for entry in (diff.head, diff.base):
        for record in (entry or {}).get("resources") or []:
            if record.get("type") == STATEFULSET and _meta(record)[1] == PROMETHEUS:
                volume = _data_volume(record)
                if volume and volume[0] == "claim":
                    return True, (f"its history stays on its claim {volume[1]}-{PROMETHEUS}-0, a managed disk that is "
                                  "detached and attached to the new node (a Premium_LRS disk is zonal: a node of "
                                  "another zone cannot take it, and the pod waits)")
                return False, "its TSDB is " + (f"an {volume[0]}" if volume else "a volume the review cannot read") + \
                    " on the node, so all of its history is gone"
    return False, "its TSDB's volume could not be read, so its history may be gone"


def prometheus(diff: StackDiff) -> list[Finding]:
    """Prometheus restarted by a new pod template, or its node resized or replaced."""
    reasons = []
    shortened: list[str] = []
    subjects: list[str] = []
    history: list[tuple[bool, str]] = []
    for c in _prometheus_changes(diff):
        if c.action == REPLACE:
            # a StatefulSet forceNew input (serviceName, volumeClaimTemplates, selector, ...: effects.toml,
            # pulumi-kubernetes v4.32.0 diff.go var statefulSet): fixed name, so delete-before-replace
            reasons.append(f"its StatefulSet is replaced ({c.reason() or 'a forceNew input'}): the old one and "
                           "its pod are deleted before the new one is created")
            subjects.append(c.name)
            history.append(_history(c))
        elif c.action == DELETE or _template(c.base) != _template(c.head):
            sized = c.action == UPDATE and _sizing_only(c)
            behaviour = _figures_moved(diff, _BEHAVIOUR_FIGURES) if sized else []
            causes = _sizing_causes(diff)
            # sizing moved too: a pool input (causes names pools) or a sizing figure of the plan
            sizing_too = sized and (not behaviour or bool(_figures_moved(diff, _SIZING_FIGURES))
                                    or not causes.startswith(("the plan's own figures", "neither")))
            reasons.append("its pod template changes" + (
                f", its sizing{'' if behaviour else ' only'}: CPU, memory, disk and retention follow the series "
                "the plan estimates (each pool's nodes, pods per node and GPUs: kilonode.plan.resolve.monitoring), "
                "and what moved them here is " + causes if sizing_too else "") + (
                (", and " if sizing_too else ", ") + "a change of behaviour, not of sizing (no series count moves "
                "it): " + ", ".join(behaviour) + " (the plan's own figure; what the flag does is said where the "
                "effects table has it, value_effects.yaml)" if behaviour else ""))
            subjects.append(c.name)
            history.append(_history(c))
            before, after = _retention_days(c.base), _retention_days(c.head)
            if c.action == UPDATE and before is not None and after is not None and after < before:
                shortened.append(f"its retention shortens {_days(before)} -> {_days(after)}: from then on it keeps "
                                 f"{_days(after)} of history, so any question, graph or rule over a longer range "
                                 "(a week-on-week comparison, a slow leak, `predict_linear` over days) has no data "
                                 "(prometheus/prometheus tsdb/db.go: blocks past the retention are deleted at each "
                                 "reload of blocks)")
    pool = (plan_of(diff.head).get("prometheus") or plan_of(diff.base).get("prometheus") or {}).get("pool")
    for c in diff.resources:
        if c.type != VMSS or not pool or not str(c.role or "").startswith(f"pool-{pool}"):
            continue
        resized = any(i.path == "sku.name" and not i.ignored for i in c.inputs)
        if c.action in (REPLACE, DELETE) or resized:
            what = "resized" if resized and c.action == UPDATE else ("deleted" if c.action == DELETE else "replaced")
            reasons.append(f"its node's scale set {c.name} is {what}")
            subjects.append(c.name)
            history.append(_node_history(diff))
    if not reasons:
        return []
    lost = [why for kept, why in history if not kept]
    said = list(dict.fromkeys(lost or [why for _, why in history]))  # each once, the losses if any
    return [Finding(MEDIUM, "prometheus-restarted", (
        f"Prometheus restarts on a new pod ({'; '.join(reasons)}): {'; '.join(said)}; "
        + ("" if lost else "only alerting pauses: ")
        + "no alert fires from the old pod's end until the new one has replayed its WAL and scraped for each "
        "rule's `for:` (5 to 30 minutes; docs/monitoring.md, \"Storage\")" + "".join(f"; and {s}" for s in shortened)
        + (". Land it when a gap in alerting and graphs is acceptable" if lost else ". Land it when a gap in alerting "
           "is acceptable") + ", and say so to whoever is on call"), tuple(subjects))]


def _images(record: Mapping[str, Any] | None) -> Iterator[tuple[str, str]]:
    """(container name, image) of a workload's pod template (or a Pod's own spec)."""
    inputs = _inputs(record)
    spec = inputs.get("spec") or {}
    pod = ((spec.get("jobTemplate") or {}).get("spec") or spec).get("template", {}).get("spec") \
        if "template" in spec or "jobTemplate" in spec else spec
    for key in ("initContainers", "containers"):
        for container in (pod or {}).get(key) or []:
            if isinstance(container, Mapping) and container.get("image"):
                yield f"{key}/{container.get('name')}", str(container["image"])


def split_reference(image: str) -> tuple[str, str, str]:
    """`repo:tag@digest` -> (repo, tag, digest); '' for what it lacks."""
    name, _, digest = image.partition("@")
    repo, tag = name, ""
    if ":" in name.rsplit("/", 1)[-1]:
        repo, tag = name.rsplit(":", 1)
    return repo, tag, digest


def tag_under_same_digest(diff: StackDiff) -> list[Finding]:
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for c in diff.resources:
        if c.type not in WORKLOADS or c.action in (CREATE, DELETE):
            continue
        before = dict(_images(c.base))
        for container, image in _images(c.head):
            old = before.get(container)
            if not old or old == image:
                continue
            (repo, tag, digest), (was_repo, was_tag, was_digest) = split_reference(image), split_reference(old)
            if digest and digest == was_digest and repo == was_repo and tag != was_tag:
                groups.setdefault((repo, was_tag, tag, digest), []).append(
                    f"{c.type.rsplit(':', 1)[-1]} {_meta(c.head)[1]}")
    return [Finding(HIGH, "image-tag-same-digest", (
        f"{repo}: tag {was or '(none)'} -> {now or '(none)'} under the same digest {digest[:19]}... in "
        f"{', '.join(sorted(set(owners)))}: a reference with a digest is pulled by the digest and its tag is "
        f"ignored, so the pods run the {was or 'old'} image while the stack names {now}. Set the digest "
        "the new tag has (from the registry's promotion manifest, as catalog/components.yaml records each)"),
        tuple(sorted(set(owners))))
        for (repo, was, now, digest), owners in sorted(groups.items())]


# A Deployment replaced (spec.selector is forceNew for apps/v1 Deployment: pulumi/pulumi-kubernetes
# @v4.32.0 provider/pkg/provider/diff.go, labelSelectorForceNewProperties) under the same fixed name
# is replaced delete-before-replace (provider.go:1645-1658 at v4.32.0, as for the DaemonSet in
# kilonode.review.nodes.daemonsets_replaced): every pod of it is gone from the delete on. A new
# Deployment with no replicas field starts at 1 (kubernetes pkg/apis/apps/v1/defaults.go,
# SetDefaults_Deployment: a nil Replicas becomes 1), and CoreDNS's replicas are the DNS
# autoscaler's to set (kilonode.k8s.dns leaves the field out), so cluster DNS is down meanwhile and
# comes back at one replica until the autoscaler resizes it.
def deployments_replaced(diff: StackDiff) -> list[Finding]:
    """A Deployment replaced: every pod of it deleted before the new Deployment exists."""
    found = []
    for c in diff.resources:
        if c.type != DEPLOYMENT or c.action != REPLACE:
            continue
        (namespace, name), (new_ns, new_name) = _meta(c.base), _meta(c.head)
        why = c.reason() or "an input that forces a new Deployment"
        replicas = (_inputs(c.base).get("spec") or {}).get("replicas")
        had = f"its {replicas} pod(s)" if replicas is not None else "every pod of it"
        if (namespace, name) == (new_ns, new_name):
            order = (f"pulumi-kubernetes deletes a fixed-name object before it creates the new one, so {had} are "
                     "deleted before the new Deployment exists, and stay deleted if the create fails (`pulumi up` "
                     "stops there)")
        else:
            order = (f"the new {new_ns}/{new_name} is created first, then the old one is deleted with {had} "
                     "(both run side by side meanwhile)")
        down = ""
        if name == COREDNS and namespace == "kube-system":
            down = (": cluster DNS is down meanwhile (every lookup through kube-dns fails), and the new Deployment "
                    "starts at 1 replica (it names none: the DNS autoscaler sets it) until the autoscaler resizes "
                    "it")
        elif (namespace, name) == (new_ns, new_name):
            down = f": what {name} serves is down meanwhile"
        found.append(Finding(HIGH, "deployment-replaced", (
            f"Deployment {namespace}/{name} is replaced ({why}; pulumi-kubernetes' forceNew table): {order}{down}. "
            "Keep the selector; or create a new Deployment under a new name first and delete the old one in a "
            "later change"),
            (c.name,), cause=f"Deployment {name} replaced"))
    return found


# Prometheus's size units are powers of two (prometheus/common model.ParseBytes / units.Base2Bytes: "KB" is 1024 B),
# a claim's Kubernetes quantities "Gi" (2^30) or "G" (10^9).
_PROM_UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40, "PB": 2**50}
_QUANTITY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "k": 10**3, "M": 10**6,
                   "G": 10**9, "T": 10**12, "": 1}
# prometheus docs/storage.md ("Right-Sizing Retention Size"): keep retention.size at most 80-85% of the disk, since
# compactions and the WAL briefly take more than it; kilonode sets 80% (kilonode.plan.resolve.monitoring).
DISK_SHARE = 0.85


def _retention_bytes(record: Mapping[str, Any] | None) -> int | None:
    m = re.fullmatch(r"(\d+)(B|KB|MB|GB|TB|PB)", _prometheus_arg(record, "--storage.tsdb.retention.size=") or "")
    return int(m[1]) * _PROM_UNITS[m[2]] if m else None


def _claim_bytes(record: Mapping[str, Any] | None) -> int | None:
    volume = _data_volume(record)
    if not volume or volume[0] != "claim":
        return None
    size = ((_claim_template(record, volume[1]).get("resources") or {}).get("requests") or {}).get("storage")
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|K|k|M|G|T|)", str(size or ""))
    return int(m[1]) * _QUANTITY_UNITS[m[2]] if m else None


def prometheus_disk(diff: StackDiff) -> list[Finding]:
    """The head's retention.size past what the running claim holds: the claim keeps the base's size (a claim
    template's change does not reach an existing claim), so Prometheus fills its disk as history grows (the
    fifteenth independent trace, PR 05: the OS disk and the claim template doubled, retention.size 982GB on a
    claim that stays 1,024 GiB)."""
    found = []
    for c in _prometheus_changes(diff):
        # a replaced StatefulSet (a claim template change forces it) finds its claim again, at the claim's size,
        # unless the claims went with it (whenDeleted: Delete: prometheus-restarted says the history is lost)
        if c.action not in (UPDATE, REPLACE) or (c.action == REPLACE and _deletes_claims(c.base)):
            continue
        keeps, wants = _claim_bytes(c.base), _retention_bytes(c.head)
        if keeps is None or wants is None or wants <= keeps * DISK_SHARE:
            continue
        found.append(Finding(HIGH, "prometheus-disk-short", (
            f"Prometheus's --storage.tsdb.retention.size becomes {wants / 2**30:,.0f} GiB (Prometheus counts it in "
            f"powers of two) while its running claim keeps {keeps / 2**30:,.0f} GiB: the claim template's new size "
            "does not reach an existing claim, and Prometheus's own guidance is at most 80-85% of the disk (docs/"
            "storage.md: compactions and the WAL take more than the retention size for a while). As history grows "
            "toward the new retention the disk fills and Prometheus fails its writes: alerting stops. Resize the "
            "claim first (its class allows expansion: `kubectl -n monitoring patch pvc ...`), then raise the "
            "retention"), (c.name,)))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    return [*service_cidr(diff), *services_replaced(diff), *deployments_replaced(diff), *prometheus(diff),
            *prometheus_pending(diff), *prometheus_disk(diff), *tag_under_same_digest(diff)]


# ---- prometheus-pending-until-resize (trace 21, P06) -------------------------------------------------------------
# The monitoring pool's VM size moves with Prometheus's needs, but the scale sets' upgrade policy is Manual: the
# running instance keeps the old size until it is upgraded (`kilonode rollout`, docs/operations.md), while the new
# Prometheus pod, with the head's requests, is created at once. Where those requests do not fit the old size (the
# plan's own fit rule: kilonode.plan.resolve.monitoring _fits), the old pod is gone and the new one waits Pending:
# no alerting in the cluster until someone upgrades the VM, not the 5 to 30 minutes of a restart.
PENDING_RULE = "prometheus-pending-until-resize"


def _pool_of(entry: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    return next((p for p in plan_of(entry).get("nodePools") or [] if isinstance(p, Mapping) and p.get("name") == name),
                {})


def prometheus_pending(diff: StackDiff) -> list[Finding]:
    head = plan_of(diff.head).get("prometheus") or {}
    base = plan_of(diff.base).get("prometheus") or {}
    pool = head.get("pool")
    if not pool or base.get("pool") != pool:
        return []
    was, now = _pool_of(diff.base, pool), _pool_of(diff.head, pool)
    if was.get("vmSize") == now.get("vmSize") or not was.get("vcpus") or not was.get("memoryGib"):
        return []
    room_cpus = max(1, int(was["vcpus"]) - defaults.PROMETHEUS_VM_RESERVED_CPUS)
    room_gib = float(was["memoryGib"]) * defaults.PROMETHEUS_VM_MEMORY_PERCENT / 100
    cpus, memory = int(head.get("cpus") or 0), float(head.get("memoryGib") or 0)
    if cpus <= room_cpus and memory <= room_gib:
        return []
    return [Finding(HIGH, PENDING_RULE, (
        f"the cluster's Prometheus now asks for {cpus} CPUs and {memory:g} GiB, more than the running {pool} "
        f"node ({was.get('vmSize')}) leaves it ({room_cpus} CPUs, {room_gib:.0f} GiB: the fit rule of "
        f"kilonode.plan.resolve.monitoring); the pool moves to {now.get('vmSize')}, but the scale set's upgrade "
        "policy is Manual, so the running VM keeps its size until it is upgraded, while `pulumi up` replaces the "
        "Prometheus pod at once: the old pod is deleted and the new one waits Pending, and no alert fires in the "
        "cluster (the dead man's switch stops) until the VM is upgraded by hand. Upgrade the "
        f"{pool} pool first (`kilonode rollout start --pool {pool} --without-alerts`, docs/operations.md), in one "
        "change and `pulumi up`, then land what grows Prometheus"),
        (f"StatefulSet monitoring/{PROMETHEUS}",))]
