"""What each CIS check's audit would print on kilonode's hosts, from the rendered artefacts.

kube-bench reads a running host: `ps` for a program's command line, `stat` for a file's mode and
owner, `cat` for a config file, kubectl for the cluster's objects. Offline, each of those comes
from what kilonode renders, in its structured form:

- command lines: the renderers' flag lists (kilonode.render.control_plane, .etcd, .pool), checked
  equal to the rendered unit's ExecStart (`host_flags`);
- config files: the rendered KubeletConfiguration and KubeSchedulerConfiguration, parsed;
- file modes and owners: the rendered cloud-init user-data's `write_files` (what cloud-init
  writes) and the TLS files of kilonode.plan.pki's layout (what the Pulumi program adds to the
  custom data, kilonode.azure.custom_data);
- cluster objects (section 5): the recorded graph of the stack (what `pulumi up` sends).

Each check id is answered here by an `Audit` (kube_bench.run then decides) or a `NotApplicable`
with the reason it cannot be answered offline or does not apply to kilonode's hosts.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kilonode.azure.graph import Graph
from kilonode.plan import ClusterPlan, pki, wellknown
from kilonode.plan.encryption import encryption_configuration
from kilonode.render import HostFiles
from kilonode.render.common import EndsInVariable, Flag, flag_value
from kilonode.render.control_plane import (
    SCHEDULER_CONFIG,
    apiserver_flags,
    controller_manager_flags,
    scheduler_flags,
)
from kilonode.render.etcd import ETCD_UNIT, etcd_flags
from kilonode.render.files import USER_DATA
from kilonode.render.pool import KUBELET_CONFIG, kubelet_flags
from tests import shared
from tests.render.test_upstream_flags import REFERENCE, exec_start
from tests.security.kube_bench import Audit, Check

# kube-bench's cfg/config.yaml names each file by a variable; on kilonode's hosts they are these.
# kilonode runs the control plane as systemd units, not static pods: the unit holds the command
# line that a "pod specification file" holds under kubeadm (kube-bench itself lists etcd's
# systemd unit among etcd's `confs`).
UNITS = "/etc/systemd/system"
VARIABLES = {
    "$apiserverconf": f"{UNITS}/kube-apiserver.service",
    "$controllermanagerconf": f"{UNITS}/kube-controller-manager.service",
    "$schedulerconf": f"{UNITS}/kube-scheduler.service",
    "$etcdconf": f"/{ETCD_UNIT}",
    "$schedulerkubeconfig": wellknown.SCHEDULER_KUBECONFIG,
    "$controllermanagerkubeconfig": wellknown.CONTROLLER_MANAGER_KUBECONFIG,
    "$kubeletsvc": f"{UNITS}/kubelet.service",
    "$kubeletconf": f"/{KUBELET_CONFIG}",
    "$kubeletkubeconfig": wellknown.KUBELET_KUBECONFIG,
    # kube-proxy runs as a DaemonSet (kilonode.k8s.proxy): its kubeconfig is in its pod, not on the host
    "$proxykubeconfig": "/etc/kubernetes/proxy.conf",
}
BINARIES = {
    "$apiserverbin": "kube-apiserver",
    "$controllermanagerbin": "kube-controller-manager",
    "$schedulerbin": "kube-scheduler",
    "$etcdbin": "etcd",
    "$kubeletbin": "kubelet",
    "$proxybin": "kube-proxy",
}
# The literal paths some audits name (1.1.13/1.1.14; 1.1.19-1.1.21's `find`)
ADMIN_CONFS = ("/etc/kubernetes/admin.conf", "/etc/kubernetes/super-admin.conf")
K8S_PKI = wellknown.K8S_PKI_DIR

# Where a program ignores the flag a check reads, in the configuration kilonode renders, and
# reads a config-file field instead: the check's test is applied to that field. Each key must
# be marked ignored by tests/render/upstream_flags.toml (the program's source says so), which
# `ignored_flag` checks; a flag ignored with no entry here makes the check an error.
CONFIG_EQUIVALENT = {
    # cmd/kube-scheduler/app/options/options.go ApplyTo: --profiling is applied only without --config
    ("kube-scheduler", "--profiling"): (SCHEDULER_CONFIG, "{.enableProfiling}"),
}


@dataclass(frozen=True)
class NotApplicable:
    reason: str


Answer = Audit | NotApplicable


@dataclass
class Host:
    """One rendered host of a stack, as its audits see it."""

    stack: str
    name: str
    role: str  # "apiserver", "etcd", "pool"
    files: HostFiles
    flags: dict[str, list[Flag]]  # program -> its flags, from the renderer
    written: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (mode, owner)

    def command(self, program: str) -> str:
        """The command line `ps` would show (a value systemd fills in at start kept as ${NAME})."""
        words = [program]
        for name, value in self.flags[program]:
            text = f"{value.literal}${{{value.variable}}}" if isinstance(value, EndsInVariable) else flag_value(value)
            words.append(f"--{name}={text}")
        return " ".join(words)

    def config(self, path: str) -> Any:
        return shared.load_yaml(self.files[path.lstrip("/")].content)


def _write_files(files: HostFiles) -> dict[str, tuple[str, str]]:
    """path -> (mode as `stat -c %a` prints it, owner) of the user-data's write_files."""
    document = shared.load_yaml(files[USER_DATA].content)
    return {entry["path"]: (f"{int(entry['permissions'], 8):o}", entry["owner"]) for entry in document["write_files"]}


