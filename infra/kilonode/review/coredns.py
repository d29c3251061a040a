"""A change to CoreDNS's Corefile (independent trace of kilonode diff on research-7500, 5th, finding 1).

The resource diff calls it a ConfigMap replaced; what it does to a running cluster, read in
upstream CoreDNS at v1.12.1 (the catalogue's pin) and at the search index's newest copy
(4b26cced, v1.14.7-15), the same at both:

- it reaches every replica at once, without a rollout: the pods mount the ConfigMap (a key to a
  path, not subPath: kilonode.k8s.dns), so the kubelet rewrites the file in every pod within its
  sync period, and the `reload` plugin in the running Corefile reads the file every INTERVAL
  (default 30s, +/- 15s of jitter) and restarts the server with it when it changed
  (coredns plugin/reload/README.md "Syntax"; reload.go hook). No Deployment rollout, no
  maxUnavailable, no PodDisruptionBudget stands between the ConfigMap and the replicas;
- a Corefile CoreDNS rejects keeps the old configuration running in each replica: a parse error
  is logged ("Corefile parse failed") and skipped, a failed restart is logged ("Corefile changed
  but reload failed") and counted, and the old instance keeps serving (reload.go hook l.95-116 at
  v1.12.1; README "Even if the new Corefile has an error, CoreDNS will continue to run the old
  config"); but a replica that starts afterwards (the autoscaler's, one rescheduled off a drained
  or replaced node) loads the file at start and exits on it (coremain/run.go l.73-76 at v1.12.1:
  caddy.Start's error -> mustLogFatal), so it crash-loops;
- `pods verified` makes every replica list and watch every Pod of the cluster (plugin/kubernetes
  README "verified": "maintains a watch on all pods"; controller.go: the Pod informer runs only
  when initPodCache, kubernetes.go l.258 `initPodCache = podMode == podModeVerified`), which
  `autopath @kubernetes` needs (README "AutoPath": "`pods` must be set to `verified`"; without it
  autopath.go returns no search path). Its memory: coredns/deployment kubernetes/
  Scaling_CoreDNS.md "With the *autopath* plugin", "MB required (w/ autopath) = (Pods +
  Services) / 250 + 56" (read at 7853d4a1; the autopath measurement is the Pod store that
  pods verified keeps). Past the Deployment's memory limit every replica is OOM-killed as the
  reload fills its Pod cache, all within the reload's jitter: cluster DNS is down.

Pods are counted as the head would run them, with preflight's placement model: every DaemonSet
on the nodes it runs on, plus kilonode's Deployments and StatefulSets; the users' own pods are
not known here, so the estimate is a floor.

A second rule (`dns-replicas-cut`, medium / high), from a sixth independent trace: the DNS
autoscaler's parameters moved (DNS_NODES_PER_REPLICA 250 -> 1000: the ConfigMap's max 31 -> 8) were
"No risk found". kubernetes-sigs/cluster-proportional-autoscaler (read at 5a5dd5a1, v1.10.3-8):
every --poll-period-seconds (kilonode sets 10: kilonode.k8s.dns AUTOSCALER_POLL_S, read here from the
Deployment's args) pollAPIServer fetches the ConfigMap, rebuilds its parameters when its
resourceVersion moved (pkg/autoscaler/autoscaler_server.go pollAPIServer, l.116-155), asks the linear
controller for the count (pkg/autoscaler/controller/linearcontroller/linear_controller.go
getExpectedReplicasFromParams and getExpectedReplicasFromParam: ceil(nodes / nodesPerReplica), within
[min, max], at least 2 with preventSinglePointFailure and more than one node; coresPerReplica likewise,
the larger of the two) and writes it to the Deployment's scale subresource at once
(pkg/autoscaler/k8sclient/k8sclient.go updateReplicasAppsV1: one PUT with the new count). The
ReplicaSet controller then deletes the surplus pods together. A PodDisruptionBudget does not pace
that: it guards evictions (the Eviction API, a drain), and a workload's own scale-down deletes pods
without asking it (Kubernetes docs, concepts/workloads/pods/disruptions "Pod disruption budgets": not
all voluntary disruptions are constrained by them; deleting a Deployment or its pods bypasses them).
The counts are computed on each side's ConfigMap parameters and the plan's count of the nodes the
autoscaler's --nodelabels selects (components.dnsAutoscale.eligibleNodes, the pools at their
ceiling): the steady state either side reaches.

A third rule (`coredns-memory-short`, high), from a seventh trace: the CoreDNS container's memory limit
lowered (170Mi -> 80Mi) below Scaling_CoreDNS.md's estimate for the Corefile the head runs, "MB required
(default settings) = (Pods + Services) / 1000 + 54" with `pods insecure` (no Pod store; 30 MB of it a full
cache, 5 MB the query buffer), or the autopath formula above with `pods verified`; and the base's limit was
not below its own estimate. The limit is in the pod template: the change is a Deployment rollout of every
replica at the Deployment's strategy.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from kilonode.preflight.checks.scheduling import placement_of
from kilonode.preflight.nodes import bootstrap_nodes
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

CONFIGMAP = "kubernetes:core/v1:ConfigMap"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
NAMESPACE, NAME, KEY = "kube-system", "coredns", "Corefile"
# Scaling_CoreDNS.md (coredns/deployment kubernetes/, at 7853d4a1), "With the *autopath* plugin":
# MB required = (Pods + Services) / 250 + 56.
PODS_AND_SERVICES_PER_MB = 250
BASE_MB = 56
# The same page, "With default CoreDNS settings" (no Pod store: `pods insecure` or `pods disabled`, which
# kilonode ships): MB required = (Pods + Services) / 1000 + 54.
DEFAULT_PODS_AND_SERVICES_PER_MB = 1000
DEFAULT_BASE_MB = 54
# The reload plugin's defaults (plugin/reload/README.md "Syntax" at v1.12.1): INTERVAL 30s, JITTER 15s.
RELOAD_INTERVAL_S, RELOAD_JITTER_S = 30, 15
_VERIFIED = re.compile(r"^\s*pods\s+verified\b", re.M)
_AUTOPATH = re.compile(r"^\s*autopath\s+@kubernetes\b", re.M)
_RELOAD = re.compile(r"^\s*reload\b", re.M)
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9,
          "T": 10**12}


def _objects(entry: Mapping[str, Any] | None, kind: str) -> list[Mapping[str, Any]]:
    return [r.get("inputs") or {} for r in (entry or {}).get("resources", []) if r.get("type") == kind]


def _named(entry: Mapping[str, Any] | None, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    for inputs in _objects(entry, kind):
        meta = inputs.get("metadata") or {}
        if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
            return inputs
    return None


def _container(entry: Mapping[str, Any] | None) -> Mapping[str, Any]:
    deployment = _named(entry, DEPLOYMENT, NAMESPACE, NAME) or {}
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    return next((c for c in containers if c.get("name") == NAME), containers[0] if containers else {})


def _configmap_name(entry: Mapping[str, Any] | None) -> str:
    """The ConfigMap the CoreDNS Deployment mounts (kilonode.k8s.dns: `coredns`)."""
    deployment = _named(entry, DEPLOYMENT, NAMESPACE, NAME) or {}
    volumes = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []
    for volume in volumes:
        name = (volume.get("configMap") or {}).get("name")
        if name:
            return str(name)
    return NAME


def corefile(entry: Mapping[str, Any] | None) -> str | None:
    found = _named(entry, CONFIGMAP, NAMESPACE, _configmap_name(entry))
    text = ((found or {}).get("data") or {}).get(KEY)
    return str(text) if text is not None else None


def memory_bytes(quantity: object) -> int | None:
    match = _QUANTITY.match(str(quantity or "").strip())
    if not match:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def memory_limit(entry: Mapping[str, Any] | None) -> int | None:
    """The CoreDNS container's memory limit in bytes, as the side renders it."""
    return memory_bytes(((_container(entry).get("resources") or {}).get("limits") or {}).get("memory"))


