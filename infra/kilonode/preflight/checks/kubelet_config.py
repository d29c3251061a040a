"""kubelet-config: each pool's rendered KubeletConfiguration passes the kubelet's own validation.

The kubelet loads the file --config names, defaults it and validates it before it does anything
else (kubernetes cmd/kubelet/app/server.go NewKubeletCommand: "failed to validate kubelet
configuration"; pkg/kubelet/apis/config/validation/validation.go ValidateKubeletConfiguration). A
field out of its range is no warning: the kubelet exits, systemd restarts it into the same error,
and the node never registers. The render is the same for every node of a pool, so a new node, a
scale-out and every reimaged or replaced instance of the pool comes up without a kubelet, while the
pool's running nodes keep the kubelet they started with until their next restart.

Read from each host role's rendered etc/kubernetes/kubelet-config.yaml (kilonode.render), against
the catalogue (kilonode.catalog kubelet_validation.yaml: the rules a stack could break, each with
the kubelet's own message and upstream source, and the defaults a cross-field rule reads). The
rules judge the defaulted configuration, as the kubelet does: a field left out takes its default
(pkg/kubelet/apis/config/v1beta1/defaults.go), and a zero the defaulting replaces is not judged.
Among them: containerLogMaxFiles > 1 (a single file cannot rotate), containerLogMaxSize a
resource quantity, eventRecordQPS, kubeAPIQPS, registryPullQPS and the bursts not negative, the
image GC thresholds within 0-100 and low < high, maxPods and podsPerCore not negative,
maxParallelImagePulls >= 1 and > 1 only with serializeImagePulls false, the ports, the iptables
bits, oomScoreAdj, the topology manager's policy and scope, hairpinMode, cpuCFSQuotaPeriod within
1ms-1s, memoryThrottlingFactor within (0, 1], shutdownGracePeriodCriticalPods <= shutdownGracePeriod.

One rule is the kubelet's start rather than its validation, with the same end: cpuManagerPolicy
static needs a CPU reservation (kubeReserved.cpu, systemReserved.cpu or reservedSystemCPUs), or the
CPU manager's NewManager refuses ("the static policy requires systemreserved.cpu + kubereserved.cpu
to be greater than zero", kubernetes pkg/kubelet/cm/cpumanager/cpu_manager.go, read at 01a546fe) and
the kubelet exits; kilonode's configuration reserves nothing.

A violation is a break: the kubelet refuses its configuration and exits, so no node of the pool
starts. A file that is not YAML, or not a KubeletConfiguration, is one too.

Two rules read the plan beside the file, for a GPU pool (gpusPerNode > 0), and are breaks of the
pool's jobs rather than of its kubelet:
- topologyManagerPolicy single-numa-node admits a pod only where one NUMA node holds all it asks
  (pkg/kubelet/cm/topologymanager/policy_single_numa_node.go filterSingleNumaHints keeps single-node
  hints only; the pod is refused admission with TopologyAffinityError, kubernetes.io "Control
  Topology Management Policies on a node"). A pod asking all the node's GPUs spans every NUMA node
  that holds one: the catalogue's numaNodes (Azure's topology file per NCCL family: ndv4 4 NUMA
  nodes of 2 GPUs, ndv5 2 of 4). On a pool kilonode's NCCL job can run on (kilonode.k8s.nccl_job
  gpu_pool: InfiniBand, an NCCL topology; each of its pods asks all gpusPerNode GPUs) that is a
  break: the gang never starts. On another GPU pool it is a warn (its own jobs may ask fewer), as
  is a family whose NUMA nodes the catalogue does not record. `restricted` is not judged: it admits
  the smallest NUMA set that can hold the request (pkg/kubelet/cm/devicemanager/topology_hints.go
  generateDeviceTopologyHints marks the hints of minAffinitySize preferred, read at 03b718f0), which
  for all GPUs is every NUMA node, a preferred hint.
- podPidsLimit below the plan's own estimate of a training pod's tasks, gpusPerNode x
  kilonode.plan.defaults TRAINING_RANK_TASKS (the pids cgroup counts threads): the jobs' pods
  cannot start their processes on the pool's new nodes (fork() and clone() fail with EAGAIN).

The catalogue's source is the search index's copy of validation.go, newer than the pinned 1.34.2: a
Kubernetes version other than the catalogue's is said in the finding.

Seeded breaks (tests/preflight/test_kubelet_config.py): containerLogMaxFiles 1; the image GC low
threshold above the high one; maxParallelImagePulls 10 with serializeImagePulls true;
cpuManagerPolicy static with nothing reserved; single-numa-node on the NCCL job's 8-GPU pools;
podPidsLimit 1024.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.catalog.kubelet_validation import KubeletRule, catalogue
from kilonode.plan import defaults
from kilonode.plan.model import NodePoolPlan
from kilonode.preflight.model import Finding, Inputs
from kilonode.yamlio import load_yaml

NAME = "kubelet-config"
TITLE = "every pool's rendered KubeletConfiguration passes the kubelet's own validation"

CONFIG = "etc/kubernetes/kubelet-config.yaml"
KIND = ("kubelet.config.k8s.io/v1beta1", "KubeletConfiguration")
REFUSED = "the kubelet refuses its configuration and exits: no node of the pool starts"
# A Go time.Duration string (time.ParseDuration: a sequence of decimal numbers with units)
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# k8s.io/apimachinery/pkg/api/resource quantity.go: a signed decimal with a binary or decimal
# suffix, or an exponent
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?")


def seconds(text: Any) -> float | None:
    """A Go duration in seconds ("1m30s", "-2s", "0"), None where it does not parse."""
    value = str(text).strip()
    sign = -1.0 if value.startswith("-") else 1.0
    value = value.lstrip("+-")
    if value == "0":
        return 0.0
    parts = _DURATION_PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def _number(rule: KubeletRule, value: Any) -> float | None:
    if rule.duration:
        return seconds(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _defaulted(config: Mapping[str, Any], field: str) -> Any:
    return config[field] if field in config else catalogue().defaults.get(field)


def _at(config: Mapping[str, Any], path: str) -> Any:
    value: Any = config
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _set(value: Any) -> bool:
    """A reservation that counts: a quantity above zero, or a non-empty cpuset string."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float)):
        return value > 0
    text = str(value).strip()
    match = _QUANTITY.fullmatch(text)
    if match:
        return float(match.group(1)) > 0 and not text.startswith("-")
    return bool(text)


