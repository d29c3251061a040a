"""What runs where, by version, on each side of a change; and the risks of a change that makes
the machines and the in-cluster objects disagree.

The machines run what their image carries, and a built image never changes under its version
(the Compute Gallery keeps it): where a change leaves an image's version alone, the machines
keep the base's binaries and preloaded images whatever the head renders. The in-cluster objects
(kube-proxy, the cloud controller, the autoscaler, the gang scheduler) run what the head names
as soon as `pulumi up` applies them. Kubernetes' version-skew policy
(https://kubernetes.io/releases/version-skew-policy/, as of 1.35) says which mixes work:

- kube-apiserver: HA instances within one minor of each other;
- kubelet: not newer than kube-apiserver, at most three minors older;
- kube-proxy: not newer than kube-apiserver, at most three minors older, and within three
  minors of the kubelet beside it;
- kube-controller-manager, kube-scheduler, cloud-controller-manager: not newer than
  kube-apiserver, at most one minor older. The gang scheduler (scheduler-plugins, built on
  kube-scheduler's library of the same minor: v0.34.x for 1.34) counts as a kube-scheduler;
- cluster-autoscaler: its releases follow Kubernetes' minors and it supports the one it was
  built for (kubernetes/autoscaler cluster-autoscaler README, "Releases").

Pure: the snapshots' plan.yaml and imageContents (kilonode.review.snapshot) in, risks out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kilonode.review.finding import HIGH, Finding

# Where the components' versions sit in plan.yaml's `components` (kilonode.plan.model.ComponentsPlan).
KUBE_PROXY = "kubeProxyImage"
CLOUD_PROVIDER = "cloudProviderAzureVersion"
AUTOSCALER = "clusterAutoscalerVersion"
SCHEDULER_PLUGINS = "schedulerPluginsVersion"
# The binaries that carry a Kubernetes version in the images (node-image/binaries.toml).
APISERVER_BINARY = "kubernetes-server"  # kube-apiserver, -controller-manager, -scheduler
KUBELET_BINARY = "kubelet"
# What a preloaded image missing from the node image does (rendered units: the kubelet
# Requires= kilonode-preload-images.service, which loads every listed archive and fails on a
# missing one).
PRELOAD_UNIT = "kilonode-preload-images.service"

_MINOR = re.compile(r"v?(\d+)\.(\d+)")


def minor(text: Any) -> int | None:
    """`1.34.2`, `v1.34.13`, `registry.k8s.io/kube-proxy:v1.35.0` (or `...:v1.33.5@sha256:...`) -> 34/35/33;
    None when unreadable."""
    if not isinstance(text, str):
        return None
    # the digest first: its own colon would otherwise be taken for the tag's
    tag = text.split("@", 1)[0].rsplit(":", 1)[-1] if "/" in text else text
    match = _MINOR.match(tag)
    return int(match.group(2)) if match and match.group(1) == "1" else None


def _scheduler_plugins_minor(text: Any) -> int | None:
    """scheduler-plugins v0.34.7 is built on Kubernetes 1.34's scheduler."""
    match = _MINOR.match(text) if isinstance(text, str) else None
    return int(match.group(2)) if match and match.group(1) == "0" else None


@dataclass(frozen=True)
class Side:
    """One side's versions, as minors: what each kind of machine runs and what the in-cluster
    objects run."""

    apiserver: int | None
    kubelet_new: int | None  # new or upgraded nodes (an upgrade applies the scale set's model)
    kubelet_old: int | None  # nodes that exist now: a reimage keeps their image, only an upgrade changes it
    in_cluster: Mapping[str, int | None]
    # the control plane's --emulated-version (plan.yaml controlPlaneEmulatedVersion), None where unset:
    # the apiservers then serve that minor's APIs and defaults, and the skew rules hold against it
    # (KEP-4330 "Compatibility Versions", Skew: no kubelet, kube-proxy or controller newer than the
    # emulated version), so 1.34 in-cluster components under 1.35 binaries emulating 1.34 are in policy
    emulated: int | None = None

    @property
    def effective_apiserver(self) -> int | None:
        return self.emulated if self.emulated is not None else self.apiserver