def _pki(entries: tuple[pki.HostFile, ...]) -> dict[str, tuple[str, str]]:
    return {f.path: (f"{f.mode:o}", f.owner) for f in entries}


def hosts(stack: str) -> Iterator[Host]:
    plan = shared.plan(stack)
    rendered = shared.rendered(stack)
    layout = pki.pki_layout(plan)
    for cluster in plan.etcd_clusters:
        for member in cluster.members:
            files = rendered[member.name]
            yield Host(stack, member.name, "etcd", files, {"etcd": etcd_flags(cluster, member)},
                       _write_files(files) | _pki(layout.hosts[member.name]))
    for instance in plan.control_plane.instances:
        files = rendered[instance.name]
        flags = {"kube-apiserver": apiserver_flags(plan, instance), "kube-scheduler": scheduler_flags(instance),
                 "kube-controller-manager": controller_manager_flags(instance, None,
                                                                     plan.controller_clients)}
        written = _write_files(files) | _pki(layout.hosts[instance.name])
        yield Host(stack, instance.name, "apiserver", files, flags, written)
    for pool in plan.node_pools:
        for team in [None, *pool.teams]:
            files = rendered[pool.role(team)]
            yield Host(stack, pool.role(team), "pool", files, {"kubelet": kubelet_flags(pool.registration(team))},
                       _write_files(files) | _pki(layout.node_files))


def unit_flags(host: Host, program: str) -> dict[str, str]:
    """The flags of the host's unit that runs `program`, as the rendered file has them."""
    unit = f"etc/systemd/system/{'etcd' if program == 'etcd' else program}.service"
    return exec_start(host.files[unit].content)[1]


def ignored_flag(program: str, flag: str, flags: Mapping[str, str], plan: ClusterPlan) -> bool:
    """Whether upstream_flags.toml marks `flag` ignored by `program` with the flags rendered."""
    if program not in ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubelet"):
        return False
    entry = REFERENCE["flags"][program][f"1.{plan.kubernetes_minor}"]
    for rule in entry.get("rules", []):
        if rule["kind"] != "ignored" or flag.removeprefix("--") not in rule["flags"]:
            continue
        if "when_set" in rule and rule["when_set"] not in flags:
            continue
        if "unless" in rule and all(flags.get(k) == v for k, v in rule["unless"].items()):
            continue
        return True
    return False


# ---------------------------------------------------------------- files (1.1.x, 4.1.x)