def broken(rule: KubeletRule, config: Mapping[str, Any]) -> str | None:
    """Why the configuration breaks the rule (None: it does not, or the field is left to its default)."""
    if rule.kind in ("lessThanField", "notWith"):
        return _pair(rule, config)
    if rule.kind == "requiresAny":
        if config.get(rule.field) not in rule.values or any(_set(_at(config, o)) for o in rule.others):
            return None
        return f"{rule.field} {config[rule.field]} with no {' or '.join(rule.others)}"
    if rule.field not in config:
        return None
    value = config[rule.field]
    if rule.kind == "oneOf":
        return None if value in rule.values else f"{rule.field} {value!r}"
    if rule.kind == "quantity":
        return None if isinstance(value, str) and _QUANTITY.fullmatch(value) else f"{rule.field} {value!r}"
    if rule.kind == "absolutePath":
        text = str(value)
        clean = text.startswith("/") and "//" not in text and not re.search(r"(^|/)\.\.?(/|$)", text)
        return None if clean and (text == "/" or not text.endswith("/")) else f"{rule.field} {value!r}"
    number = _number(rule, value)
    if number is None:
        return f"{rule.field} {value!r} (not a {'duration' if rule.duration else 'number'})"
    if rule.zero_defaults and number == 0:
        return None
    low = rule.bound if rule.kind in ("atLeast", "greaterThan") else rule.min
    high = rule.max if rule.kind == "range" else None
    if rule.kind == "greaterThan" and low is not None and number <= low:
        return f"{rule.field} {value}"
    if (low is not None and number < low) or (high is not None and number > high):
        return f"{rule.field} {value}"
    return None


def _pair(rule: KubeletRule, config: Mapping[str, Any]) -> str | None:
    other = rule.other or ""
    if rule.field not in config and other not in config:
        return None  # both defaulted: upstream's defaults pass
    mine, theirs = _defaulted(config, rule.field), _defaulted(config, other)
    if rule.kind == "notWith":
        # serializeImagePulls left out is defaulted from maxParallelImagePulls (defaults.go: true only
        # below 2), so only an explicit true beside a larger limit is refused
        limit = config.get(other)
        many = isinstance(limit, int) and not isinstance(limit, bool) and limit > (rule.bound or 0)
        return f"{rule.field} {mine} with {other} {theirs}" if config.get(rule.field) is True and many else None
    a, b = _number(rule, mine), _number(rule, theirs)
    if a is None or b is None:
        return None  # a value that does not parse is the single-field rules' to say
    if a < b or (rule.or_equal and a == b):
        return None
    return f"{rule.field} {mine} with {other} {theirs}"


def _load(text: str) -> tuple[Mapping[str, Any] | None, str | None]:
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError as error:
        return None, f"does not parse as YAML ({str(error).splitlines()[0]})"
    if not isinstance(loaded, Mapping) or (loaded.get("apiVersion"), loaded.get("kind")) != KIND:
        return None, f"is not a {KIND[1]} ({KIND[0]})"
    return loaded, None


def _pool(inputs: Inputs, host: str) -> NodePoolPlan | None:
    for pool in inputs.plan.node_pools:
        if host in (pool.role(team) for team in (None, *pool.teams)):
            return pool
    return None


