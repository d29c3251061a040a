"""PodSecurity admission (the Pod Security Standards, enforced by the apiserver's built-in
PodSecurity plugin): the cluster-wide default levels the apiserver's admission configuration
sets (kilonode.render.control_plane) and the levels of each namespace kilonode creates or
relies on, written as namespace labels (kilonode.k8s.pod_security). One table for both, so the
file the apiserver reads and the labels cannot disagree.

Levels and label keys: kubernetes staging/src/k8s.io/pod-security-admission/api/constants.go
(privileged, baseline, restricted; pod-security.kubernetes.io/{enforce,audit,warn}[-version]).
"""

from __future__ import annotations

from kilonode.plan.defaults.flowcontrol import MONITORING_NAMESPACE

# The default for every namespace without its own labels (the users' namespaces): enforce
# `baseline`, not `restricted`. Baseline refuses what reaches the node -- privileged
# containers, host namespaces (a hostNetwork pod would bypass the node's block of pod traffic
# to the instance metadata service), hostPath volumes, host ports, added capabilities -- and
# training images (CUDA, PyTorch) run as they are: most run as root and set no seccomp
# profile or runAsNonRoot, which `restricted` refuses outright. audit and warn stay at
# `restricted`, so a user sees (kubectl warnings) and the audit log records what would
# still have to change to meet it.
POD_SECURITY_DEFAULT_ENFORCE = "baseline"
POD_SECURITY_DEFAULT_AUDIT = "restricted"
POD_SECURITY_DEFAULT_WARN = "restricted"

# Per namespace kilonode creates or runs pods in: mode -> level. The version labels are the
# cluster's own minor (v1.<minor>), as is the admission configuration's default, so an
# apiserver upgrade changes the rules a namespace is held to only with the plan.
POD_SECURITY_NAMESPACES: dict[str, dict[str, str]] = {
    # kube-proxy (privileged, hostPath, host network), the device plugins (hostPath to the
    # kubelet's device-plugin socket directory), cloud-node-manager (host network): node
    # agents that need the node, so `privileged`. The audit log still records every pod that
    # is not `restricted`; no warnings, as each of these pods is known and listed in
    # policy/security-exceptions.yaml (a warning on every `pulumi up` teaches people to skip them).
    "kube-system": {"enforce": "privileged", "audit": "restricted", "warn": "privileged"},
    # The cluster's Prometheus (kilonode.k8s.monitoring): non-root, no host access, configMap and
    # emptyDir volumes only, so `restricted`; a user's exporter added here must meet it too.
    "monitoring": {"enforce": "restricted", "audit": "restricted", "warn": "restricted"},
    # The balloons: pause containers the tool writes whole, which need nothing from the node.
    "kilonode-capacity": {"enforce": "restricted", "audit": "restricted", "warn": "restricted"},
}

# The namespaces whose pods may run on the reserved pools (the system pools and the Prometheus
# pool: kilonode.plan.listeners): the cluster's own agents and controllers, and its Prometheus.
# The reserved-pools admission policy (kilonode.k8s.reserved_pools) refuses, everywhere else, a pod
# that tolerates every taint of such a pool or names one of its nodes, so that a pod address of the
# Prometheus pool's subnet is the scraper's or a system pod's, never a user's. Creating pods here
# is an administrator's right; a tool that must run beside them (a policy engine's node agent)
# runs in kube-system, as Calico's policy-only manifest puts it.
SYSTEM_NAMESPACES = ("kube-system", MONITORING_NAMESPACE)