def _image(contents: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    entry = contents.get(key)
    return entry if isinstance(entry, Mapping) else None


def _binary_minor(entry: Mapping[str, Any] | None, binary: str) -> int | None:
    binaries = (entry or {}).get("binaries")
    return minor(binaries.get(binary)) if isinstance(binaries, Mapping) else None


def running(base_contents: Mapping[str, Any], head_contents: Mapping[str, Any], key: str,
            binary: str) -> tuple[int | None, int | None]:
    """(what machines booted from the head's image of `key` run, what the machines already there
    run) for one binary: the head's contents only where the head moves the image's version."""
    base, head = _image(base_contents, key), _image(head_contents, key)
    was = _binary_minor(base, binary)
    if head is None:
        return None, was
    if base is not None and base.get("version") == head.get("version"):
        return was, was  # the same built image: the base's binaries
    return _binary_minor(head, binary), was


def _in_cluster(plan: Mapping[str, Any]) -> dict[str, int | None]:
    c = plan.get("components") or {}
    return {
        "kube-proxy": minor(c.get(KUBE_PROXY)),
        "cloud-controller-manager": minor(c.get(CLOUD_PROVIDER)),
        "cloud-node-manager": minor(c.get(CLOUD_PROVIDER)),
        "cluster-autoscaler": minor(c.get(AUTOSCALER)),
        "gang scheduler (scheduler-plugins)": _scheduler_plugins_minor(c.get(SCHEDULER_PLUGINS)),
    }


def side(base_plan: Mapping[str, Any], head_plan: Mapping[str, Any], base_contents: Mapping[str, Any],
         head_contents: Mapping[str, Any]) -> Side:
    """The head as it runs after `pulumi up`: machines from the images they boot, objects from the head."""
    apiserver, _ = running(base_contents, head_contents, "control-plane", APISERVER_BINARY)
    pools = [k for k in head_contents if k.startswith("pool-")]
    new = [running(base_contents, head_contents, k, KUBELET_BINARY) for k in pools]
    newest = max((n for n, _ in new if n is not None), default=None)
    oldest = min((o for _, o in new if o is not None), default=None)
    return Side(apiserver, newest, oldest, _in_cluster(head_plan),
                minor(head_plan.get("controlPlaneEmulatedVersion") or head_plan.get("control_plane_emulated_version")))


def base_side(plan: Mapping[str, Any], contents: Mapping[str, Any]) -> Side:
    """The base as it runs (its own images, its own objects)."""
    return side(plan, plan, contents, contents)


def violations(s: Side) -> dict[str, str]:
    """Each broken rule of the skew policy: a stable key -> what is wrong."""
    found: dict[str, str] = {}
    api = s.effective_apiserver
    if api is None:
        return found
    apis = f"kube-apiserver 1.{api}" + (f" (1.{s.apiserver} emulating 1.{api})" if s.emulated is not None else "")
    kubelets = {"new or upgraded nodes": s.kubelet_new, "the nodes already there": s.kubelet_old}
    for where, kubelet in kubelets.items():
        if kubelet is None:
            continue
        if kubelet > api:
            found[f"kubelet-newer:{where}"] = (f"the kubelet on {where} (1.{kubelet}) is newer than "
                                               f"{apis}: the policy forbids a kubelet newer than the apiserver")
        elif api - kubelet > 3:
            found[f"kubelet-older:{where}"] = (f"the kubelet on {where} (1.{kubelet}) is more than three minors older "
                                               f"than {apis}")
    for name, version in s.in_cluster.items():
        if version is None:
            continue
        if name == "cluster-autoscaler":
            if version != api:
                found["autoscaler"] = (f"cluster-autoscaler 1.{version} runs against {apis}: each "
                                       "autoscaler release supports the Kubernetes minor it was built for")
            continue
        older = 3 if name in ("kube-proxy", "cloud-node-manager") else 1
        if version > api:
            found[f"newer:{name}"] = (f"{name} 1.{version} is newer than {apis}, which the policy "
                                      "forbids")
        elif api - version > older:
            found[f"older:{name}"] = f"{name} 1.{version} is more than {older} minor(s) older than {apis}"
    proxy = s.in_cluster.get("kube-proxy")
    for where, kubelet in kubelets.items():
        if proxy is not None and kubelet is not None and abs(proxy - kubelet) > 3:
            found[f"proxy-kubelet:{where}"] = (f"kube-proxy 1.{proxy} and the kubelet on {where} (1.{kubelet}) are "
                                               "more than three minors apart")
    return found


def _plan_minor(plan: Mapping[str, Any]) -> int | None:
    return minor(plan.get("kubernetesVersion"))


def skew(base_plan: Mapping[str, Any], head_plan: Mapping[str, Any], base_contents: Mapping[str, Any],
         head_contents: Mapping[str, Any]) -> list[Finding]:
    """Skew the head brings that the base did not have, and a Kubernetes minor moved by more than one."""
    if not base_contents or not head_contents or "error" in base_contents or "error" in head_contents:
        return []
    found: list[Finding] = []
    was, now = _plan_minor(base_plan), _plan_minor(head_plan)
    if was is not None and now is not None and (now < was or now - was > 1):
        what = "downgraded" if now < was else "moved by more than one minor"
        found.append(Finding(HIGH, "kubernetes-minor-jump", (
            f"kubernetesVersion {what} (1.{was} -> 1.{now}): Kubernetes upgrades one minor at a time (HA "
            "apiservers within one minor; storage versions migrate per minor) and never downgrades a minor; "
            "go through each minor in turn")))
    head = side(base_plan, head_plan, base_contents, head_contents)
    before = violations(base_side(base_plan, base_contents))
    new = {k: v for k, v in violations(head).items() if k not in before}
    if new:
        images = []
        for key, label in (("control-plane", "controlPlaneImageVersion"), ("pool-", "nodeImageVersion")):
            base_v = next((e.get("version") for k, e in base_contents.items() if k.startswith(key)
                           and isinstance(e, Mapping)), None)
            head_v = next((e.get("version") for k, e in head_contents.items() if k.startswith(key)
                           and isinstance(e, Mapping)), None)
            images.append(f"{label} {head_v}" + (" (unchanged)" if base_v == head_v else f" (was {base_v})"))
        found.append(Finding(HIGH, "version-skew", (
            "after `pulumi up` the cluster breaks Kubernetes' version-skew policy: " + "; ".join(new.values())
            + f". The machines run what their images carry ({', '.join(images)}); the in-cluster objects run "
            "what the head names. Upgrade in the policy's order: build and roll the control-plane image first "
            "(apiservers, then controller-manager and scheduler), then the in-cluster controllers, then the "
            "node images, one minor at a time"), tuple(sorted(new))))
    return found


def image_contents(base_contents: Mapping[str, Any], head_contents: Mapping[str, Any]) -> list[Finding]:
    """An image whose version did not move while what the head says it carries did: the machines
    keep the built image, so the head describes binaries or preloaded images they do not have."""
    if not base_contents or not head_contents or "error" in base_contents or "error" in head_contents:
        return []
    groups: dict[tuple[str, str], list[str]] = {}
    for key, head in sorted(head_contents.items()):
        base = base_contents.get(key)
        if not isinstance(head, Mapping) or not isinstance(base, Mapping) or base.get("version") != head.get("version"):
            continue
        missing = [i for i in head.get("preload") or [] if i not in (base.get("preload") or [])]
        hb, bb = head.get("binaries"), base.get("binaries")
        binaries = []
        if isinstance(hb, Mapping) and isinstance(bb, Mapping):
            binaries = [f"{n} {v} (the image has {bb.get(n, 'none')})" for n, v in sorted(hb.items()) if bb.get(n) != v]
        elif hb != bb:
            binaries = [f"the head's binaries do not resolve ({hb})" if isinstance(hb, str) else
                        "binaries the base could not resolve"]
        label = "controlPlaneImageVersion" if key == "control-plane" else (
            "etcdImageVersion" if key == "etcd" else "nodeImageVersion")
        version = str(head.get("version"))
        if missing:
            groups.setdefault((f"preload|{label}|{version}|{', '.join(missing)}", HIGH), []).append(key)
        if binaries:
            groups.setdefault((f"binaries|{label}|{version}|{'; '.join(binaries)}", HIGH), []).append(key)
    found = []
    for (text, level), keys in groups.items():
        kind, label, version, what = text.split("|", 3)
        machines = ", ".join(keys)
        if kind == "preload":
            story = (f"{machines}: the node image {version} ({label} unchanged) does not carry the preloaded "
                     f"image(s) {what}. The head's preload list names their archives, {PRELOAD_UNIT} fails on "
                     "the missing file and the kubelet requires it: no new or upgraded node starts a kubelet. "
                     f"Bump {label}, build and upload the image (`kilonode image build`), then roll")
        else:
            story = (f"{machines}: the image {version} ({label} unchanged) was built with other binaries than "
                     f"the head names: {what}. Its machines keep the image's, while the head's flags and "
                     f"objects assume the new ones. Bump {label}, build and upload the image, then roll")
        found.append(Finding(level, "image-not-rebuilt", story, tuple(keys)))
    return found