def pods_and_services(diff: StackDiff) -> tuple[int, int, str] | None:
    """(pods, services, how the pods were counted) at the head: each DaemonSet on the nodes preflight's
    placement model puts it on, plus the Deployments' and StatefulSets' replicas (CoreDNS's the plan's
    dnsReplicas: the Deployment names none); None where the head has no preflight inputs."""
    inputs = sides.inputs(diff, "head")
    if inputs is None:
        return None
    groups = [g for g in bootstrap_nodes(inputs) if g.count]
    workloads = inputs.workloads()
    daemonsets = [w for w in workloads if w.kind == "DaemonSet"]
    on_nodes = {w.describe(): placement_of(w, groups, daemonsets).nodes_eventually for w in daemonsets}
    dns_replicas = int((plan_of(diff.head).get("components") or {}).get("dnsReplicas") or 1)
    replicated = 0
    for w in workloads:
        if w.kind == "DaemonSet":
            continue
        replicas = (w.inputs.get("spec") or {}).get("replicas")
        meta = w.inputs.get("metadata") or {}
        if replicas is None and meta.get("name") == NAME and meta.get("namespace") == NAMESPACE:
            replicas = dns_replicas
        replicated += int(replicas if replicas is not None else 1)
    pods = sum(on_nodes.values()) + replicated
    services = len(_objects(diff.head, SERVICE)) + 1  # and the apiservers' own `default/kubernetes`
    nodes = sum(g.count for g in groups)
    how = (f"{sum(on_nodes.values()):,} DaemonSet pods ({len(daemonsets)} DaemonSets on up to {nodes:,} nodes) + "
           f"{replicated} replicas of kilonode's Deployments and StatefulSets")
    return pods, services, how


