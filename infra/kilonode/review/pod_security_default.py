"""The apiservers' Pod Security defaults changed (independent trace 10a of `kilonode diff` on
research-7500: the default enforce level `baseline -> restricted` in kilonode.plan.defaults
POD_SECURITY_DEFAULT_ENFORCE was reported only as `apiservers-all`, the roll).

Where it lives: kilonode.render.control_plane renders the PodSecurity plugin's
PodSecurityConfiguration into each apiserver's etc/kubernetes/admission-config.yaml
(`defaults`: enforce, audit, warn and their -version; `exemptions.namespaces`); each side's snapshot
carries those files.

What the default does (kubernetes staging/src/k8s.io/pod-security-admission/admission/admission.go,
as kilonode.preflight.checks.pod_security reads it): every namespace without its own
`pod-security.kubernetes.io/enforce` label is held to the default enforce level, and a pod that
breaks it is refused at creation ("violates PodSecurity"); a pod already running stays until it is
replaced. The namespaces the graph creates or patches carry their own labels
(kilonode.plan.defaults POD_SECURITY_NAMESPACES); every other one takes the default: `default`,
Kubernetes' own kube-public and kube-node-lease, and every namespace users create without a label,
which the stack cannot see. Under `restricted` (kubernetes/website content/en/docs/concepts/security/
pod-security-standards.md; pod-security-admission policy/check_*.go) every container needs
runAsNonRoot true, a seccompProfile RuntimeDefault or Localhost, capabilities dropping ALL (adding
none but NET_BIND_SERVICE), allowPrivilegeEscalation false, and only the restricted volume types:
most training images (CUDA, PyTorch) run as root with no seccomp profile, and kilonode's own NCCL
job (kilonode.k8s.nccl_job, run in `default`) sets none of it.

- `pod-security-default-tightened` (high): the default enforce level stricter at the head. Said with
  the namespaces it reaches, what a pod must then have, the graph's own workloads there it refuses
  and kilonode's NCCL job template (built from the head's plan and judged with the preflight
  `pod-security` evaluator, kilonode.preflight.checks.pod_security.violations), and the fix.
- `pod-security-default-loosened` (medium, security): the default enforce level less strict:
  pods every unlabelled namespace refused before are admitted (baseline -> privileged: privileged
  containers, host namespaces and hostPath, i.e. root on the node).
- `pod-security-default-changed` (medium): the audit or warn level, a -version, or the exempt
  namespaces changed: said with what each does (audit: the audit log's annotations; warn: kubectl
  warnings; enforce-version: which release's rules enforce; an exemption: no check at all).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from kilonode.k8s import nccl_job
from kilonode.preflight.checks.pod_security import ADMISSION_CONFIG, ENFORCE_LABEL, LEVELS, violations
from kilonode.preflight.placement import pod_spec_of
from kilonode.review import sides
from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.yamlio import load_yaml

TIGHTENED = "pod-security-default-tightened"
LOOSENED = "pod-security-default-loosened"
CHANGED = "pod-security-default-changed"
MODES = ("enforce", "enforce-version", "audit", "audit-version", "warn", "warn-version")
# Namespaces every cluster has that the stack neither creates nor labels (kube-apiserver's
# system namespaces: kubernetes pkg/controlplane/controller/systemnamespaces, and `default`)
BUILT_IN = ("default", "kube-public", "kube-node-lease")
MEANING = {
    "audit": "the level the audit log annotates violations against (nothing refused)",
    "warn": "the level kubectl warns about on each create or update (nothing refused)",
    "enforce-version": "which release's rules the enforce level means",
    "audit-version": "which release's rules the audit level means",
    "warn-version": "which release's rules the warn level means",
    "exemptions": "namespaces PodSecurity does not check at all",
}
RESTRICTED_NEEDS = ("runAsNonRoot true (and no runAsUser 0), a seccompProfile RuntimeDefault or Localhost, "
                    "capabilities dropping ALL (adding none but NET_BIND_SERVICE), allowPrivilegeEscalation false, "
                    "and only configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected or "
                    "secret volumes, on every container and init container")
BASELINE_NEEDS = ("no privileged container, no hostNetwork, hostPID or hostIPC, no hostPath volume, no hostPort, no "
                  "capability added beyond the baseline's list and no seccomp Unconfined")


def defaults(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The side's PodSecurity defaults (mode -> value) and exemptions, from the first apiserver's
    rendered admission configuration (every apiserver renders the same); None where none renders one."""
    for path, text in sorted(((entry or {}).get("files") or {}).items()):
        if not path.endswith("/" + ADMISSION_CONFIG):
            continue
        try:
            document = load_yaml(text) or {}
        except yaml.YAMLError:
            return None  # preflight's admission-config judges a file that does not parse
        for plugin in document.get("plugins") or [] if isinstance(document, Mapping) else []:
            if isinstance(plugin, Mapping) and plugin.get("name") == "PodSecurity":
                config = plugin.get("configuration") or {}
                found = {m: str(v) for m, v in (config.get("defaults") or {}).items() if m in MODES}
                found["exemptions"] = ", ".join(sorted((config.get("exemptions") or {}).get("namespaces") or []))
                return found
        return {}
    return None


