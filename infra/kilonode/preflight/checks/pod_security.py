"""pod-security: every workload's pod template against its namespace's Pod Security `enforce`
level, as the apiserver's PodSecurity admission will judge each pod the controller creates.

PodSecurity admission checks a pod when it is created (and on the few updates that change its
spec) against the enforce level of its namespace; a namespace label that changes later only
warns about the pods already running (kubernetes staging/src/k8s.io/pod-security-admission/
admission/admission.go: ValidatePod denies, ValidateNamespace on a label change evaluates the
running pods and returns warnings only). So a DaemonSet whose template breaks its namespace's
level keeps its running pods, and every new node (a scale-out, a replaced instance) and the next
rollout of it gets none: the controller's pod creations are refused ("violates PodSecurity").

The level of a namespace: its `pod-security.kubernetes.io/enforce` label, from the recorded
Namespace or NamespacePatch (kube-system's is a patch: kilonode.k8s.pod_security), else the
apiserver's admission configuration's `defaults.enforce` (rendered
etc/kubernetes/admission-config.yaml; its `exemptions.namespaces` are exempt), else
kilonode.plan.defaults.POD_SECURITY_DEFAULT_ENFORCE.

The rules, from the Pod Security Standards (kubernetes.io/docs/concepts/security/
pod-security-standards/) as pod-security-admission implements them (staging/src/k8s.io/
pod-security-admission/policy/), every container and init container judged:

baseline -- privileged containers (check_privileged.go); hostNetwork, hostPID, hostIPC
(check_hostNamespaces.go); hostPath volumes (check_hostPathVolumes.go); hostPort on any port
(check_hostPorts.go); capabilities added beyond AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER,
FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT
(check_capabilities_baseline.go); a seccomp profile of type Unconfined
(check_seccompProfile_baseline.go);
restricted -- baseline, and: volumes only of the restricted types (configMap, csi, downwardAPI,
emptyDir, ephemeral, persistentVolumeClaim, projected, secret: check_restrictedVolumes.go);
allowPrivilegeEscalation false on every container (check_allowPrivilegeEscalation.go);
runAsNonRoot true, on the pod or on every container, and no runAsUser 0
(check_runAsNonRoot.go, check_runAsUser.go); seccomp RuntimeDefault or Localhost on the pod
or on every container (check_seccompProfile_restricted.go); capabilities dropping ALL and
adding none but NET_BIND_SERVICE (check_capabilities_restricted.go). Not judged here: AppArmor,
SELinux options, /proc mount type, sysctls, Windows host process (kilonode sets none of them).

A workload refused by its namespace's level is a break: its pods are never created.

Seeded breaks (tests/preflight/test_pod_security.py): kube-system's enforce privileged ->
baseline (kube-proxy, calico-node, the device plugins, cloud-node-manager refused); a restricted
namespace's balloon without runAsNonRoot, with allowPrivilegeEscalation, without dropping ALL;
a namespace the admission configuration exempts (passes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kilonode.plan import defaults
from kilonode.preflight.model import Finding, Inputs, Resource
from kilonode.preflight.placement import pod_spec_of
from kilonode.yamlio import load_yaml

NAME = "pod-security"
TITLE = "every workload's pods pass their namespace's Pod Security enforce level"

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
ADMISSION_CONFIG = "etc/kubernetes/admission-config.yaml"
# check_capabilities_baseline.go: the capabilities a container may add under baseline
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# check_restrictedVolumes.go: the volume sources restricted admits
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"})
VOLUME_META = frozenset({"name"})


def _levels(inputs: Inputs) -> tuple[dict[str, str], str, set[str]]:
    """namespace -> its enforce label; the cluster default; the exempt namespaces."""
    default, exempt = defaults.POD_SECURITY_DEFAULT_ENFORCE, set()
    for host in inputs.hosts():
        text = inputs.host_files(host).get(ADMISSION_CONFIG)
        if not text:
            continue
        for plugin in (load_yaml(text) or {}).get("plugins") or []:
            if plugin.get("name") == "PodSecurity":
                config = plugin.get("configuration") or {}
                default = str((config.get("defaults") or {}).get("enforce") or default)
                exempt = set((config.get("exemptions") or {}).get("namespaces") or [])
        break  # every apiserver renders the same file
    labels: dict[str, str] = {}
    for resource in inputs.kubernetes():
        if resource.kind not in ("Namespace", "NamespacePatch"):
            continue
        meta = resource.inputs.get("metadata") or {}
        level = (meta.get("labels") or {}).get(ENFORCE_LABEL)
        if level and meta.get("name"):
            labels[str(meta["name"])] = str(level)
    return labels, default, exempt


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def _context(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def baseline_violations(spec: Mapping[str, Any]) -> list[str]:
    """What the pod spec does that baseline forbids, one phrase each."""
    found = []
    for container in _containers(spec):
        name, context = container.get("name", "?"), _context(container)
        if context.get("privileged"):
            found.append(f"container {name} privileged")
        added = sorted(set((context.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES)
        if added:
            found.append(f"container {name} adds {', '.join(added)}")
        ports = [str(p.get("hostPort")) for p in container.get("ports") or [] if p.get("hostPort")]
        if ports:
            found.append(f"container {name} hostPort {', '.join(ports)}")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.append(f"container {name} seccomp Unconfined")
    found += [f"{field}" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]
    paths = [str(v.get("name")) for v in spec.get("volumes") or [] if v.get("hostPath")]
    if paths:
        found.append(f"hostPath volume {', '.join(paths)}")
    if ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("pod seccomp Unconfined")
    return found


def restricted_violations(spec: Mapping[str, Any]) -> list[str]:
    """What the pod spec does that restricted forbids beyond baseline, one phrase each."""
    found = []
    pod = spec.get("securityContext") or {}
    volumes = [f"{v.get('name')} ({kind})" for v in spec.get("volumes") or []
               for kind in set(v) - VOLUME_META if kind not in RESTRICTED_VOLUMES and kind != "hostPath"]
    if volumes:
        found.append(f"volume {', '.join(volumes)}")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for container in _containers(spec):
        name, context = container.get("name", "?"), _context(container)
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"container {name} without allowPrivilegeEscalation false")
        non_root = context.get("runAsNonRoot", pod.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"container {name} without runAsNonRoot true")
        if context.get("runAsUser") == 0:
            found.append(f"container {name} runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"container {name} without seccomp RuntimeDefault or Localhost")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"container {name} does not drop ALL capabilities")
        extra = sorted(set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"})
        if extra:
            found.append(f"container {name} adds {', '.join(extra)}")
    return found


def violations(spec: Mapping[str, Any], level: str) -> list[str]:
    """What `level` refuses in the pod spec (nothing under privileged)."""
    if level == "privileged":
        return []
    found = baseline_violations(spec)
    if level == "restricted":
        found += [v for v in restricted_violations(spec) if v not in found]
    return found


def _namespace(workload: Resource) -> str:
    return str((workload.inputs.get("metadata") or {}).get("namespace") or "default")


def check(inputs: Inputs) -> list[Finding]:
    labels, default, exempt = _levels(inputs)
    findings = []
    for workload in inputs.workloads():
        namespace = _namespace(workload)
        if namespace in exempt:
            continue
        level = labels.get(namespace, default)
        if level not in LEVELS:
            findings.append(Finding(NAME, "break", workload.describe(), (
                f"namespace {namespace}'s {ENFORCE_LABEL} is {level!r}, no level PodSecurity knows: the apiserver "
                "evaluates such a namespace as restricted and reports the label as invalid"),
                f"label it one of {', '.join(LEVELS)}"))
            level = "restricted"
        refused = violations(pod_spec_of(workload.inputs), level)
        if not refused:
            continue
        where = (f"its label {ENFORCE_LABEL}={level}" if namespace in labels else
                 f"the apiserver's default enforce level {level} (admission-config.yaml; it has no label)")
        findings.append(Finding(NAME, "break", workload.describe(), (
            f"namespace {namespace} enforces Pod Security `{level}` ({where}) and the pod template breaks it: "
            f"{'; '.join(refused)}. PodSecurity admission refuses each pod at creation (\"violates PodSecurity\"), so "
            "the controller creates none: its running pods stay until they are replaced, then none is created, and a "
            "new node never gets one (a label changed later only warns about running pods)"),
            f"set {namespace}'s enforce level to one the pod meets (kilonode.plan.defaults.POD_SECURITY_NAMESPACES), "
            "or change the pod spec to meet the level"))
    return findings