def estimate_mb(pods: int, services: int) -> float:
    """Scaling_CoreDNS.md's memory per replica with the Pod store (the docstring)."""
    return (pods + services) / PODS_AND_SERVICES_PER_MB + BASE_MB


def reload_reaches(diff: StackDiff) -> list[Finding]:
    old, new = corefile(diff.base), corefile(diff.head)
    if old is None or new is None or old == new:
        return []
    subjects = (f"ConfigMap {NAMESPACE}/{_configmap_name(diff.head)}",)
    found = []
    if _RELOAD.search(old):
        reach = (f"the Corefile change reaches every CoreDNS replica at once, without a rollout: the kubelet "
                 "rewrites the mounted file in every pod within its sync period, and the running Corefile's "
                 f"`reload` plugin picks it up within its check interval (default {RELOAD_INTERVAL_S}s +/- "
                 f"{RELOAD_JITTER_S}s) and restarts the server with it, so no maxUnavailable or "
                 "PodDisruptionBudget paces it (coredns plugin/reload). ")
    else:
        reach = ("the running Corefile has no `reload`, so each replica keeps the old Corefile until its pod "
                 "restarts, and replicas run two Corefiles meanwhile. ")
    note = ""
    if _AUTOPATH.search(new) and not _VERIFIED.search(new):
        note = (" `autopath @kubernetes` without `pods verified` does nothing: the kubernetes plugin keeps no "
                "Pod store then and gives autopath no search path (plugin/kubernetes autopath.go).")
    found.append(Finding(MEDIUM, "corefile-reloaded", (
        reach[0].upper() + reach[1:]
        + "A Corefile CoreDNS rejects (a parse error, a plugin that fails its setup) keeps the old configuration "
        "running in each replica (the reload is logged as failed), but every replica that starts afterwards (the "
        "autoscaler's, one moved off a drained or replaced node) loads it at start and exits, so it crash-loops "
        "and DNS capacity only shrinks from there. Check the Corefile with the pinned CoreDNS image before it "
        "lands, and watch coredns_reload_failed_total after `pulumi up`." + note), subjects,
        cause="Corefile"))
    if _VERIFIED.search(new) and not _VERIFIED.search(old):
        found.extend(_memory(diff, new, subjects))
    return found


def _memory(diff: StackDiff, new: str, subjects: tuple[str, ...]) -> list[Finding]:
    limit = memory_limit(diff.head)
    counted = pods_and_services(diff)
    if counted is None:
        diff.note("corefile-reloaded: the head's plan does not read as this kilonode's, so CoreDNS's memory "
                  "with `pods verified` was not estimated")
        return []
    if limit is None:
        diff.note("corefile-reloaded: the CoreDNS Deployment names no memory limit kilonode can read, so the "
                  "memory `pods verified` needs was not compared with it")
        return []
    pods, services, how = counted
    need = estimate_mb(pods, services)
    limit_mb = limit / 10**6
    if need <= limit_mb:
        return []
    raise_to_mi = math.ceil(need * 10**6 / 2**20 * 1.25)  # a quarter on top: the users' own pods come on top
    why = "`pods verified`" + (" (for `autopath @kubernetes`, which needs it)" if _AUTOPATH.search(new) else "")
    replicas = int((plan_of(diff.head).get("components") or {}).get("dnsReplicas") or 1)
    return [Finding(HIGH, "corefile-reloaded", (
        f"{why} makes every CoreDNS replica list and watch every Pod of the cluster (plugin/kubernetes README, "
        f"\"verified\"): at least {pods:,} pods ({how}; the users' pods come on top) and {services} Services need "
        f"about ({pods:,} + {services}) / {PODS_AND_SERVICES_PER_MB} + {BASE_MB} = {need:.0f} MB per replica "
        f"(coredns/deployment kubernetes/Scaling_CoreDNS.md, with the Pod store), over the Deployment's memory "
        f"limit of {limit / 2**20:.0f}Mi ({limit_mb:.0f} MB). The reload reaches all {replicas} replicas within "
        "about a minute of each other (the kubelets' sync, the reload's jitter), each fills its Pod cache and "
        "is OOM-killed, and they restart into the same Corefile: cluster DNS is down, and up to "
        f"{replicas} full Pod LISTs hit the apiservers at every restart. Raise the CoreDNS memory limit first, "
        f"to at least {raise_to_mi}Mi (the estimate and a quarter for the users' pods), in a change of its own "
        "that rolls out before this one; or keep `pods insecure` at this scale"),
        subjects, cause="Corefile")]


AUTOSCALER = "coredns-autoscaler"  # kilonode.k8s.dns AUTOSCALER: its ConfigMap and Deployment
DEFAULT_POLL_S = 10  # the autoscaler's own default --poll-period-seconds
_POLL = re.compile(r"^--poll-period-seconds=(\d+)$")


