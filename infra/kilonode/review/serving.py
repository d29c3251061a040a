"""What keeps the cluster serving while it changes, each a change that breaks nothing at `pulumi up` and only
shows later (independent trace 12b on research-7500 found "No risk found" for each):

- `lb-probe-not-readiness` (high): a probe of the apiserver load balancers moved off /readyz
  (kilonode.plan.defaults.network.LB_PROBE_PATH). kube-apiserver's --shutdown-delay-duration works only
  because "the endpoints /healthz and /livez will return success, but /readyz immediately returns failure"
  (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/server/options/server_run_options.go, the flag's help);
  /readyz alone also carries the `informer-sync` check and `etcd-readiness` (options/etcd.go addEtcdHealthEndpoint:
  AddReadyzChecks, with its own short --etcd-readycheck-timeout; /livez has only the slower `etcd` health check).
  On /livez or /healthz the load balancer keeps sending requests to a terminating apiserver, to one whose informers
  have not synced, and to one whose etcd answers too slowly to serve.
- `proxy-felix-mode-mismatch` (high): kube-proxy's mode (the kube-proxy ConfigMap's config `mode`; empty is
  iptables on Linux, kubernetes pkg/proxy/apis/config/types.go ProxyMode) and Calico Felix's FELIX_NFTABLESMODE
  (calico-node env) disagree at the head and did not at the base. Calico's nftables dataplane docs: "To use
  Calico in nftables mode, your cluster's kube-proxy must also be in nftables mode". Only an explicit Enabled or
  Disabled is judged: `Auto` follows kube-proxy's mode (Calico's FelixConfiguration reference, nftablesMode), and
  an unset variable means whatever default the running Calico release has.
- `daemonset-pacing-raised` (medium): a DaemonSet's rollingUpdate.maxUnavailable raised. A percentage is
  scaled against the nodes that should run the pod, rounded up (kubernetes pkg/controller/daemon/update.go
  updatedDesiredNodeCounts -> pkg/controller/daemon/util/daemonset_util.go UnavailableCount:
  intstrutil.GetScaledValueFromIntOrPercent(r.MaxUnavailable, numberToSchedule, true));
  absent is 1 (pkg/apis/apps/v1 defaults.go SetDefaults_DaemonSet). Nothing rolls at this change, but every later
  template change replaces that many pods at once, capped only by the controller's burst (BurstReplicas, 250 per
  sync, pkg/controller/daemon/daemon_controller.go BurstReplicas).
- `alert-threshold-weakened` (medium): a shipped alert whose expression compares against a number now fires
  later: a higher threshold on `>`/`>=`, a lower one on `<`/`<=`, or a longer `for:`. For the etcd quota alerts it
  says the headroom left at the plan's quotaBackendBytes: etcd refuses writes at the quota
  (etcd-io/etcd server/etcdserver/quota.go backendQuota.Available; the apply path answers ErrNoSpace,
  "etcdserver: mvcc: database space exceeded", and raises the NOSPACE alarm).
- `alert-page-lost` (high): a shipped alert that pages (`severity: critical`, docs/monitoring.md: "critical: page",
  the contract an operator's Alertmanager routes on) no longer does: its severity lowered, its label dropped, or the
  alert deleted (a rename, the same expression under another name at the same severity, is not a loss). A warning-only
  alert deleted is medium. promtool passes either; nothing else sees it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import promql_parser
import yaml

from kilonode.plan.defaults.network import LB_PROBE_PATH
from kilonode.review import alerting, placement
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import load_yaml, plan_of

LOAD_BALANCER = "azure-native:network:LoadBalancer"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
KUBE_PROXY = ("kube-system", "kube-proxy")
CALICO_NODE = ("kube-system", "calico-node")
FELIX_NFTABLES = "FELIX_NFTABLESMODE"


def assess(diff: StackDiff) -> list[Finding]:
    if diff.base is None or diff.head is None:
        return []
    return [*probes(diff), *proxy_modes(diff), *pacing(diff), *thresholds(diff), *pages_lost(diff)]


def _resources(entry: Mapping[str, Any] | None, kind: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for r in (entry or {}).get("resources", []):
        if r.get("type") == kind:
            yield str(r.get("name")), r.get("inputs") or {}


def _meta(inputs: Mapping[str, Any]) -> tuple[str, str]:
    meta = inputs.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


# lb-probe-not-readiness --------------------------------------------------------------------------------------------

def probes(diff: StackDiff) -> list[Finding]:
    base = {name: {str(p.get("name")): p for p in inputs.get("probes") or [] if isinstance(p, Mapping)}
            for name, inputs in _resources(diff.base, LOAD_BALANCER)}
    moved: list[tuple[str, str, str]] = []
    for name, inputs in _resources(diff.head, LOAD_BALANCER):
        for probe in inputs.get("probes") or []:
            if not isinstance(probe, Mapping):
                continue
            was = base.get(name, {}).get(str(probe.get("name")))
            if was is None or was.get("requestPath") != LB_PROBE_PATH:
                continue
            now = probe.get("requestPath")
            if now != LB_PROBE_PATH:
                moved.append((name, str(probe.get("name")),
                              f"`{now}`" if now else f"a {probe.get('protocol') or 'Tcp'} probe with no path"))
    if not moved:
        return []
    where = "; ".join(f"{lb} probe {probe}: `{LB_PROBE_PATH}` -> {now}" for lb, probe, now in moved)
    return [Finding(HIGH, "lb-probe-not-readiness", (
        f"the apiserver load balancers' health probe moves off {LB_PROBE_PATH} ({where}). kube-apiserver's "
        f"--shutdown-delay-duration drains an apiserver only because {LB_PROBE_PATH} fails at once on shutdown while "
        "/livez and /healthz still succeed (kubernetes apiserver server_run_options.go, the flag's help), and only "
        f"{LB_PROBE_PATH} checks informer-sync and etcd-readiness (apiserver options/etcd.go): on the new path the "
        "load balancer keeps sending requests to a terminating apiserver (every restart and roll drops in-flight "
        "requests and watches), to one whose informers have not synced, and to one whose etcd is too slow to "
        "serve. Keep the probe on "
        f"{LB_PROBE_PATH} (kilonode.plan.defaults.network.LB_PROBE_PATH)"), tuple(sorted({lb for lb, _, _ in moved})))]


# proxy-felix-mode-mismatch -----------------------------------------------------------------------------------------

def _proxy_mode(entry: Mapping[str, Any] | None) -> str | None:
    """kube-proxy's mode from its ConfigMap ('iptables' where empty, the Linux default); None without one."""
    for _, inputs in _resources(entry, alerting.CONFIG_MAP):
        if _meta(inputs) != KUBE_PROXY:
            continue
        for text in (inputs.get("data") or {}).values():
            try:
                config = load_yaml(text) if isinstance(text, str) else None
            except yaml.YAMLError:
                continue
            if isinstance(config, Mapping) and config.get("kind") == "KubeProxyConfiguration":
                return str(config.get("mode") or "iptables").lower()
    return None


