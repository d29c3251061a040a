"""The Pod Security Standards' baseline and restricted checks, offline, on a pod spec as the
apiserver receives it (camelCase dicts: a recorded object's manifest). A port of the
PodSecurity admission plugin's checks, kubernetes/kubernetes staging/src/k8s.io/pod-security-
admission/policy/check_*.go, as they stand for Kubernetes 1.32-1.35 (each check's newest
VersionedCheck at or below 1.35); the file behind each is named on its function.

Where upstream relaxed a check in a version (sysctls added to the allowed list after 1.0, the
user-namespace relaxations of runAsNonRoot/runAsUser for `hostUsers: false`), this port keeps
the stricter older rule: it may refuse what the apiserver admits, never admit what it refuses.

`violations(spec, level, minor)` lists what a pod spec breaks at a level: [] means admitted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Spec = dict[str, Any]
LEVELS = ("privileged", "baseline", "restricted")


def containers(spec: Spec) -> Iterator[dict[str, Any]]:
    """policy/visitor.go visitContainers: containers, initContainers, ephemeralContainers."""
    for key in ("containers", "initContainers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def _pod_sc(spec: Spec) -> dict[str, Any]:
    return spec.get("securityContext") or {}


def host_process(spec: Spec, minor: int) -> list[str]:
    """check_windowsHostProcess.go: windowsOptions.hostProcess unset or false."""
    setters = [s for s in (_pod_sc(spec), *map(_sc, containers(spec)))
               if (s.get("windowsOptions") or {}).get("hostProcess")]
    return ["hostProcess"] if setters else []


def host_namespaces(spec: Spec, minor: int) -> list[str]:
    """check_hostNamespaces.go: hostNetwork, hostPID, hostIPC unset or false."""
    return [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]


def privileged(spec: Spec, minor: int) -> list[str]:
    """check_privileged.go: securityContext.privileged unset or false."""
    return [f"privileged ({c['name']})" for c in containers(spec) if _sc(c).get("privileged")]


CAPABILITIES_BASELINE = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def capabilities_baseline(spec: Spec, minor: int) -> list[str]:
    """check_capabilities_baseline.go: capabilities.add within the default set."""
    return [f"capability {cap} ({c['name']})" for c in containers(spec)
            for cap in (_sc(c).get("capabilities") or {}).get("add") or [] if cap not in CAPABILITIES_BASELINE]


def host_path_volumes(spec: Spec, minor: int) -> list[str]:
    """check_hostPathVolumes.go: no hostPath volume."""
    return [f"hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]


def host_ports(spec: Spec, minor: int) -> list[str]:
    """check_hostPorts.go: ports[*].hostPort unset or 0."""
    return [f"hostPort {p['hostPort']} ({c['name']})" for c in containers(spec)
            for p in c.get("ports") or [] if p.get("hostPort")]


def app_armor(spec: Spec, minor: int) -> list[str]:
    """check_appArmorProfile.go: appArmorProfile.type RuntimeDefault or Localhost (not
    Unconfined), and the legacy container.apparmor.security.beta.kubernetes.io annotations
    runtime/default or localhost/*; only the fields here (annotations are the template's)."""
    return [f"appArmorProfile {s['appArmorProfile'].get('type')}" for s in (_pod_sc(spec), *map(_sc, containers(spec)))
            if "appArmorProfile" in s and s["appArmorProfile"].get("type") not in ("RuntimeDefault", "Localhost")]


SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})


def selinux(spec: Spec, minor: int) -> list[str]:
    """check_seLinuxOptions.go: type in the allowed set, user and role unset."""
    bad = []
    for s in (_pod_sc(spec), *map(_sc, containers(spec))):
        options = s.get("seLinuxOptions")
        if options and (options.get("type", "") not in SELINUX_TYPES or options.get("user") or options.get("role")):
            bad.append(f"seLinuxOptions {options}")
    return bad


def proc_mount(spec: Spec, minor: int) -> list[str]:
    """check_procMount.go: procMount unset or Default."""
    return [f"procMount {_sc(c)['procMount']} ({c['name']})" for c in containers(spec)
            if _sc(c).get("procMount", "Default") != "Default"]


def seccomp_baseline(spec: Spec, minor: int) -> list[str]:
    """check_seccompProfile_baseline.go: seccompProfile.type not Unconfined."""
    return [f"seccompProfile {s['seccompProfile']['type']}" for s in (_pod_sc(spec), *map(_sc, containers(spec)))
            if (s.get("seccompProfile") or {}).get("type") == "Unconfined"]


SYSCTLS_BASELINE = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                              "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"})


def sysctls(spec: Spec, minor: int) -> list[str]:
    """check_sysctls.go: the 1.0 allowed set (later versions allow more: kept strict)."""
    return [f"sysctl {s['name']}" for s in _pod_sc(spec).get("sysctls") or [] if s["name"] not in SYSCTLS_BASELINE]


def probe_hosts(spec: Spec, minor: int) -> list[str]:
    """check_hostProbesAndhostLifecycle.go (1.34+): no host in probes' or lifecycle handlers'
    httpGet/tcpSocket."""
    if minor < 34:
        return []
    bad = []
    for c in containers(spec):
        handlers = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(c.get("lifecycle") or {}).get(h) for h in ("postStart", "preStop")]
        for handler in filter(None, handlers):
            bad += [f"{kind}.host ({c['name']})" for kind in ("httpGet", "tcpSocket")
                    if (handler.get(kind) or {}).get("host")]
    return bad


RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})


def restricted_volumes(spec: Spec, minor: int) -> list[str]:
    """check_restrictedVolumes.go: only the listed volume types."""
    return [f"volume {v['name']}" for v in spec.get("volumes") or [] if not RESTRICTED_VOLUMES & set(v)]


def privilege_escalation(spec: Spec, minor: int) -> list[str]:
    """check_allowPrivilegeEscalation.go: allowPrivilegeEscalation false on every container."""
    return [f"allowPrivilegeEscalation ({c['name']})" for c in containers(spec)
            if _sc(c).get("allowPrivilegeEscalation") is not False]


def _inherited(spec: Spec, key: str, good: Callable[[Any], bool]) -> list[str]:
    """Set to a good value on the pod (containers may leave it unset) or on every container;
    set to a bad one nowhere (the shape of check_runAsNonRoot.go, check_seccompProfile_restricted.go)."""
    pod = _pod_sc(spec).get(key)
    bad = ["pod"] if pod is not None and not good(pod) else []
    for c in containers(spec):
        value = _sc(c).get(key)
        if (value is not None and not good(value)) or (value is None and (pod is None or not good(pod))):
            bad.append(c["name"])
    return [f"{key} ({who})" for who in bad]


def run_as_non_root(spec: Spec, minor: int) -> list[str]:
    """check_runAsNonRoot.go: runAsNonRoot true on the pod or every container, false nowhere."""
    return _inherited(spec, "runAsNonRoot", lambda v: v is True)


def run_as_user(spec: Spec, minor: int) -> list[str]:
    """check_runAsUser.go: runAsUser not 0 on the pod or any container."""
    setters = [("pod", _pod_sc(spec)), *((c["name"], _sc(c)) for c in containers(spec))]
    return [f"runAsUser 0 ({who})" for who, s in setters if s.get("runAsUser") == 0]


def seccomp_restricted(spec: Spec, minor: int) -> list[str]:
    """check_seccompProfile_restricted.go: RuntimeDefault or Localhost, on the pod or every container."""
    return _inherited(spec, "seccompProfile", lambda v: v.get("type") in ("RuntimeDefault", "Localhost"))


def capabilities_restricted(spec: Spec, minor: int) -> list[str]:
    """check_capabilities_restricted.go: drop ALL, add nothing but NET_BIND_SERVICE."""
    bad = []
    for c in containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"capabilities.drop lacks ALL ({c['name']})")
        bad += [f"capability {cap} ({c['name']})" for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
    return bad


Check = Callable[[Spec, int], list[str]]
BASELINE: tuple[Check, ...] = (host_process, host_namespaces, privileged, capabilities_baseline, host_path_volumes,
                               host_ports, app_armor, selinux, proc_mount, seccomp_baseline, sysctls, probe_hosts)
RESTRICTED: tuple[Check, ...] = (restricted_volumes, privilege_escalation, run_as_non_root, run_as_user,
                                 seccomp_restricted, capabilities_restricted)


def violations(spec: Spec, level: str, minor: int) -> list[str]:
    """What `spec` breaks at `level` (policy/registry.go: restricted includes baseline)."""
    if level not in LEVELS:
        raise ValueError(f"unknown PodSecurity level {level!r}")
    checks = {"privileged": (), "baseline": BASELINE, "restricted": BASELINE + RESTRICTED}[level]
    return [problem for check in checks for problem in check(spec, minor)]