def _stat(host: Host, paths: list[str], fmt: str) -> Answer:
    present = [p for p in paths if p in host.written]
    if not present:
        return NotApplicable(f"{', '.join(paths)}: not on {host.role} hosts (the audit prints nothing)")
    lines = []
    for path in present:
        mode, owner = host.written[path]
        lines.append(fmt.format(mode=mode, owner=owner, path=path))
    return Audit(command="\n".join(lines))


def _under(host: Host, directory: str, suffix: str = "") -> list[str]:
    return sorted(p for p in host.written if p.startswith(directory + "/") and p.endswith(suffix))


def _etcd_data_dir(host: Host, fmt: str) -> Answer:
    """etcd.service makes the data dir before etcd starts (ExecStartPre=+install -d -o -g -m):
    its mode and owner are that command's arguments."""
    data_dir = dict(host.flags["etcd"])["data-dir"]
    for line in host.files[ETCD_UNIT].content.splitlines():
        if line.startswith("ExecStartPre=") and "/install " in line:
            words = shlex.split(line.removeprefix("ExecStartPre=").lstrip("+-@:!"))
            if words[-1] == data_dir and "-d" in words:
                opt = {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i] in ("-o", "-g", "-m")}
                mode = f"{int(opt['-m'], 8):o}"
                return Audit(command=fmt.format(mode=mode, owner=f"{opt['-o']}:{opt['-g']}", path=data_dir))
    return NotApplicable(f"{data_dir}: made by etcd itself, no unit command sets its mode")


PERMS, OWNER = "permissions={mode}", "{owner}"


def file_audit(check: Check, host: Host) -> Answer | None:
    """The stat output of a 1.1.x / 4.1.x file check, or None when the check is not a file check."""
    i = check.id
    if i in ("1.1.11", "1.1.12"):
        return _etcd_data_dir(host, PERMS if i == "1.1.11" else OWNER) if host.role == "etcd" else None
    if i in ("1.1.9", "1.1.10"):
        return NotApplicable("the CNI files of a control-plane node's kubelet: no kubelet runs on kilonode's "
                             "apiserver hosts (the pools' conflist is not what this item reads)")
    if i in ("1.1.13", "1.1.14"):
        fmt = "permissions={mode} {path}" if i == "1.1.13" else "ownership={owner} {path}"
        return _stat(host, list(ADMIN_CONFS), fmt)
    if i == "1.1.19":
        return _stat(host, _under(host, K8S_PKI), OWNER)
    if i in ("1.1.20", "1.1.21"):
        return _stat(host, _under(host, K8S_PKI, ".crt" if i == "1.1.20" else ".key"), PERMS)
    if i in ("4.1.5", "4.1.6"):
        return NotApplicable(f"{wellknown.KUBELET_KUBECONFIG} is written by the kubelet at TLS bootstrap "
                             "(client-go clientcmd.WriteToFile), not by kilonode: only a live node shows it")
    if i in ("4.1.7", "4.1.8"):
        # the kubelet's CA: its --client-ca-file, else the config's clientCAFile
        ca = host.config(KUBELET_CONFIG)["authentication"]["x509"]["clientCAFile"]
        return _stat(host, [ca], PERMS if i == "4.1.7" else OWNER)
    variable = re.search(r"\$[a-z]+(conf|svc|kubeconfig)\b", check.audit)
    if variable is None or "stat -c" not in check.audit:
        return None
    fmt = PERMS if "permissions=%a" in check.audit else OWNER
    return _stat(host, [VARIABLES[variable.group(0)]], fmt)


# ---------------------------------------------------------------- command lines and configs