def linear_params(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The side's DNS autoscaler ConfigMap's `linear` parameters, or None."""
    found = _named(entry, CONFIGMAP, NAMESPACE, AUTOSCALER)
    text = ((found or {}).get("data") or {}).get("linear")
    try:
        params = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return params if isinstance(params, dict) else None


def expected_replicas(params: Mapping[str, Any], nodes: int, cores: int = 0) -> int:
    """cluster-proportional-autoscaler's linear count (linear_controller.go getExpectedReplicasFromParams)."""
    low = int(params.get("min") or 0) or 1  # parseParams: min 0 defaults to 1
    high = int(params.get("max") or 0)

    def of(amount: int, per: float) -> int:
        if not per:
            return 1
        count = float(math.ceil(amount / per))
        if high:
            count = min(float(high), count)
        return int(max(float(low), count))

    from_cores = of(cores, float(params.get("coresPerReplica") or 0))
    from_nodes = of(nodes, float(params.get("nodesPerReplica") or 0))
    if params.get("preventSinglePointFailure") and nodes > 1 and from_nodes < 2:
        from_nodes = 2
    return max(from_cores, from_nodes)


def _eligible_nodes(entry: Mapping[str, Any] | None) -> int | None:
    value = ((plan_of(entry).get("components") or {}).get("dnsAutoscale") or {}).get("eligibleNodes")
    return int(value) if isinstance(value, int) else None


def _poll_seconds(entry: Mapping[str, Any] | None) -> int:
    deployment = _named(entry, DEPLOYMENT, NAMESPACE, AUTOSCALER) or {}
    for container in (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") \
            or []:
        for word in [*(container.get("command") or []), *(container.get("args") or [])]:
            match = _POLL.match(str(word))
            if match:
                return int(match.group(1))
    return DEFAULT_POLL_S


def replicas_cut(diff: StackDiff) -> list[Finding]:
    """The DNS autoscaler's parameters moved so that it asks for fewer CoreDNS replicas."""
    old, new = linear_params(diff.base), linear_params(diff.head)
    if old is None or new is None or old == new:
        return []
    old_nodes, new_nodes = _eligible_nodes(diff.base), _eligible_nodes(diff.head)
    if old_nodes is None or new_nodes is None:
        diff.note("dns-replicas-cut: a side's plan names no dnsAutoscale.eligibleNodes, so the CoreDNS replicas the "
                  "autoscaler's new parameters ask for were not computed")
        return []
    was, now = expected_replicas(old, old_nodes), expected_replicas(new, new_nodes)
    if now >= was:
        return []
    level = HIGH if now * 2 < was else MEDIUM
    moved = ", ".join(f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new))
                      if old.get(k) != new.get(k))
    per_was, per_now = old_nodes / was, new_nodes / now
    poll = _poll_seconds(diff.head)
    pdb = _named(diff.head, "kubernetes:policy/v1:PodDisruptionBudget", NAMESPACE, NAME)
    pdb_said = ("the coredns PodDisruptionBudget does not pace it: it guards evictions, and a Deployment's own "
                "scale-down deletes its pods without asking it" if pdb else
                "no PodDisruptionBudget would pace it: they guard evictions, not a Deployment's own scale-down")
    return [Finding(level, "dns-replicas-cut", (
        f"the DNS autoscaler's parameters move ({moved}): for the {new_nodes:,} nodes its --nodelabels selects, "
        f"its linear formula (ceil(nodes / nodesPerReplica) within [min, max]) gives {was} CoreDNS replicas at "
        f"the base and {now} at the head ({was - now} fewer). cluster-proportional-autoscaler re-reads the "
        f"ConfigMap every {poll}s and writes the new count to the Deployment's scale at once "
        "(linearcontroller/linear_controller.go getExpectedReplicasFromParams; k8sclient.go updateReplicasAppsV1), "
        f"so within seconds of `pulumi up` {was - now} replicas are deleted together; {pdb_said} (Kubernetes docs, "
        "\"Disruptions\": deleting a Deployment's pods bypasses PodDisruptionBudgets). Each remaining replica "
        f"serves {per_now:,.0f} nodes instead of {per_was:,.0f} (x{per_now / per_was:.1f} its queries and its "
        "VM's external lookups, ~200 QPS a VM: the 2,500-node lesson behind one replica per node). Check "
        "CoreDNS's CPU and coredns_dns_requests_total per replica first, and lower the count in steps (no more "
        "than half per change)"),
        (f"ConfigMap {NAMESPACE}/{AUTOSCALER}",), cause="DNS autoscaler parameters")]


