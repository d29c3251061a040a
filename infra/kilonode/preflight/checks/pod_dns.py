"""pod-dns: what a pod's resolvers are, on each pool, per dnsPolicy, and whether they answer.

What the kubelet gives a pod (kubernetes pkg/kubelet/network/dns/dns.go, GetPodDNS):
- `dnsPolicy: Default`, and `ClusterFirst` on a hostNetwork pod (which falls back to
  Default: cloud-controller-manager, cluster-autoscaler, node agents): the nameservers of
  the kubelet's `resolvConf` file as they are (default /etc/resolv.conf; nothing filters a
  loopback address);
- `ClusterFirst` on any other pod: the kubelet's `clusterDNS` addresses only.

What the file holds comes from the node image: it enables systemd-resolved
(node-image/recipe.toml, [units] enable; the built image's manifest does not record its
units, so the recipe is what preflight reads), so /etc/resolv.conf is resolved's stub naming
127.0.0.53 and /run/systemd/resolve/resolv.conf lists the upstream servers DHCP gave.

Breaks:
- a loopback nameserver reaching a pod that is not on the host network: inside the pod's
  network namespace 127.0.0.53 is the pod itself, so every lookup of a Default pod fails;
  CoreDNS (dnsPolicy Default, `forward . /etc/resolv.conf`) forwards to itself and its `loop`
  plugin halts it: CrashLoopBackOff, and with it every ClusterFirst lookup in the cluster
  (coredns plugin/loop/README.md). The fix is the kubelet's resolvConf pointing at resolved's
  own file (kubeadm does the same; the plan's choice: kilonode.plan.defaults.node);
- a resolvConf file the image does not have (the kubelet then fails pod sandbox creation);
- the clusterDNS address not served: no Service in the graph has that clusterIP, or the
  workload behind it cannot be placed at bootstrap (the `scheduling` check's placement).
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import ip_address
from typing import Any

from kilonode.image.recipe import load_recipe
from kilonode.preflight.checks.scheduling import Placement, placements
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.nodes import PoolNodes, bootstrap_nodes
from kilonode.preflight.placement import pod_spec_of

NAME = "pod-dns"
TITLE = "each pool's resolvers for dnsPolicy Default and ClusterFirst pods, and the cluster DNS address served"
RESOLVED_UNIT = "systemd-resolved.service"
ETC_RESOLV_CONF = "/etc/resolv.conf"  # the kubelet's default resolvConf (KubeletConfiguration v1beta1)
RESOLVED_UPSTREAM = "/run/systemd/resolve/resolv.conf"
RESOLVED_STUB = "127.0.0.53"  # systemd-resolved's stub listener, what its /etc/resolv.conf names
UPSTREAM = "the upstream servers systemd-resolved learnt from DHCP"
FIX_RESOLV_CONF = (f"set the kubelet's resolvConf to {RESOLVED_UPSTREAM} (the plan's pool resolv_conf, "
                   "kilonode.plan.defaults.node KUBELET_RESOLV_CONF; what kubeadm does when systemd-resolved is "
                   "active)")


def _nameservers(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("nameserver") and len(line.split()) > 1]


def host_resolvers(group: PoolNodes, inputs: Inputs, resolved: bool) -> tuple[list[str] | None, str]:
    """The nameservers of the pool's resolvConf file as the booted node has it (None: the
    file is missing; [] with a reason: unknown), and where that comes from."""
    path = str(group.kubelet_config.get("resolvConf", ETC_RESOLV_CONF))
    if not path:
        # dns.go: an empty resolvConf gives pods no host nameserver; libc then tries 127.0.0.1
        return ["127.0.0.1"], "resolvConf is empty (DNS lookups disabled: libc falls back to 127.0.0.1)"
    rendered = inputs.host_files(group.host).get(path.lstrip("/"))
    if rendered is not None:
        return _nameservers(rendered), f"{path} as rendered"
    if path == ETC_RESOLV_CONF and resolved:
        return [RESOLVED_STUB], f"{path}: systemd-resolved's stub (the image enables {RESOLVED_UNIT})"
    if path == RESOLVED_UPSTREAM:
        if resolved:
            return [UPSTREAM], f"{path}: systemd-resolved's list of upstream servers"
        return None, f"{path}: only systemd-resolved writes it, and the image does not enable {RESOLVED_UNIT}"
    return [], f"{path}: a file preflight cannot see (neither rendered nor the image's)"


def _loopback(servers: list[str]) -> list[str]:
    found = []
    for server in servers:
        try:
            if ip_address(server).is_loopback:
                found.append(server)
        except ValueError:
            continue
    return found


def _dns_policy(spec: Mapping[str, Any]) -> str:
    return str(spec.get("dnsPolicy") or "ClusterFirst")


def _config_maps(inputs: Inputs) -> dict[tuple[str, str], Mapping[str, Any]]:
    found = {}
    for r in inputs.kubernetes():
        if r.kind == "ConfigMap":
            meta = r.inputs.get("metadata") or {}
            found[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = r.inputs.get("data") or {}
    return found


def forwards_to_resolv_conf(workload: Resource, inputs: Inputs) -> bool:
    """CoreDNS-like: a mounted ConfigMap's Corefile forwards to /etc/resolv.conf with `loop` on."""
    spec = pod_spec_of(workload.inputs)
    namespace = str((workload.inputs.get("metadata") or {}).get("namespace") or "default")
    maps = _config_maps(inputs)
    for volume in spec.get("volumes") or []:
        data = maps.get((namespace, str((volume.get("configMap") or {}).get("name"))), {})
        for text in data.values():
            lines = [line.split("#", 1)[0].split() for line in str(text).splitlines()]
            if ["loop"] in lines and any(w[:3] == ["forward", ".", ETC_RESOLV_CONF] for w in lines):
                return True
    return False