def program_audit(check: Check, host: Host, plan: ClusterPlan,
                  proxy: Audit | None) -> tuple[Check, Answer] | None:
    """The check (its flag items pointed at a config field where CONFIG_EQUIVALENT says the
    program reads that instead) and what its audit prints; None when it reads no program."""
    binary = re.search(r"\$[a-z]+bin\b", check.audit)
    if binary is None or binary.group(0) not in BINARIES:
        return None
    program = BINARIES[binary.group(0)]
    if program == "kube-proxy":
        return check, proxy or NotApplicable("no kube-proxy DaemonSet recorded")
    if program not in host.flags:
        return check, NotApplicable(f"{program} does not run on {host.role} hosts")
    if check.id == "1.2.28":
        return check, encryption_audit()
    rendered = unit_flags(host, program)
    for item in check.items:
        if item.flag.startswith("--") and ignored_flag(program, item.flag, rendered, plan):
            equivalent = CONFIG_EQUIVALENT.get((program, item.flag))
            if equivalent is None:
                raise AssertionError(f"{check.id}: {program} ignores {item.flag} here and no config field is mapped")
            path, jsonpath = equivalent
            # the ignored flag is no evidence either way: the item reads the config field alone
            items = tuple(replace(i, flag="", path=jsonpath) if i.flag == item.flag else i for i in check.items)
            return replace(check, items=items), Audit(command=host.command(program), config=host.config(path))
    config = host.config(KUBELET_CONFIG) if program == "kubelet" else None
    return check, Audit(command=host.command(program), config=config)


def proxy_audit(graph: Graph) -> Audit | None:
    """kube-proxy's command line (the DaemonSet's container command) and the config it reads
    (--config: the file its ConfigMap mounts), as kilonode.k8s.proxy records them. kube-bench's
    audit_config reads $proxykubeconfig, a kubeconfig, where no metricsBindAddress can be: the
    KubeProxyConfiguration is what kube-proxy reads that setting from."""
    daemonsets = [o for o in _kind(graph, "DaemonSet") if o["metadata"]["name"] == "kube-proxy"]
    maps = [o for o in _kind(graph, "ConfigMap") if o["metadata"]["name"] == "kube-proxy"]
    if not daemonsets or not maps:
        return None
    container = daemonsets[0]["spec"]["template"]["spec"]["containers"][0]
    command = " ".join([*container.get("command", []), *container.get("args", [])])
    config_flag = next(word for word in command.split() if word.startswith("--config="))
    key = config_flag.rsplit("/", 1)[-1]
    return Audit(command=command, config=shared.load_yaml(maps[0]["data"][key]))


def encryption_audit() -> Audit:
    """1.2.28's audit: the first provider under `providers:` of the --encryption-provider-config
    file, as `grep -A1 'providers:' | tail -n1 | grep -o "[A-Za-z]*"` reads it. The file is the
    Pulumi program's (kilonode.plan.encryption), rendered here with a zero key."""
    text = encryption_configuration("A" * 43 + "=")
    lines = text.splitlines()
    after = next(lines[i + 1] for i, line in enumerate(lines) if "providers:" in line)
    return Audit(command="\n".join(f"provider={word}" for word in re.findall(r"[A-Za-z]+", after)))


# ---------------------------------------------------------------- cluster objects (5.x)

WILDCARD = '["*"]'
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def objects(graph: Graph) -> list[dict[str, Any]]:
    return [r.plain() for r in graph.resources if r.custom and r.type.startswith("kubernetes:")]


def pods(graph: Graph) -> list[tuple[str, str, dict[str, Any]]]:
    """(namespace, workload name, pod spec) of every workload's pod template."""
    found = []
    for o in objects(graph):
        spec = o.get("spec") or {}
        template = (spec.get("jobTemplate", {}).get("spec", {}) if o.get("kind") == "CronJob" else spec).get("template")
        if o.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "ReplicaSet") and template:
            found.append((o["metadata"].get("namespace", "default"), o["metadata"]["name"], template["spec"]))
        elif o.get("kind") == "Pod":
            found.append((o["metadata"].get("namespace", "default"), o["metadata"]["name"], spec))
    return found


def _kind(graph: Graph, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects(graph) if o.get("kind") == kind]


def _notset(value: Any) -> str:
    return "notset" if value is None else json.dumps(value)


def _container_lines(graph: Graph, key: Callable[[dict[str, Any]], Any], compliant: Callable[[Any], bool]) -> Audit:
    lines = []
    for namespace, name, spec in pods(graph):
        for container in spec.get("containers", []):
            value = key(container.get("securityContext") or {})
            lines.append(f"***pod_name: {name} container_name: {container['name']} pod_namespace: {namespace} "
                         f"value: {_notset(value)} is_compliant: {json.dumps(compliant(value))}")
    return Audit(command="\n".join(lines))


