"""kube-apiserver's admission plugins changed (`admission-plugins-changed`; independent trace of
kilonode diff on research-7500, 7th, finding 3: `AlwaysPullImages` added to
--enable-admission-plugins was "No risk found").

The flags are read from the rendered kube-apiserver unit of each apiserver in each side's snapshot
(kilonode.render.control_plane: `--enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs`);
each plugin added or removed (from --enable-admission-plugins, or by --disable-admission-plugins
turning a default one off) is named with what it does.

AlwaysPullImages (kubernetes plugin/pkg/admission/alwayspullimages/admission.go): its Admit, on
every pod CREATE and UPDATE, sets imagePullPolicy Always on every container, init container and
ephemeral container (pods.VisitContainersWithPath), and its Validate refuses a pod that is not so.
With Always the kubelet asks the registry to resolve the image at every container start, and a
failed pull fails the start even with the image on disk (the PullAlways policy: "Container will
fail if the pull fails"): every new pod on every node, DaemonSet pods on a booting node included,
depends on the registry answering. Images baked into the node image (a pool's preloadImages other
than its pause image, the stack's bootImageArchives: docs/node-images.md "Preloaded images") stop
mattering for the pods that run them: the field notes' registry lesson (a registry hiccup at boot
must not keep a node from Ready) is undone. The sandbox (pause) image is not a container of the
pod spec: the plugin does not reach it. Medium; high where a pool preloads an image a pod runs.

A plugin kilonode relies on removed is high (RELIED: what breaks without it).

Pure: a StackDiff in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kilonode.review.compare import StackDiff
from kilonode.review.finding import HIGH, MEDIUM, Finding
from kilonode.review.lifecycle import plan_of

RULE = "admission-plugins-changed"
UNIT = "etc/systemd/system/kube-apiserver.service"
ENABLE, DISABLE = "--enable-admission-plugins", "--disable-admission-plugins"
ALWAYS_PULL = "AlwaysPullImages"
# What each plugin does (Kubernetes docs, "Admission Control in Kubernetes", and each plugin's
# plugin/pkg/admission/<name>/admission.go).
WHAT = {
    ALWAYS_PULL: "sets imagePullPolicy Always on every container of every new or updated pod",
    "NodeRestriction": ("limits each kubelet to its own Node and the pods bound to it, and keeps it from setting "
                        "node-restriction.kubernetes.io/ labels"),
    "DenyServiceExternalIPs": "refuses any new Service externalIPs (CVE-2020-8554)",
    "PodSecurity": "enforces the Pod Security Standards each namespace's labels name",
    "ServiceAccount": "mounts service-account tokens and refuses a pod naming a missing service account",
    "Priority": "resolves priorityClassName into a pod's priority (preemption, the autoscaler's cutoff)",
    "ValidatingAdmissionPolicy": "evaluates ValidatingAdmissionPolicies and their bindings",
    "MutatingAdmissionWebhook": "calls the mutating webhooks",
    "ValidatingAdmissionWebhook": "calls the validating webhooks",
    "ResourceQuota": "enforces ResourceQuotas",
    "LimitRanger": "applies LimitRange defaults and bounds",
    "NamespaceLifecycle": "refuses objects in a terminating or missing namespace",
    "DefaultTolerationSeconds": "adds the 300s not-ready/unreachable tolerations",
    "TaintNodesByCondition": "taints a new Node not-ready until its kubelet reports",
    "EventRateLimit": "rate-limits Events at the apiserver",
}
# Plugins kilonode relies on, and what breaks without them.
RELIED = {
    "NodeRestriction": ("a node's credentials (root on any node) can then modify every Node and pod of the "
                        "cluster, and set the placement labels kilonode's policies trust"),
    "DenyServiceExternalIPs": "any user able to create a Service can intercept traffic to any IP (CVE-2020-8554)",
    "PodSecurity": "the namespaces' pod-security labels (kilonode.k8s.pod_security) stop being enforced",
    "ValidatingAdmissionPolicy": "kilonode's admission policies (kilonode.k8s.admission) stop being evaluated",
    "ServiceAccount": "service-account token mounting and checks stop",
    "Priority": ("pods lose their PriorityClass priority: team preemption, borrowing and the autoscaler's "
                 "expendable cutoff stop working"),
    "NamespaceLifecycle": "objects can be created in terminating namespaces",
}
_FLAG = re.compile(r"(--(?:enable|disable)-admission-plugins)=(\S*)")


def plugins(files: Mapping[str, str]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """apiserver host -> (enabled, disabled) admission plugins, from its rendered unit."""
    found: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for path, text in files.items():
        if not path.endswith(UNIT):
            continue
        flags = {ENABLE: "", DISABLE: ""}
        for flag, value in _FLAG.findall(text):
            flags[flag] = value.rstrip("\\").strip("'\"")
        on, off = (frozenset(p for p in flags[f].split(",") if p) for f in (ENABLE, DISABLE))
        found[path.split("/", 1)[0]] = (on, off)
    return found


def _preloads(entry: Mapping[str, Any] | None) -> list[str]:
    """Images a pool bakes in that a pod's container runs: preloadImages other than the pool's pause
    image (a bootImageArchives entry lands in each pool's preloadImages: kilonode.plan.resolve.pools)."""
    plan = plan_of(entry)
    found = []
    for pool in plan.get("nodePools") or []:
        pause = str(pool.get("pauseImage") or "")
        for image in pool.get("preloadImages") or []:
            name = str((image or {}).get("image") or "")
            if name and name != pause and not str((image or {}).get("source") or "").startswith("build:pause"):
                found.append(f"{pool.get('name')}: {name}")
    return sorted(set(found))


def _not_preloaded(entry: Mapping[str, Any] | None) -> int:
    return len({i for p in plan_of(entry).get("nodePools") or [] for i in p.get("bootImagesNotPreloaded") or []})


def assess(diff: StackDiff) -> list[Finding]:
    before = plugins((diff.base or {}).get("files") or {})
    after = plugins((diff.head or {}).get("files") or {})
    hosts = sorted(h for h in after if h in before and before[h] != after[h])
    if not hosts:
        return []
    (was_on, was_off), (now_on, now_off) = before[hosts[0]], after[hosts[0]]
    added = sorted((now_on - was_on) | (was_off - now_off))
    removed = sorted((was_on - now_on) | (now_off - was_off))
    removed = [p for p in removed if p not in now_on or p in now_off]
    added = [p for p in added if p not in now_off]
    if not added and not removed:
        return []
    level = MEDIUM
    parts = []
    for plugin in added:
        what = WHAT.get(plugin, "a plugin this review does not know: read its admission.go")
        said = f"{plugin} added ({what})"
        if plugin == ALWAYS_PULL:
            preloads = _preloads(diff.head)
            if preloads:
                level = HIGH
            said += (
                ": every container start of every new pod on every node then asks the registry (the kubelet pulls "
                "with Always at each start, and a failed pull fails the start with the image on disk: "
                "ErrImagePull/ImagePullBackOff), so a registry outage or rate limit stops new pods cluster-wide, "
                "DaemonSet pods on a booting node included (kube-proxy, calico-node: the node stays NotReady), the "
                "field notes' registry lesson undone"
                + (f"; the images baked into the node images stop mattering for the pods that run them "
                   f"({', '.join(preloads)})" if preloads else
                   f"; this stack preloads no image a pod runs (the pause image, preloaded, is the sandbox's and "
                   f"the plugin does not reach it; {_not_preloaded(diff.head)} boot images are already pulled at "
                   "first start), but every later start of those pods is now a pull too")
                + ". Each of ~7,500 nodes' pods re-resolving at every start is also load on the registry "
                "(kubernetes plugin/pkg/admission/alwayspullimages/admission.go Admit; docs/node-images.md)")
        parts.append(said)
    for plugin in removed:
        what = WHAT.get(plugin, "a plugin this review does not know: read its admission.go")
        said = f"{plugin} removed ({what})"
        if plugin in RELIED:
            level = HIGH
            said += f": kilonode relies on it, {RELIED[plugin]}"
        parts.append(said)
    return [Finding(level, RULE, (
        f"kube-apiserver's admission plugins change on {len(hosts)} apiserver(s) ({', '.join(hosts)}): "
        + "; ".join(parts) + ". The flag change restarts each apiserver (its unit changes)"),
        tuple(f"{h}/{UNIT}" for h in hosts), cause="admission plugins")]