def _nccl_pool(pool: NodePoolPlan) -> bool:
    """kilonode's NCCL job can run here (kilonode.k8s.nccl_job gpu_pool's test): each of its pods
    asks every GPU of its node (nccl_job.requests)."""
    return bool(pool.gpus_per_node and pool.infiniband and pool.nccl_topology)


def numa(host: str, pool: NodePoolPlan, config: Mapping[str, Any]) -> Finding | None:
    """single-numa-node on a GPU pool whose pods ask all its GPUs (module docstring)."""
    if not pool.gpus_per_node or config.get("topologyManagerPolicy") != "single-numa-node":
        return None
    gpus = pool.gpus_per_node
    nodes = catalogue().numa_nodes.get(pool.nccl_topology or "")
    if nodes is not None and nodes.gpus_each >= gpus:
        return None
    layout = (f"{pool.vm_size} has {nodes.count} NUMA nodes of {nodes.gpus_each} GPUs ({nodes.source})"
              if nodes else f"the catalogue records no NUMA nodes for {pool.vm_size} (NCCL family "
              f"{pool.nccl_topology or 'none'})")
    rejected = ("the kubelet refuses admission to a pod asking more GPUs than one NUMA node holds "
                "(TopologyAffinityError; pkg/kubelet/cm/topologymanager/policy_single_numa_node.go)")
    fix = ("leave topologyManagerPolicy at none or best-effort on GPU pools whose pods take every GPU "
           "(restricted admits the smallest NUMA set that holds them)")
    if nodes is not None and _nccl_pool(pool):
        return Finding(NAME, "break", f"{host}/{CONFIG}", (
            f"topologyManagerPolicy single-numa-node on {host}: {rejected}; {layout}, and kilonode's NCCL job "
            f"(kilonode.k8s.nccl_job) asks all {gpus} GPUs of each node: its pods are rejected at admission on "
            "every node of the pool and the gang never starts"), fix)
    return Finding(NAME, "warn", f"{host}/{CONFIG}", (
        f"topologyManagerPolicy single-numa-node on {host}: {rejected}; {layout}: a pod asking all {gpus} "
        "GPUs of a node is rejected at admission"), fix)


def pids(host: str, pool: NodePoolPlan, config: Mapping[str, Any]) -> Finding | None:
    """podPidsLimit below the plan's own estimate of a GPU pool's training pod (module docstring)."""
    limit = config.get("podPidsLimit")
    if not pool.gpus_per_node or isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        return None  # unset, or -1/0: no limit (kubelet defaults.go: -1)
    needed = pool.gpus_per_node * defaults.TRAINING_RANK_TASKS
    if limit >= needed:
        return None
    return Finding(NAME, "break", f"{host}/{CONFIG}", (
        f"podPidsLimit {limit} on {host}: a training pod of {pool.gpus_per_node} ranks runs about {needed:,} tasks "
        f"(kilonode.plan.defaults TRAINING_RANK_TASKS {defaults.TRAINING_RANK_TASKS} per rank; the pids cgroup "
        "counts threads): the jobs' pods cannot start their processes on the pool's new nodes (fork() and "
        "clone() fail with EAGAIN)"),
        f"keep podPidsLimit at least {needed:,} (kilonode.plan.defaults POD_PIDS_LIMIT {defaults.POD_PIDS_LIMIT:,})")


def check(inputs: Inputs) -> list[Finding]:
    known = catalogue()
    version = inputs.plan.kubernetes_version
    elsewhere = ("" if not version or version == known.kubernetes_version else
                 f" (rules read for Kubernetes {known.kubernetes_version}; this stack runs {version})")
    findings = []
    for host in inputs.hosts():
        text = inputs.host_files(host).get(CONFIG)
        if text is None:
            continue
        subject = f"{host}/{CONFIG}"
        config, wrong = _load(text)
        if config is None:
            findings.append(Finding(NAME, "break", subject, f"the rendered kubelet configuration {wrong}: {REFUSED}",
                                    "render a kubelet.config.k8s.io/v1beta1 KubeletConfiguration"))
            continue
        refused = [(rule, what) for rule in known.rules if (what := broken(rule, config))]
        said = [f"{what}: \"{rule.message}\"" for rule, what in refused]
        if said:
            validation = all(r.stage == "validation" for r, _ in refused)
            how = ("the kubelet's validation (ValidateKubeletConfiguration)" if validation
                   else "the kubelet (its validation, ValidateKubeletConfiguration, or its start)")
            findings.append(Finding(NAME, "break", subject, (
                f"{how} refuses {host}'s configuration: "
                f"{'; '.join(said)}{elsewhere}: {REFUSED}, and each new, scaled-out, reimaged or replaced "
                "instance never registers (the running nodes keep their kubelet until it restarts)"),
                "set the field back within the kubelet's bounds (kilonode.catalog kubelet_validation.yaml gives "
                "each rule and its source)"))
        pool = _pool(inputs, host)
        if pool is not None:
            findings += [f for f in (numa(host, pool, config), pids(host, pool, config)) if f is not None]
    return findings