def _labelled(entry: Mapping[str, Any] | None) -> tuple[dict[str, str], set[str]]:
    """namespace -> its own enforce label; every namespace the graph creates, patches or puts a resource in."""
    labels: dict[str, str] = {}
    seen: set[str] = set()
    for r in (entry or {}).get("resources") or []:
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {} if isinstance(inputs, Mapping) else {}
        kind = str(r.get("type") or "").rsplit(":", 1)[-1]
        if kind in ("Namespace", "NamespacePatch") and meta.get("name"):
            seen.add(str(meta["name"]))
            if level := (meta.get("labels") or {}).get(ENFORCE_LABEL):
                labels[str(meta["name"])] = str(level)
        elif meta.get("namespace"):
            seen.add(str(meta["namespace"]))
    return labels, seen


def _rank(level: str | None) -> int:
    # a level PodSecurity does not know is evaluated as restricted (preflight pod-security says so)
    return LEVELS.index(level) if level in LEVELS else len(LEVELS) - 1


def _nccl(diff: StackDiff, level: str, unlabelled: set[str]) -> str:
    """What the head's enforce level does to kilonode's NCCL job template (in `default`)."""
    request = nccl_job.NcclJobRequest(pool="")
    if request.namespace not in unlabelled:
        return ""
    head = sides.inputs(diff, "head")
    if head is None:
        return f" (kilonode's NCCL job not judged: {sides.why_not(diff, 'head')})"
    pools = [p for p in head.plan.node_pools if p.gpus_per_node and p.infiniband and p.nccl_topology]
    if not pools:
        return ""
    pool = pools[0]
    refused = violations(nccl_job.pod_spec(head.plan, pool, nccl_job.NcclJobRequest(pool=pool.name)), level)
    if not refused:
        return f" kilonode's NCCL job template (kilonode.k8s.nccl_job, namespace {request.namespace}) meets it."
    return (f" kilonode's own NCCL job (`kilonode gpu nccl-job`, kilonode.k8s.nccl_job, namespace "
            f"{request.namespace}) would be refused: {'; '.join(refused)} (judged for pool {pool.name}).")


def _workloads(diff: StackDiff, level: str, unlabelled: set[str], exempt: set[str]) -> list[str]:
    """The graph's own workloads in the reached namespaces that the new level refuses."""
    found = []
    for r in (diff.head or {}).get("resources") or []:
        inputs = r.get("inputs") or {}
        meta = inputs.get("metadata") or {} if isinstance(inputs, Mapping) else {}
        namespace = str(meta.get("namespace") or "")
        if not namespace or namespace not in unlabelled or namespace in exempt:
            continue
        spec = pod_spec_of(inputs)
        if spec and violations(spec, level):
            found.append(f"{str(r.get('type', '')).rsplit(':', 1)[-1]} {namespace}/{meta.get('name')}")
    return sorted(found)


