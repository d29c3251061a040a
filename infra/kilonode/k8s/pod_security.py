"""Pod security for what kilonode runs in the cluster: the PodSecurity labels of its
namespaces (kilonode.plan.defaults.pod_security; the apiserver's admission configuration
holds the defaults for every other namespace, kilonode.render.control_plane.admission_config),
the pod-level security context every pod it writes carries, and the ordering that admits the
kube-system node agents: their pods must be created after kube-system says `privileged`.

Label keys: kubernetes staging/src/k8s.io/pod-security-admission/api/constants.go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
from pulumi_kubernetes import core, meta

from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.plan import defaults

LABEL_PREFIX = "pod-security.kubernetes.io/"
MODES = ("enforce", "audit", "warn")
# What creates pods: a pod template (Deployment, DaemonSet, StatefulSet, Job) or a Pod.
POD_CREATORS = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:StatefulSet",
                "kubernetes:batch/v1:Job", "kubernetes:core/v1:Pod")
# The pod-level seccomp profile of every pod kilonode writes: the runtime's default filter
# (containerd's and Docker's; cri-dockerd passes RuntimeDefault to Docker as its default
# profile). A pod-level field, so every container, init container included, inherits it.
RUNTIME_DEFAULT_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}


def pod_security_labels(namespace: str, minor: int) -> dict[str, str]:
    """The PodSecurity labels of one of kilonode's namespaces at the cluster's minor."""
    levels = defaults.POD_SECURITY_NAMESPACES[namespace]
    labels = {}
    for mode in MODES:
        labels[f"{LABEL_PREFIX}{mode}"] = levels[mode]
        labels[f"{LABEL_PREFIX}{mode}-version"] = f"v1.{minor}"
    return labels


def kilonode_namespace(resource_name: str, namespace: str, labels: dict[str, str], minor: int,
                       opts: pulumi.ResourceOptions) -> core.v1.Namespace:
    """One of kilonode's own namespaces, labelled with `labels` and its PodSecurity levels
    (kilonode.plan.defaults.POD_SECURITY_NAMESPACES) at the cluster's minor. Its default
    ServiceAccount is patched by kilonode.k8s.service_accounts."""
    return core.v1.Namespace(
        resource_name,
        metadata=meta.v1.ObjectMetaArgs(name=namespace, labels={**labels, **pod_security_labels(namespace, minor)}),
        opts=opts,
    )


def pod_security_context(**more: Any) -> core.v1.PodSecurityContextArgs:
    """The pod security context of a kilonode pod: RuntimeDefault seccomp, plus `more`."""
    return core.v1.PodSecurityContextArgs(
        seccomp_profile=core.v1.SeccompProfileArgs(type="RuntimeDefault"), **more)


# The user the distroless images name `nonroot` (gcr.io/distroless base images: passwd entry
# nonroot:x:65532:65532), which most images kilonode runs are built as or can run as; each
# caller cites its image's Dockerfile.
NONROOT_USER = 65532


def container_security_context(
    run_as_user: int | None,
    *,
    add_capabilities: Sequence[str] = (),
    read_only_root_filesystem: bool = True,
) -> core.v1.SecurityContextArgs:
    """An unprivileged container's security context: no privilege escalation (no_new_privs),
    every capability dropped and only `add_capabilities` given back, a read-only root filesystem
    (a program that writes files gets an emptyDir at that path, never a writable image), and,
    with `run_as_user`, that user with runAsNonRoot.

    runAsNonRoot always comes with a numeric runAsUser: the kubelet verifies the user it is
    about to start the container as, and without runAsUser that is the image's USER, which it
    refuses when it is root and also when it is a name it cannot resolve (distroless's `USER
    nonroot`): "container has runAsNonRoot and image has non-numeric user ..., cannot verify
    user is non-root" (kubernetes pkg/kubelet/kuberuntime/security_context_others.go,
    verifyRunAsNonRoot). `run_as_user` None leaves the image's own user (root, where a
    program needs it: the caller says why)."""
    if run_as_user is not None and run_as_user <= 0:
        raise ValueError(f"run_as_user must be a non-root UID, got {run_as_user}")
    return core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        capabilities=core.v1.CapabilitiesArgs(drop=["ALL"], add=list(add_capabilities) or None),
        read_only_root_filesystem=read_only_root_filesystem,
        run_as_non_root=True if run_as_user is not None else None,
        run_as_user=run_as_user,
        run_as_group=run_as_user,
    )


class KubeSystemPodSecurity(pulumi.ComponentResource):
    """kube-system's PodSecurity labels, applied to the namespace the apiserver created (a
    server-side apply patch: only these labels are kilonode's), and `after_labels`, a
    transformation that makes every pod creator in the tree wait for them."""

    patch: core.v1.NamespacePatch

    def __init__(self, name: str, minor: int, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:KubeSystemPodSecurity", name, None, opts)
        self.patch = core.v1.NamespacePatch(
            f"{name}-labels",
            metadata=meta.v1.ObjectMetaPatchArgs(name=KUBE_SYSTEM, labels=pod_security_labels(KUBE_SYSTEM, minor)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({})

    def after_labels(self, args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        """Without it a DaemonSet created first would have its pods refused under the
        cluster's `baseline` until the labels land (the controller retries, with backoff)."""
        if args.type_ not in POD_CREATORS:
            return None
        # merge concatenates the lists: the resource keeps its own depends_on
        return pulumi.ResourceTransformationResult(
            args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(depends_on=[self.patch])))