def estimate_for(corefile_text: str, pods: int, services: int) -> tuple[float, str]:
    """(MB per replica, the formula said) for the Corefile a replica runs: the Pod store's with
    `pods verified`, the default settings' otherwise (Scaling_CoreDNS.md)."""
    if _VERIFIED.search(corefile_text):
        return estimate_mb(pods, services), (f"({pods:,} + {services}) / {PODS_AND_SERVICES_PER_MB} + {BASE_MB}, "
                                             "the formula with the Pod store `pods verified` keeps")
    need = (pods + services) / DEFAULT_PODS_AND_SERVICES_PER_MB + DEFAULT_BASE_MB
    return need, (f"({pods:,} + {services}) / {DEFAULT_PODS_AND_SERVICES_PER_MB} + {DEFAULT_BASE_MB}, the default "
                  "settings' formula (no Pod store: the Corefile's `pods insecure`)")


def memory_short(diff: StackDiff) -> list[Finding]:
    """`coredns-memory-short` (7th trace, finding 2: the limit 170Mi -> 80Mi was "No risk found"): the CoreDNS
    container's memory limit moves below Scaling_CoreDNS.md's estimate for the Corefile each side runs, where
    the base's limit was not below its own. A Corefile change to `pods verified` under an unchanged limit is
    corefile-reloaded's (the reload reaches the replicas, not a rollout)."""
    was, now = memory_limit(diff.base), memory_limit(diff.head)
    old_file, new_file = corefile(diff.base), corefile(diff.head)
    if was is None or now is None or was == now or old_file is None or new_file is None:
        return []
    counted = pods_and_services(diff)
    if counted is None:
        diff.note("coredns-memory-short: the head's plan does not read as this kilonode's, so CoreDNS's memory "
                  "was not estimated against its new limit")
        return []
    pods, services, how = counted
    need, formula = estimate_for(new_file, pods, services)
    need_before, _ = estimate_for(old_file, pods, services)
    if now / 10**6 >= need or was / 10**6 < need_before:
        return []
    deployment = _named(diff.head, DEPLOYMENT, NAMESPACE, NAME) or {}
    rolling = ((deployment.get("spec") or {}).get("strategy") or {}).get("rollingUpdate") or {}
    pace = (f"maxUnavailable {rolling.get('maxUnavailable')}, maxSurge {rolling.get('maxSurge')}" if rolling
            else "the Deployment's default pace")
    replicas = expected_replicas(linear_params(diff.head) or {}, _eligible_nodes(diff.head) or 0) \
        if linear_params(diff.head) and _eligible_nodes(diff.head) else None
    count = f"all {replicas}" if replicas else "every"
    raise_to_mi = math.ceil(need * 10**6 / 2**20 * 1.25)
    return [Finding(HIGH, "coredns-memory-short", (
        f"CoreDNS's memory limit moves from {was / 2**20:.0f}Mi to {now / 2**20:.0f}Mi ({now / 10**6:.0f} MB), "
        f"below what a replica needs: at least {pods:,} pods ({how}; the users' pods come on top) and {services} "
        f"Services need about {formula} = {need:.0f} MB per replica (coredns/deployment kubernetes/"
        "Scaling_CoreDNS.md; 30 MB of it is a full cache). The limit is in the pod template, so the change rolls "
        f"{count} replicas as a Deployment rollout ({pace}): a new replica starts under the limit and passes its "
        "readiness probe, so the rollout goes on to the next, and is OOM-killed later, once its answer cache fills "
        "under load, then restarts with an empty cache and fills it again. Every replica ends on the short limit, "
        "and the kills come under load, on each replica whose cache fills. Keep the limit at or above "
        f"{raise_to_mi}Mi (the estimate and a quarter for the users' pods)"),
        (f"Deployment {NAMESPACE}/{NAME}",), cause="CoreDNS memory limit")]


# ---- the forward plugin's upstreams leave Azure DNS (dns-upstream-off-azure) -------------------------------------
#
# Independent trace 11b: `forward . /etc/resolv.conf` -> `forward . 8.8.8.8 1.1.1.1` was only corefile-reloaded. The
# forward plugin sends every query of its FROM zone that no earlier plugin answered to its TO upstreams; a TO of a
# file is read as a resolv.conf, its nameservers the upstreams (coredns plugin/forward/README.md "Syntax", setup.go
# parseStanza: parse.HostPortOrFile, at v1.12.1). A pod's resolv.conf names CoreDNS (the kubelets' clusterDNS), and
# CoreDNS's `/etc/resolv.conf` is its node's, which on Azure names Azure DNS at 168.63.129.16 unless the VNet sets
# custom DNS servers (Microsoft Learn, "What is IP address 168.63.129.16?"). Only Azure DNS answers the VNet's internal
# names and the private DNS zones linked to the VNet: a private endpoint's name (privatelink.blob.core.windows.net,
# privatelink.azurecr.io, privatelink.vaultcore.azure.net) resolves to its private address only there, a public
# resolver gives the public address (refused by the service's network rules) or NXDOMAIN (Microsoft Learn, "Azure
# Private Endpoint DNS configuration"). A public resolver also sees every query of the cluster from the NAT gateway's
# few addresses and limits each client address (Google Public DNS for ISPs: 1,500 QPS per IPv4 address by default).
AZURE_DNS = "168.63.129.16"
RESOLV_CONF = "/etc/resolv.conf"
UPSTREAM_RULE = "dns-upstream-off-azure"
# Resource types (any provider version) whose names resolve privately only through Azure DNS.
_PRIVATE_TYPES = re.compile(r"privateendpoint|privatezone|privatednszone|privatedns:|virtualnetworklink", re.I)