def _watched(now: Mapping[str, str], level: str) -> str:
    """Where warn and audit already hold the new level, what they have recorded is the list to read."""
    if now.get("warn") == level and now.get("audit") == level:
        return (f" (warn and audit are {level} already: the audit log's pod-security.kubernetes.io/audit-violations "
                "annotations name each pod that would be refused)")
    return f" (warn and audit {level} for a release, then enforce)"


def _enforce(diff: StackDiff, was: Mapping[str, str], now: Mapping[str, str]) -> list[Finding]:
    before, after = was.get("enforce") or "privileged", now.get("enforce") or "privileged"
    if _rank(after) == _rank(before):
        return []
    labels, seen = _labelled(diff.head)
    exempt = {n.strip() for n in str(now.get("exemptions") or "").split(",") if n.strip()}
    unlabelled = (set(BUILT_IN) | seen) - set(labels) - exempt
    reach = (f"every namespace without its own {ENFORCE_LABEL} label: {', '.join(sorted(unlabelled))}, and every "
             "namespace users create without a label" + (f" (exempt: {', '.join(sorted(exempt))})" if exempt else ""))
    own_levels = ", ".join(f"{n} {v}" for n, v in sorted(labels.items()))
    kept = f"; the labelled namespaces keep their own level ({own_levels})" if labels else ""
    if _rank(after) < _rank(before):
        return [Finding(MEDIUM, LOOSENED, (
            f"security: the apiservers' Pod Security default enforce level loosens {before} -> {after} "
            f"(admission-config.yaml): {reach}{kept} now admits pods {before} refused"
            + (", privileged containers, host namespaces and hostPath volumes included: root on the node"
               if after == "privileged" else "")
            + ". Keep the default and label the one namespace that needs less"),
            (ADMISSION_CONFIG,), cause="podSecurityDefaults")]
    needs = RESTRICTED_NEEDS if after == "restricted" else BASELINE_NEEDS
    own = _workloads(diff, after, unlabelled, exempt)
    return [Finding(HIGH, TIGHTENED, (
        f"the apiservers' Pod Security default enforce level tightens {before} -> {after} (admission-config.yaml): it "
        f"reaches {reach}{kept}. There a pod must then have {needs}; PodSecurity admission refuses any other pod at "
        "creation (\"violates PodSecurity\"): running pods stay, but every new pod of a Job, a Deployment's rollout "
        "or a restarted gang is refused, and most training images (CUDA, PyTorch) run as root with no seccomp "
        "profile." + (f" The stack's own workloads refused there: {', '.join(own)}." if own else "")
        + _nccl(diff, after, unlabelled)
        + f" Label the users' namespaces with their level first ({ENFORCE_LABEL}), or move through warn and audit "
        f"first{_watched(now, after)}, and change the NCCL job's pod spec to meet it"),
        (ADMISSION_CONFIG, *own), cause="podSecurityDefaults")]


def assess(diff: StackDiff) -> list[Finding]:
    was, now = defaults(diff.base), defaults(diff.head)
    if was is None or now is None or was == now:
        return []
    found = _enforce(diff, was, now)
    others = [f"{m} {was.get(m) or '(unset)'} -> {now.get(m) or '(unset)'}: {MEANING[m]}"
              for m in (*MODES[1:], "exemptions") if was.get(m) != now.get(m)]
    if others:
        found.append(Finding(MEDIUM, CHANGED, (
            "the apiservers' Pod Security defaults change (admission-config.yaml, every namespace without its own "
            f"labels): {'; '.join(others)}"), (ADMISSION_CONFIG,), cause="podSecurityDefaults"))
    return found
