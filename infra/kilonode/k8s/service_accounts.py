"""DefaultServiceAccounts: no API token by default (CIS Kubernetes Benchmark 5.1.5). Each
namespace's `default` ServiceAccount gets automountServiceAccountToken: false, so a pod that
names no account gets no token unless it asks for one (the pod's own
automountServiceAccountToken: true overrides the account's).

Which namespaces: the four the apiserver creates (default, kube-system, kube-public,
kube-node-lease) and kilonode's own. What runs there as `default`, at this commit: in
kube-system the NVIDIA and RDMA device plugins, in kilonode-capacity the balloons, each already
with automountServiceAccountToken: false on the pod (none calls the API); every other kilonode
pod has its own account. In `default`, `kilonode nccl-test`'s job (kilonode.k8s.nccl_job) names
no account and calls no API (static rendezvous); users' pods there that call the API with the
default account's token (it has no rights beyond discovery) must now name an account or set the
pod field. kube-public and kube-node-lease hold no pods.

How: a ServiceAccountPatch (pulumi-kubernetes, server-side apply), not a ServiceAccount: the
ServiceAccount controller of kube-controller-manager creates `default` in every namespace,
asynchronously, and a Patch resource is an apply that creates the object when it is missing and
updates it when it is not (pulumi-kubernetes provider/pkg/await/await.go: Patch resources are
always sent as an apply PATCH), so it does not race the controller. The controller writes only
the account's metadata, so this one field conflicts with no other field manager and needs no
force. Deleting the Patch resource relinquishes the field (ssa.Relinquish), leaving the account
as the controller made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import core, meta

# The namespaces every cluster has: the apiserver creates them at start (kubernetes
# pkg/controlplane/controller: systemNamespaces = metav1.NamespaceSystem, NamespacePublic,
# corev1.NamespaceNodeLease; `default` beside the `kubernetes` Service it holds).
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DEFAULT_ACCOUNT = "default"


@dataclass(frozen=True)
class DefaultServiceAccountsArgs:
    # kilonode's own namespaces -> the resource that creates each (the patch waits for it)
    own: Mapping[str, pulumi.Resource]


class DefaultServiceAccounts(pulumi.ComponentResource):
    patches: dict[str, core.v1.ServiceAccountPatch]

    def __init__(self, name: str, args: DefaultServiceAccountsArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:DefaultServiceAccounts", name, None, opts)
        overlap = set(args.own) & set(BUILT_IN_NAMESPACES)
        if overlap:
            raise ValueError(f"kilonode does not create the built-in namespaces {sorted(overlap)}")
        self.patches = {}
        for namespace in (*BUILT_IN_NAMESPACES, *sorted(args.own)):
            creator = args.own.get(namespace)
            self.patches[namespace] = core.v1.ServiceAccountPatch(
                f"{name}-{namespace}",
                metadata=meta.v1.ObjectMetaPatchArgs(name=DEFAULT_ACCOUNT, namespace=namespace),
                automount_service_account_token=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[creator] if creator else None),
            )
        self.register_outputs({})