def _felix_nftables(entry: Mapping[str, Any] | None) -> str | None:
    """calico-node's FELIX_NFTABLESMODE, lower case; None without calico-node or where unset (not judged)."""
    for _, inputs in _resources(entry, DAEMONSET):
        if _meta(inputs) != CALICO_NODE:
            continue
        spec = ((inputs.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in spec.get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == FELIX_NFTABLES:
                    return str(env["value"]).lower() if env.get("value") else None
    return None


def _agree(proxy: str | None, felix: str | None) -> bool:
    if proxy is None or felix not in ("enabled", "disabled"):
        return True
    return (proxy == "nftables") == (felix == "enabled")


def proxy_modes(diff: StackDiff) -> list[Finding]:
    proxy, felix = _proxy_mode(diff.head), _felix_nftables(diff.head)
    if _agree(proxy, felix) or not _agree(_proxy_mode(diff.base), _felix_nftables(diff.base)):
        return []
    was_proxy, was_felix = _proxy_mode(diff.base), _felix_nftables(diff.base)
    moved = [f"kube-proxy mode {was_proxy} -> {proxy}" if was_proxy != proxy else f"kube-proxy mode {proxy}",
             f"Felix {FELIX_NFTABLES} {was_felix} -> {felix}" if was_felix != felix
             else f"Felix {FELIX_NFTABLES} {felix}"]
    return [Finding(HIGH, "proxy-felix-mode-mismatch", (
        f"kube-proxy and Calico's Felix disagree on the dataplane ({'; '.join(moved)}). Calico's nftables dataplane "
        "docs: to use Calico in nftables mode, kube-proxy must also be in nftables mode (and Felix in iptables "
        "mode expects kube-proxy's iptables rules); on every node where both pods restart with the new settings, "
        "Service and policy rules sit in two dataplanes Calico does not support together. Change kube-proxy's mode "
        "and FELIX_NFTABLESMODE in one change, or neither (or set FELIX_NFTABLESMODE=Auto, which follows "
        "kube-proxy)"), ("ConfigMap kube-system/kube-proxy", "DaemonSet kube-system/calico-node"))]


# daemonset-pacing-raised -------------------------------------------------------------------------------------------

def _max_unavailable(inputs: Mapping[str, Any]) -> Any:
    strategy = (inputs.get("spec") or {}).get("updateStrategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable")
    return 1 if value is None else value


def per_step(value: Any, nodes: int) -> int | None:
    """The pods a roll replaces at once on `nodes` nodes: a percentage rounded up, as the DaemonSet controller
    does (daemon/util UnavailableCount, roundUp true); a number as it is; None where unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(value, nodes) if nodes else value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = int(text[:-1])
        except ValueError:
            return None
        return -(-percent * nodes // 100)
    try:
        return min(int(text), nodes) if nodes else int(text)
    except ValueError:
        return None


def pacing(diff: StackDiff) -> list[Finding]:
    base = {_meta(inputs): _max_unavailable(inputs) for _, inputs in _resources(diff.base, DAEMONSET)}
    found = []
    for _, inputs in _resources(diff.head, DAEMONSET):
        key = _meta(inputs)
        was, now = base.get(key), _max_unavailable(inputs)
        if was is None or now is None or str(was) == str(now):
            continue
        pools = placement.daemonset_nodes(diff, *key) or {}
        nodes = sum(pools.values())
        # without a node count, a percentage is compared as of 100 nodes
        before, after = per_step(was, nodes or 100), per_step(now, nodes or 100)
        if before is None or after is None or after <= before:
            continue
        on = (f"on {nodes:,} nodes ({', '.join(f'{role} {count:,}' for role, count in pools.items())})" if nodes
              else "on nodes the review could not count")
        steps = f"{before:,} -> {after:,} nodes per step" if nodes else f"{was} -> {now} per step"
        every = " (every node at once)" if nodes and after >= nodes else ""
        found.append(Finding(MEDIUM, "daemonset-pacing-raised", (
            f"DaemonSet {key[0]}/{key[1]} rollingUpdate.maxUnavailable {was} -> {now}: {on}, {steps}{every}. "
            "Nothing rolls at this change, but every later change to its pod template replaces that many pods "
            "at once, capped only by the controller's burst of 250 creations a sync (kubernetes "
            "pkg/controller/daemon); a bad image or config then reaches those nodes before any is seen to fail. "
            f"Keep {was}, or raise it in the change that needs the faster roll and lower it after"),
            (f"DaemonSet {key[0]}/{key[1]}",)))
    return found


# alert-threshold-weakened ------------------------------------------------------------------------------------------

_LATER = {">": 1, ">=": 1, "<": -1, "<=": -1}
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _parse(expr: str) -> Any:
    """promql_parser's tree, on a thread with the alerting module's stack (alerting.MAX_EXPR_CHARS says why);
    None where not read."""
    if len(expr) > alerting.MAX_EXPR_CHARS:
        return None
    out: list[Any] = []

    def work() -> None:
        try:
            out.append(promql_parser.parse(expr))
        except BaseException:  # a Rust panic arrives as PanicException, a BaseException
            out.append(None)

    alerting.on_parse_thread(work, "kilonode-promql-threshold")
    return out[0] if out else None


def comparison(expr: str) -> tuple[str, float] | None:
    """(op, threshold) of an expression that is `<series> op <number>` at its top (or `<number> op <series>`,
    turned round); None otherwise."""
    tree = _parse(expr)
    while isinstance(tree, promql_parser.ParenExpr):
        tree = tree.expr
    if not isinstance(tree, promql_parser.BinaryExpr):
        return None
    op = str(tree.op).strip()
    if op not in _LATER:
        return None
    if isinstance(tree.rhs, promql_parser.NumberLiteral) and not isinstance(tree.lhs, promql_parser.NumberLiteral):
        return op, float(tree.rhs.val)
    if isinstance(tree.lhs, promql_parser.NumberLiteral) and not isinstance(tree.rhs, promql_parser.NumberLiteral):
        return _FLIP[op], float(tree.lhs.val)
    return None


def _alerts(entry: Mapping[str, Any] | None) -> dict[tuple[str, str, str, int], Mapping[str, Any]]:
    """(rule file, alert, severity, nth of that pair) -> the rule, from alerting.rule_files."""
    found: dict[tuple[str, str, str, int], Mapping[str, Any]] = {}
    for where, text in alerting.rule_files(entry).items():
        try:
            document = load_yaml(text)
        except yaml.YAMLError:
            continue
        groups = document.get("groups") if isinstance(document, Mapping) else None
        for group in groups if isinstance(groups, list) else []:
            for rule in (group or {}).get("rules") or [] if isinstance(group, Mapping) else []:
                if not isinstance(rule, Mapping) or not rule.get("alert") or not isinstance(rule.get("expr"), str):
                    continue
                severity = str((rule.get("labels") or {}).get("severity") or "")
                nth = sum(1 for k in found if k[:3] == (where, str(rule["alert"]), severity))
                found[(where, str(rule["alert"]), severity, nth)] = rule
    return found


def _number(value: float) -> str:
    return f"{value:g}"


def _gib(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def _headroom(expr: str, threshold: float, plan: Mapping[str, Any]) -> str:
    if "quota" not in expr.lower() or "etcd" not in expr.lower() or not 0 < threshold < 1:
        return ""
    said = []
    for key, label in (("etcdMain", "main"), ("etcdEvents", "events")):
        quota = (plan.get(key) or {}).get("quotaBackendBytes") if isinstance(plan.get(key), Mapping) else None
        if isinstance(quota, int) and quota > 0:
            said.append(f"{label} {_gib((1 - threshold) * quota)} of {_gib(quota)}")
    if not said:
        return ""
    return (f"; it fires with {', '.join(said)} left before etcd refuses every write at quotaBackendBytes "
            "(etcd server/etcdserver/quota.go: ErrNoSpace, NOSPACE alarm)")


def thresholds(diff: StackDiff) -> list[Finding]:
    base, head = _alerts(diff.base), _alerts(diff.head)
    plan = plan_of(diff.head)
    found = []
    for key, rule in head.items():
        was = base.get(key)
        if was is None:
            continue
        said = []
        before, after = comparison(str(was["expr"])), comparison(str(rule["expr"]))
        if before and after and before[0] == after[0] and (after[1] - before[1]) * _LATER[after[0]] > 0:
            said.append(f"`{after[0]} {_number(before[1])}` -> `{after[0]} {_number(after[1])}`"
                        + _headroom(str(rule["expr"]), after[1], plan))
        if after:
            old, new = alerting.seconds(was.get("for") or "0s"), alerting.seconds(rule.get("for") or "0s")
            if old is not None and new is not None and new > old:
                said.append(f"for: {was.get('for') or '0s'} -> {rule.get('for')}")
        if said:
            _, alert, severity, _ = key
            found.append((alert, severity, "; ".join(said)))
    if not found:
        return []
    names = sorted({alert for alert, _, _ in found})
    lines = "; ".join(f"{alert} ({severity or 'no severity'}): {what}" for alert, severity, what in found)
    return [Finding(MEDIUM, "alert-threshold-weakened", (
        f"{len(found)} alerting rule(s) kilonode ships now fire later: {lines}. promtool passes it and nothing "
        "warns, but the on-call learns of the condition later, with less room to act. Keep the shipped thresholds "
        "(docs/monitoring.md gives their reasons), or lower the condition itself (raise quotaBackendBytes, not the "
        "alert)"), tuple(names))]


# alert-page-lost ---------------------------------------------------------------------------------------------------

PAGE = "critical"


def _by_name(entry: Mapping[str, Any] | None) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """(rule file, alert) -> its rules (an alert may have a warning and a critical rule under one name)."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for (where, alert, _, _), rule in _alerts(entry).items():
        found.setdefault((where, alert), []).append(rule)
    return found


def _severities(rules: list[Mapping[str, Any]]) -> list[str]:
    return sorted(str((r.get("labels") or {}).get("severity") or "") for r in rules)


def pages_lost(diff: StackDiff) -> list[Finding]:
    """Shipped alerts that paged at the base and page less at the head, and warning alerts deleted (renames aside)."""
    base, head = _by_name(diff.base), _by_name(diff.head)
    head_exprs = {(where, str(r["expr"]).strip(), sev) for (where, _), rules in head.items() for r in rules
                  for sev in [str((r.get("labels") or {}).get("severity") or "")]}
    lost, deleted = [], []
    for key, rules in sorted(base.items()):
        was = _severities(rules)
        now = _severities(head.get(key, []))
        where, alert = key
        if not now:
            gone = [r for r in rules if (where, str(r["expr"]).strip(), str((r.get("labels") or {}).get("severity")
                                                                           or "")) not in head_exprs]
            if not gone:
                continue  # renamed: the same expressions at the same severities under another name
            if PAGE in _severities(gone):
                lost.append((alert, f"{alert}: deleted (it paged: {', '.join(was)})"))
            else:
                deleted.append(alert)
            continue
        if was.count(PAGE) > now.count(PAGE):
            lost.append((alert, f"{alert}: severity {', '.join(was)} -> {', '.join(s or '(none)' for s in now)}"))
    found = []
    if lost:
        found.append(Finding(HIGH, "alert-page-lost", (
            f"{len(lost)} alert(s) kilonode ships no longer page: {'; '.join(w for _, w in lost)}. `critical` is the "
            "label that pages (docs/monitoring.md: every alert carries severity, `critical`: page; an Alertmanager "
            "routes on it), so when the condition comes nobody is woken: it waits for someone to look at a "
            "dashboard. promtool passes it and nothing else warns. Keep `critical` on these (the runbook sections "
            "of docs/monitoring.md say why each pages); to quieten a noisy alert, fix its threshold or `for:` in "
            "the same review, said as such"), tuple(a for a, _ in lost)))
    if deleted:
        found.append(Finding(MEDIUM, "alert-deleted", (
            f"{len(deleted)} warning alert(s) kilonode ships are deleted: {', '.join(deleted)}. Nothing tells the "
            "on-call of their conditions any more (docs/monitoring.md gives each one's reason); keep them, or say "
            "in the change what replaces them"), tuple(deleted)))
    return found
