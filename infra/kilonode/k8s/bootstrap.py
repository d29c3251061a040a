"""NodeBootstrap: what lets a new node join, as kubeadm sets it up.

- the bootstrap token as a `bootstrap.kubernetes.io/token` Secret in kube-system (the
  apiserver's --enable-bootstrap-token-auth reads it; the token cleaner removes it once
  expired, and it has no expiry: scale sets add nodes at any time);
- ClusterRoleBindings for the token's group: create CSRs (system:node-bootstrapper) and have
  the controller manager auto-approve the first client certificate (...:nodeclient); and
  for system:nodes, the renewal of their own client certificates (...:selfnodeclient);
- the cluster-admins group bound to cluster-admin (the exported admin kubeconfig's identity).

Kubelet *serving* certificates are the ServingCertApprover's (kilonode.k8s.approver).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import core, meta, rbac

from kilonode.plan import defaults

KUBE_SYSTEM = "kube-system"
RBAC_GROUP = "rbac.authorization.k8s.io"

# kubeadm's names for the same bindings (cmd/kubeadm/app/phases/bootstraptoken/node).
BINDINGS = {
    "kilonode:kubelet-bootstrap": ("system:node-bootstrapper", defaults.BOOTSTRAP_GROUP),
    "kilonode:node-autoapprove-bootstrap": (
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient", defaults.BOOTSTRAP_GROUP,
    ),
    "kilonode:node-autoapprove-certificate-rotation": (
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes",
    ),
    "kilonode:cluster-admins": ("cluster-admin", defaults.CLUSTER_ADMINS_GROUP),
}


@dataclass(frozen=True)
class NodeBootstrapArgs:
    token_id: pulumi.Output[str]
    token_secret: pulumi.Output[str]  # secret


def cluster_role_binding(name: str, role: str, group: str, opts: pulumi.ResourceOptions,
                         resource_name: str) -> rbac.v1.ClusterRoleBinding:
    return rbac.v1.ClusterRoleBinding(
        resource_name,
        metadata=meta.v1.ObjectMetaArgs(name=name, labels={"app.kubernetes.io/managed-by": "kilonode"}),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role),
        subjects=[rbac.v1.SubjectArgs(api_group=RBAC_GROUP, kind="Group", name=group)],
        opts=opts,
    )


class NodeBootstrap(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeBootstrapArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:NodeBootstrap", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        core.v1.Secret(
            f"{name}-token",
            metadata=meta.v1.ObjectMetaArgs(
                name=pulumi.Output.concat("bootstrap-token-", args.token_id), namespace=KUBE_SYSTEM,
                labels={"app.kubernetes.io/managed-by": "kilonode"},
            ),
            type="bootstrap.kubernetes.io/token",
            string_data={
                "description": "kilonode: the node pools' kubelets authenticate with it until they have a "
                               "client certificate",
                "token-id": args.token_id,
                "token-secret": args.token_secret,
                "usage-bootstrap-authentication": "true",
                "usage-bootstrap-signing": "true",
                "auth-extra-groups": defaults.BOOTSTRAP_GROUP,
            },
            opts=child,
        )
        for binding, (role, group) in BINDINGS.items():
            cluster_role_binding(binding, role, group, child, f"{name}-{binding.split(':', 1)[1]}")
        self.register_outputs({})