def forwards(text: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """(server block keys, FROM) -> TO of every `forward` in a Corefile: the server block is its header (`.:53`),
    comments dropped; a FROM of several zones is kept as written."""
    return {(" ".join(keys), words[1]): tuple(words[2:]) for keys, directives in server_blocks(text)
            for words, _ in directives if words[0] == "forward" and len(words) >= 3}


def _via_azure(upstreams: tuple[str, ...]) -> bool:
    """Whether any upstream is the node's resolv.conf or Azure DNS itself (any scheme or port)."""
    for upstream in upstreams:
        host = re.sub(r"^[a-z]+://", "", upstream).rsplit(":", 1)[0] if upstream.count(":") <= 2 else upstream
        if upstream == RESOLV_CONF or upstream.startswith("/") or host == AZURE_DNS:
            return True
    return False


def _private_names(entry: Mapping[str, Any] | None) -> list[str]:
    """The side's resources whose names resolve privately only through Azure DNS."""
    return sorted({str(r.get("type")) for r in (entry or {}).get("resources", [])
                   if _PRIVATE_TYPES.search(str(r.get("type") or ""))})


def upstream_off_azure(diff: StackDiff) -> list[Finding]:
    old, new = corefile(diff.base), corefile(diff.head)
    if old is None or new is None or old == new:
        return []
    was, now = forwards(old), forwards(new)
    moved = [(key, was[key], now.get(key)) for key in sorted(was)
             if key[1] == "." and _via_azure(was[key]) and not (now.get(key) and _via_azure(now[key]))]
    if not moved:
        return []
    private = sorted({*_private_names(diff.base), *_private_names(diff.head)})
    nat = sum(1 for r in (diff.head or {}).get("resources", []) if r.get("type") == "azure-native:network:NatGateway")
    said = "; ".join(f"server {server or '(unnamed)'}: `forward {zone} {' '.join(w)}` -> "
                     + (f"`forward {zone} {' '.join(n)}`" if n else "no `forward` for the root zone")
                     for (server, zone), w, n in moved)
    where = (f"This stack has {', '.join(private)}: their names stop resolving to their private addresses, so the "
             "pods that reach them (registries, storage, Key Vault) get public addresses the services' network "
             "rules refuse, or NXDOMAIN. " if private else
             "This stack declares no private endpoint or private DNS zone today; any one added later (or linked to "
             "the VNet from outside the stack) will not resolve privately from pods. ")
    return [Finding(HIGH if private else MEDIUM, UPSTREAM_RULE, (
        f"CoreDNS's upstreams leave Azure DNS ({said}): every name outside the cluster domain that a pod looks up now "
        f"goes to those resolvers instead of the node's resolv.conf (Azure DNS, {AZURE_DNS}; coredns plugin/forward "
        "README \"Syntax\": a file TO is read as a resolv.conf). Only Azure DNS answers the VNet's internal names and "
        "the private DNS zones linked to the VNet (Microsoft Learn, \"What is IP address 168.63.129.16?\", \"Azure "
        f"Private Endpoint DNS configuration\"). {where}And all the cluster's external lookups leave through "
        + (f"the NAT gateways ({nat} in this stack), " if nat else "the VNet's egress, ")
        + "so the public resolvers see every query from a few source addresses and limit each (Google Public DNS: "
        "1,500 QPS per IPv4 address by default): lookups fail under load, cluster-wide. The change reaches every "
        "replica within the reload's interval (corefile-reloaded). Keep `forward . /etc/resolv.conf` and add a server "
        "block per external zone that must go elsewhere (`example.org:53 { forward . 8.8.8.8 }`), or set the VNet's "
        "DNS servers (which resolv.conf follows) to resolvers that forward to Azure DNS"),
        (f"ConfigMap {NAMESPACE}/{_configmap_name(diff.head)}",), cause="Corefile")]


# ---- how long a cluster name's answer may be served stale (dns-cache-stale-raised) -------------------------------
#
# Independent trace 21: the kubernetes plugin's `ttl 30` -> `ttl 300` with `cache 30` -> `cache 300 { prefetch ... }`
# was only corefile-reloaded. Read in coredns/coredns at v1.12.1 (the catalogue's pin):
# - the kubernetes plugin gives every answer it builds the TTL of its `ttl` option, default 5 (plugin/kubernetes/
#   kubernetes.go: `defaultTTL = 5`, New sets k.ttl = defaultTTL; setup.go accepts `ttl` in [0, 3600]), and its
#   MinTTL is that ttl (kubernetes.go `func (k *Kubernetes) MinTTL`);
# - its NXDOMAIN/NODATA carries the SOA of plugin/backend_lookup.go SOA: Minttl = MinTTL, the SOA's own header TTL
#   min(MinTTL, 300);
# - the cache plugin stores a response for dnsutil.MinimalTTL of it (plugin/pkg/dnsutil/ttl.go: the lowest header TTL
#   of its answer and authority records, so the SOA's header TTL for a denial), clamped by computeTTL to [minpttl,
#   pttl] for a success and [minnttl, nttl] for a denial (plugin/cache/cache.go ResponseWriter.WriteMsg,
#   computeTTL). Defaults: pttl 3600 s, nttl 1800 s, both minimums 5 s (cache.go New, maxTTL/maxNTTL/minTTL/minNTTL
#   from dnsutil MaximumDefaulTTL 1h and MinimalDefaultTTL 5s); `cache TTL` sets pttl and nttl both, `success CAP TTL
#   MINTTL` and `denial CAP TTL MINTTL` override them (plugin/cache/setup.go cacheParse); `disable success|denial
#   [ZONES]` stops caching one kind;
# - `serve_stale [DURATION] [immediate|verify]` (default 1h, immediate) serves an expired entry for up to DURATION
#   past its TTL, refreshing it in the background after the answer (plugin/cache/handler.go ServeDNS,
#   getIgnoreTTL); `verify` refreshes first and serves stale only when the refresh fails, which the in-process
#   kubernetes plugin does not, so only `immediate` is counted.
# So the longest a cluster name's answer may be served after the API changed is clamp(ttl, min, max) of the cache
# serving the cluster zone (plus an immediate serve_stale's DURATION), and 0 s with no cache there.
STALE_RULE = "dns-cache-stale-raised"
# kubeadm's and kilonode's Corefile: `ttl 30` in the kubernetes block, `cache 30`: a cluster answer 30 s old at most.
STALE_DEFAULT_S = 30
KUBERNETES_DEFAULT_TTL_S = 5  # plugin/kubernetes/kubernetes.go defaultTTL at v1.12.1
CACHE_MAX_S, CACHE_MAX_DENIAL_S, CACHE_MIN_S = 3600, 1800, 5  # plugin/cache/cache.go New at v1.12.1
SOA_TTL_CAP_S = 300  # plugin/backend_lookup.go SOA: the header TTL min(MinTTL, 300)
SERVE_STALE_DEFAULT_S = 3600  # plugin/cache/setup.go: serve_stale without DURATION, 1h
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def _go_seconds(text: str) -> int | None:
    """A Go time.ParseDuration string in whole seconds (serve_stale's DURATION), None when it does not parse."""
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return int(sum(float(n) * _GO_UNITS[u] for n, u in parts))


def server_blocks(text: str) -> list[tuple[list[str], list[tuple[list[str], list[list[str]]]]]]:
    """[(server keys, [(directive words, [its block's lines as words])])] of a Corefile, comments dropped."""
    blocks: list[tuple[list[str], list[tuple[list[str], list[list[str]]]]]] = []
    depth = 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.rstrip("{").split()
        if depth == 0 and line.endswith("{"):
            blocks.append((words, []))
        elif depth == 1 and words and words[0] != "}" and blocks:
            blocks[-1][1].append((words, []))
        elif depth == 2 and words and words[0] != "}" and blocks and blocks[-1][1]:
            blocks[-1][1][-1][1].append(words)
        depth = max(depth + line.count("{") - line.count("}"), 0)
    return blocks


def _zone(name: str) -> str:
    name = re.sub(r"^[a-z]+://", "", name.lower()).rsplit(":", 1)[0] if name != "." else name
    return name.rstrip(".") or "."


def _covers(zones: list[str], name: str) -> bool:
    return any(z == "." or name == z or name.endswith("." + z) for z in map(_zone, zones))


def _int(words: list[str], i: int) -> int | None:
    return int(words[i]) if len(words) > i and words[i].isdigit() else None


def stale_windows(text: str) -> dict[str, tuple[int, int, str]]:
    """cluster zone -> (longest age of a positive answer served, of a negative one, how) for each server block with a
    `kubernetes` plugin (the module's comment above gives the arithmetic and its sources)."""
    found: dict[str, tuple[int, int, str]] = {}
    for keys, directives in server_blocks(text):
        kube = next(((w, sub) for w, sub in directives if w[0] == "kubernetes"), None)
        if kube is None:
            continue
        zones = kube[0][1:] or keys
        zone = _zone(next((z for z in zones if not _zone(z).endswith("arpa")), zones[0] if zones else "."))
        ttl = next((_int(w, 1) for w in kube[1] if w[0] == "ttl"), None)
        ttl = KUBERNETES_DEFAULT_TTL_S if ttl is None else ttl
        said = [f"kubernetes `ttl {ttl}`" + ("" if any(w[0] == "ttl" for w in kube[1]) else " (the plugin's default)")]
        cache = next(((w, sub) for w, sub in directives if w[0] == "cache"), None)
        args = cache[0][1:] if cache else []
        cache_zones = (args[1:] if args and args[0].isdigit() else args) or keys
        if cache is None or not _covers(cache_zones, zone):
            found[zone] = (0, 0, "; ".join([*said, f"no cache serving {zone}"]))
            continue
        pttl = nttl = int(args[0]) if args and args[0].isdigit() else None
        pmax, nmax = pttl or CACHE_MAX_S, nttl or CACHE_MAX_DENIAL_S
        pmin = nmin = CACHE_MIN_S
        stale, off = 0, set()
        for w in cache[1]:
            if w[0] in ("success", "denial"):
                top, low = _int(w, 2), _int(w, 3)
                if w[0] == "success":
                    pmax, pmin = top or pmax, pmin if low is None else low
                else:
                    nmax, nmin = top or nmax, nmin if low is None else low
            elif w[0] == "serve_stale" and (len(w) < 3 or w[2].lower() != "verify"):
                stale = (_go_seconds(w[1]) if len(w) > 1 else SERVE_STALE_DEFAULT_S) or 0
            elif w[0] == "disable" and len(w) > 1 and (len(w) == 2 or _covers(w[2:], zone)):
                off.add(w[1])
        positive = 0 if "success" in off else min(max(ttl, pmin), pmax) + stale
        negative = 0 if "denial" in off else min(max(min(ttl, SOA_TTL_CAP_S), nmin), nmax) + stale
        said.append(f"`{' '.join(cache[0])}`" + (" {" + "; ".join(" ".join(w) for w in cache[1]) + "}"
                                                 if cache[1] else "")
                    + f" (success max {pmax} s min {pmin} s, denial max {nmax} s min {nmin} s"
                    + (f", serve_stale {stale} s" if stale else "") + (f", {'/'.join(sorted(off))} disabled"
                                                                       if off else "") + ")")
        found[zone] = (positive, negative, "; ".join(said))
    return found


def stale_raised(diff: StackDiff) -> list[Finding]:
    """`dns-cache-stale-raised`: the longest a cluster name's answer, positive or negative, may be served after the
    API changed rises between the base's Corefile and the head's."""
    old, new = corefile(diff.base), corefile(diff.head)
    if old is None or new is None or old == new:
        return []
    was, now = stale_windows(old), stale_windows(new)
    found = []
    for zone in sorted(now):
        if zone not in was:
            continue
        (p0, n0, how0), (p1, n1, how1) = was[zone], now[zone]
        if p1 <= p0 and n1 <= n0:
            continue
        level = HIGH if max(p1, n1) > max(STALE_DEFAULT_S, p0, n0) else MEDIUM
        found.append(Finding(level, STALE_RULE, (
            f"a {zone} name's answer may now be served up to {p1} s after the API changed it (was {p0} s) and an "
            f"NXDOMAIN for it up to {n1} s (was {n0} s): base {how0}; head {how1}. CoreDNS gives its cluster "
            "answers the kubernetes plugin's `ttl` and its NXDOMAIN an SOA of that TTL, and the cache keeps each "
            "for that TTL within its own bounds (coredns at the pinned release, "
            "plugin/kubernetes/kubernetes.go MinTTL, "
            "plugin/backend_lookup.go SOA, plugin/cache/cache.go computeTTL). A gang resolves its headless "
            "Service's and its pods' names at rendezvous: a worker that looks up `job-0.<service>` before pod 0's "
            "record exists gets an NXDOMAIN every CoreDNS replica may cache, so every worker that asks again waits "
            f"up to {n1} s for the name; a restarted member's new IP is not seen for up to {p1} s, so the others "
            "dial the old one and the job's rendezvous times out or hangs. Keep the kubernetes block's `ttl` at "
            f"{STALE_DEFAULT_S} or less (kilonode's and kubeadm's): a larger `cache` TTL then still caches names "
            "outside the cluster for longer while cluster answers stay at the plugin's ttl; and keep the `denial` "
            "TTL and MINTTL and `serve_stale` from raising it for the cluster zone"),
            (f"ConfigMap {NAMESPACE}/{_configmap_name(diff.head)}",), cause="Corefile"))
    return found


def assess(diff: StackDiff) -> list[Finding]:
    return [*reload_reaches(diff), *replicas_cut(diff), *memory_short(diff), *upstream_off_azure(diff),
            *stale_raised(diff)]
