"""controller-clients: the control plane's clients keep up with the nodes joining.

Every joining node gets a pod of each DaemonSet that runs on its pool; kube-controller-manager's DaemonSet
controller creates it (a POST at its client's rate: --kube-api-qps, per controller with
--use-service-account-credentials) and kube-scheduler binds it (a binding POST at its clientConnection.qps).
Until they run, a node is Ready but has no kube-proxy, no NetworkPolicy engine, no device plugin (its GPUs are
not offered) and no exporter. The upstream defaults (20 and 50 a second, catalogue limits.yaml kubernetes.*Qps
with their sources, as the plan carries them) are far below a 7,500-node bring-up's fan-out.

Read, not restated from the plan's own sizing: each apiserver host's rendered kube-controller-manager unit
(ExecStart's --kube-api-qps, upstream's default where absent) and kube-scheduler configuration file
(clientConnection.qps), the DaemonSets of the recorded graph that run on each pool's nodes (the scheduling
check's placement: kilonode.preflight.checks.scheduling daemonsets_on), and the rate the plan admits joins at
(JoinPlan.sized_for_per_min, the apiservers' sizing). A client slower than nodes/s x the most DaemonSet pods a
node takes warns, with the minutes it takes to fill the cluster against the joins' own.

Seeded break (tests/preflight/test_controller_clients.py): research-7500's --kube-api-qps set back to upstream's 20
and the scheduler's qps to 25.
"""

from __future__ import annotations

import math

from kilonode.preflight.checks.scheduling import daemonsets_on
from kilonode.preflight.model import Finding, Inputs
from kilonode.preflight.nodes import bootstrap_nodes, flags_of, unit_exec_args
from kilonode.yamlio import load_yaml

NAME = "controller-clients"
TITLE = "kube-controller-manager and kube-scheduler create and bind DaemonSet pods as fast as nodes join"
CONTROLLER_MANAGER_UNIT = "etc/systemd/system/kube-controller-manager.service"
SCHEDULER_CONFIG = "etc/kubernetes/kube-scheduler-config.yaml"
FIX = ("kilonode sizes both from the joins (kilonode.plan.resolve.clients; `kilonode explain`, \"the control "
       "plane's clients\"): render the control plane again from the plan, or raise --kube-api-qps / "
       "clientConnection.qps to the rate named")


def _rate(text: str | None, default: float) -> float:
    try:
        return float(text) if text is not None else default
    except ValueError:
        return default  # not a number: component-flags breaks on it


def check(inputs: Inputs) -> list[Finding]:
    groups = bootstrap_nodes(inputs)
    daemonsets = [w for w in inputs.workloads() if w.kind == "DaemonSet"]
    per_node = max((len(daemonsets_on(g, daemonsets)) for g in groups), default=0)
    nodes = sum(p.autoscaling.max_nodes if p.autoscaling else p.nodes for p in inputs.plan.node_pools)
    joins_per_s = inputs.plan.components.joins.sized_for_per_min / 60
    need = joins_per_s * per_node
    if not need:
        return []
    slow: dict[tuple[str, str, float], list[str]] = {}
    for host, programs in _clients(inputs).items():
        for (who, what), qps in programs.items():
            if qps < need:
                slow.setdefault((who, what, qps), []).append(host)
    pods = nodes * per_node
    return [Finding(NAME, "warn", f"{who} on {', '.join(hosts)}", (
        f"{what} is {qps:g}/s, under the {need:.1f} DaemonSet pods/s the joins bring ({per_node} a node at "
        f"the {inputs.plan.components.joins.sized_for_per_min} nodes/min the apiservers admit): the cluster's "
        f"{pods:,} DaemonSet pods take {math.ceil(pods / qps / 60)} min to start, where the nodes join in "
        f"{math.ceil(nodes / max(joins_per_s, 1e-9) / 60)}; until theirs run, Ready nodes have no kube-proxy, "
        "no NetworkPolicy engine, no device plugin (no GPUs offered) and no exporters"), FIX)
        for (who, what, qps), hosts in sorted(slow.items())]


def _clients(inputs: Inputs) -> dict[str, dict[tuple[str, str], float]]:
    """apiserver host -> (program, what) -> its client's QPS as rendered (upstream's default where unset)."""
    clients = inputs.plan.controller_clients
    found = {}
    for host in inputs.hosts():
        files = inputs.host_files(host)
        if CONTROLLER_MANAGER_UNIT not in files:
            continue
        kcm = _rate(flags_of(unit_exec_args(files[CONTROLLER_MANAGER_UNIT])).get("kube-api-qps"),
                    float(clients.controller_manager_qps_default))
        config = load_yaml(files.get(SCHEDULER_CONFIG, "")) or {}
        connection = (config.get("clientConnection") or {}) if isinstance(config, dict) else {}
        scheduler = _rate(None if connection.get("qps") is None else str(connection.get("qps")),
                          float(clients.scheduler_qps_default))
        found[host] = {("kube-controller-manager", "--kube-api-qps (its DaemonSet controller creates the pods)"): kcm,
                       ("kube-scheduler", "clientConnection.qps (it binds them)"): scheduler}
    return found
