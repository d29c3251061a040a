"""A node sysctl moved that pods do not see (`sysctl-not-in-pods`; independent trace 14, PR 01:
`net.core.somaxconn: 8192` as a stack sysctl override was said only as a fleet rollout).

The kernel keeps some sysctls per network namespace, and a new namespace starts from the kernel's
constant, not from the host's value: net.core.somaxconn (net/core/sysctl_net_core.c netns_core_table;
net/core/net_namespace.c net_defaults_init_net writes SOMAXCONN), net.ipv4.ip_local_port_range
(net/ipv4/af_inet.c inet_init_net), net.ipv4.tcp_syncookies (net/ipv4/tcp_ipv4.c tcp_sk_init), all
read at v6.1, the nodes' kernel. Pods here have their own namespace (Azure CNI; host-network pods
aside), so a value the node's /etc/sysctl.d sets for such a key reaches host-network processes only;
a pod keeps the kernel default unless it sets the key in securityContext.sysctls, which the kubelet
admits for its safe list (kubernetes pkg/kubelet/sysctl/safe_sysctls.go) and for any other key only
when listed in its allowedUnsafeSysctls (--allowed-unsafe-sysctls). Which keys, their defaults and
their sources: the catalogue's `netns` facts (infra/kilonode/catalog/sysctls.yaml). A key whose new
namespace copies the host's value (tcp_rmem, tcp_wmem: tcp_sk_init's memcpy from init_net) reaches
pods created after the change, and is not said here.

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilonode.catalog.sysctls import sysctls
from kilonode.review.compare import StackDiff
from kilonode.review.finding import MEDIUM, Finding
from kilonode.review.lifecycle import load_yaml

RULE = "sysctl-not-in-pods"
KUBELET_CONFIG = "etc/kubernetes/kubelet-config.yaml"  # kilonode.render.pool: each pool's KubeletConfiguration
UNSET = "unset"


def _values(files: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """pool host -> sysctl key -> value, from its rendered /etc/sysctl.d files (the last line wins, as
    systemd-sysctl applies them)."""
    found: dict[str, dict[str, str]] = {}
    for path, text in files.items():
        host = path.split("/", 1)[0]
        if not host.startswith("pool-") or "/etc/sysctl.d/" not in path or not path.endswith(".conf"):
            continue
        for line in str(text).splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith(("#", ";")):
                found.setdefault(host, {})[key.strip()] = " ".join(value.split())
    return found


def _unsafe_allowed(files: Mapping[str, Any], host: str, key: str) -> bool:
    """Does the host's kubelet admit `key` as an unsafe sysctl (KubeletConfiguration allowedUnsafeSysctls,
    a trailing `*` a prefix: safe_sysctls.go isAllowedUnsafe)?"""
    config = load_yaml(str(files.get(f"{host}/{KUBELET_CONFIG}") or "")) or {}
    allowed = config.get("allowedUnsafeSysctls") if isinstance(config, Mapping) else None
    return any(isinstance(a, str) and (key.startswith(a[:-1]) if a.endswith("*") else key == a)
               for a in allowed or [])


def assess(diff: StackDiff) -> list[Finding]:
    """One line per key whose value moves on pool hosts where it is a namespaced sysctl new namespaces
    start at the kernel's default for."""
    base_files = (diff.base or {}).get("files") or {}
    head_files = (diff.head or {}).get("files") or {}
    before, after = _values(base_files), _values(head_files)
    catalogue = sysctls()
    moved: dict[tuple[str, str, str], list[str]] = {}
    for host in sorted(before.keys() & after.keys()):
        for key in sorted(before[host].keys() | after[host].keys()):
            was, now = before[host].get(key, UNSET), after[host].get(key, UNSET)
            row = catalogue.key(key)
            if was == now or row is None or row.netns is None or row.netns.start != "default":
                continue
            moved.setdefault((key, was, now), []).append(host)
    found = []
    for (key, was, now), hosts in sorted(moved.items()):
        netns = catalogue.key(key).netns  # type: ignore[union-attr]  # kept above
        assert netns is not None
        unsafe_ok = [h for h in hosts if _unsafe_allowed(head_files, h, key)]
        if netns.safe:
            admit = "a safe sysctl: the kubelet admits it in any pod (safe_sysctls.go)"
        elif unsafe_ok and len(unsafe_ok) == len(hosts):
            admit = "an unsafe sysctl, which these hosts' kubelets admit (allowedUnsafeSysctls)"
        else:
            admit = ("an unsafe sysctl: the kubelet's --allowed-unsafe-sysctls (KubeletConfiguration "
                     "allowedUnsafeSysctls) must list it" + (f", which only {len(unsafe_ok)} of these hosts' do"
                                                             if unsafe_ok else ", and no kubelet here does")
                     + ", else the kubelet rejects the pod (SysctlForbidden)")
        found.append(Finding(MEDIUM, RULE, (
            f"{key} {was} -> {now} on {len(hosts)} pool host(s) ({', '.join(hosts)}) reaches host-network processes "
            f"only: the kernel keeps it per network namespace and a new one starts at the kernel's {netns.default} "
            f"({netns.source}), and pods have their own (Azure CNI), so pods keep the kernel default unless they "
            f"set it in securityContext.sysctls ({admit}). If the change is meant for pods' listeners or "
            "connections, set it in their pod spec instead, or as well"),
            tuple(f"{h}/etc/sysctl.d" for h in hosts), cause="sysctl"))
    return found