def _pod_lines(graph: Graph, key: str) -> Audit:
    # jsonpath prints nothing for an unset bool, and the apiserver stores a false one as unset
    # (omitempty): only true is non-compliant on a live cluster
    lines = [f"***pod_name: {name} pod_namespace: {namespace} is_compliant: {json.dumps(not spec.get(key))}"
             for namespace, name, spec in pods(graph)]
    return Audit(command="\n".join(lines))


def policy_audit(check: Check, graph: Graph) -> Answer:
    i = check.id
    if i == "5.1.1":
        lines = []
        for b in _kind(graph, "ClusterRoleBinding"):
            name, role = b["metadata"]["name"], b["roleRef"]["name"]
            compliant = not (name != "cluster-admin" and role == "cluster-admin")
            lines.append(f"**role_name: {name} role_binding: {role} is_compliant: {json.dumps(compliant)}")
        return Audit(command="\n".join(lines))
    if i == "5.1.3":
        lines = []
        for kind, prefix in (("Role", "role"), ("ClusterRole", "clusterrole")):
            for role in _kind(graph, kind):
                # `jq -c '.rules' | grep -q '\["\*"\]'`: a list of exactly "*" anywhere in the rules
                compliant = WILDCARD not in json.dumps(role.get("rules"), separators=(",", ":"))
                lines.append(f"**{prefix}_name: {role['metadata']['name']} {prefix}_is_compliant: "
                             f"{json.dumps(compliant)}")
        return Audit(command="\n".join(lines))
    if i == "5.1.5":
        namespaces = sorted({*BUILT_IN_NAMESPACES, *(n["metadata"]["name"] for n in _kind(graph, "Namespace"))})
        accounts = {(a["metadata"].get("namespace"), a["metadata"]["name"]): a for a in _kind(graph, "ServiceAccount")}
        lines = [f"namespace: {ns}, kind: ServiceAccount, name: default, automountServiceAccountToken: "
                 f"{_notset(accounts.get((ns, 'default'), {}).get('automountServiceAccountToken'))}"
                 for ns in namespaces]
        return Audit(command="\n".join(lines))
    if i == "5.1.6":
        accounts = {(a["metadata"].get("namespace"), a["metadata"]["name"]): a for a in _kind(graph, "ServiceAccount")}
        lines = []
        for namespace, name, spec in pods(graph):
            account = spec.get("serviceAccountName") or "default"
            sa = _notset(accounts.get((namespace, account), {}).get("automountServiceAccountToken"))
            pod = _notset(spec.get("automountServiceAccountToken"))
            ok = (sa == "false" and pod in ("false", "notset")) or (sa == "true" and pod == "false")
            lines.append(f"**namespace: {namespace} pod_name: {name} service_account: {account} "
                         f"pod_is_automountserviceaccounttoken: {pod} svacc: {sa} is_compliant: {json.dumps(ok)}")
        return Audit(command="\n".join(lines))
    if i == "5.2.2":
        return _container_lines(graph, lambda sc: sc.get("privileged"), lambda v: v in (None, False))
    if i in ("5.2.3", "5.2.4", "5.2.5"):
        return _pod_lines(graph, {"5.2.3": "hostPID", "5.2.4": "hostIPC", "5.2.5": "hostNetwork"}[i])
    if i == "5.2.6":
        return _container_lines(graph, lambda sc: sc.get("allowPrivilegeEscalation"), lambda v: v in (None, False))
    if i == "5.2.9":
        return _container_lines(graph, lambda sc: (sc.get("capabilities") or {}).get("add"), lambda v: not v)
    if i in ("5.1.2", "5.1.4"):
        return NotApplicable("`kubectl auth can-i ... --as=system:authenticated`: needs the live authorizer over "
                             "the built-in bootstrap bindings as well as kilonode's")
    return NotApplicable("needs a live cluster (the audit queries objects kilonode does not record)")