def _default_pool(found: Placement, group: PoolNodes) -> bool:
    return group.host in found.now or group.host in found.after_gpu_health


def _pool_findings(group: PoolNodes, inputs: Inputs, resolved: bool, placed: dict[str, Placement]) -> list[Finding]:
    servers, source = host_resolvers(group, inputs, resolved)
    if servers is None:
        return [Finding(NAME, "break", group.host,
                        f"the kubelet's resolvConf is missing ({source}): every pod sandbox on its {group.count:,} "
                        "nodes fails to be created", FIX_RESOLV_CONF)]
    loopback = _loopback(servers)
    if not loopback:
        return []
    findings = []
    users = [p.workload for p in placed.values() if _default_pool(p, group)]
    default_pods = [w for w in users if _dns_policy(pod_spec_of(w.inputs)) == "Default"
                    and not pod_spec_of(w.inputs).get("hostNetwork")]
    named = ", ".join(w.describe() for w in default_pods) or "none of the program's, but any a user runs"
    findings.append(Finding(
        NAME, "break", group.host,
        f"dnsPolicy Default pods get nameserver {', '.join(loopback)} ({source}); inside a pod's network namespace "
        f"that is the pod itself, so their lookups fail. Pods hit here: {named}",
        FIX_RESOLV_CONF))
    for workload in default_pods:
        if forwards_to_resolv_conf(workload, inputs):
            findings.append(Finding(
                NAME, "break", f"{workload.describe()} on {group.host}",
                f"it forwards to {ETC_RESOLV_CONF}, which the kubelet fills with {', '.join(loopback)}: it forwards "
                "to itself, its `loop` plugin halts it (CrashLoopBackOff), and every ClusterFirst lookup in the "
                "cluster fails with it", FIX_RESOLV_CONF))
    return findings


def _served_by(inputs: Inputs, address: str) -> Resource | None:
    for r in inputs.kubernetes():
        if r.kind == "Service" and str((r.inputs.get("spec") or {}).get("clusterIP")) == address:
            return r
    return None


def _backends(service: Resource, placed: dict[str, Placement]) -> list[Placement]:
    spec = service.inputs.get("spec") or {}
    selector = spec.get("selector") or {}
    namespace = (service.inputs.get("metadata") or {}).get("namespace")
    found = []
    for p in placed.values():
        labels = (((p.workload.inputs.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
        if (p.workload.inputs.get("metadata") or {}).get("namespace") == namespace and selector and all(
                (labels or {}).get(k) == v for k, v in selector.items()):
            found.append(p)
    return found


def _cluster_dns(groups: list[PoolNodes], inputs: Inputs, placed: dict[str, Placement]) -> list[Finding]:
    findings = []
    addresses: dict[str, list[str]] = {}
    for group in groups:
        cluster_dns = [str(a) for a in group.kubelet_config.get("clusterDNS") or []]  # type: ignore[union-attr]
        if not cluster_dns:
            findings.append(Finding(
                NAME, "warn", group.host,
                "the kubelet has no clusterDNS: ClusterFirst pods fall back to Default (MissingClusterDNS) and "
                "cannot resolve Service names",
                "set clusterDNS to the cluster DNS Service's address (the plan's control_plane.cluster_dns_ip)"))
        for address in cluster_dns:
            addresses.setdefault(address, []).append(group.host)
    for address, hosts in sorted(addresses.items()):
        service = _served_by(inputs, address)
        where = f"clusterDNS {address} ({', '.join(hosts)})"
        if service is None:
            findings.append(Finding(
                NAME, "break", where,
                "no Service in the graph has this clusterIP: every ClusterFirst pod's lookups time out",
                "create the cluster DNS Service at this address (kilonode.k8s.dns), or point clusterDNS at it"))
            continue
        backends = _backends(service, placed)
        if not any(p.nodes_now for p in backends):
            who = ", ".join(p.workload.describe() for p in backends) or "no workload matches its selector"
            findings.append(Finding(
                NAME, "break", where,
                f"{service.describe()} has no backend at bootstrap ({who} cannot be placed: see the scheduling "
                "check): every ClusterFirst pod's lookups time out",
                "make its workload schedulable at bootstrap (a system pool, with no taint but its CriticalAddonsOnly)"))
    return findings


def check(inputs: Inputs) -> list[Finding]:
    resolved = RESOLVED_UNIT in load_recipe().enable_units
    groups = [g for g in bootstrap_nodes(inputs) if g.count]
    placed = placements(inputs)
    findings = []
    for group in groups:
        findings += _pool_findings(group, inputs, resolved, placed)
    return findings + _cluster_dns(groups, inputs, placed)
