"""NodeBootstrap: what lets a new node join (kubeadm's scheme, narrowed per pool).

- each pool's join tokens (the plan's join_tokens: its current generation, and the previous one
  while it drains) as `bootstrap.kubernetes.io/token` Secrets in kube-system, with their
  `expiration`: the apiserver's bootstrap authenticator refuses a token past it, and
  kube-controller-manager's token cleaner (token-cleaner-controller, enabled in
  kilonode.render.control_plane) deletes the Secret then (pkg/controller/bootstrap/tokencleaner.go:
  evalSecret deletes once cluster-bootstrap's GetExpiration says expired, and re-queues the
  Secret for that moment otherwise). Each token adds the shared group (may create CSRs) and its
  pool's own group (which names it gets a certificate for);
- ClusterRoleBindings: the shared group may create CSRs (system:node-bootstrapper); system:nodes
  may renew their own client certificates (...:selfnodeclient, approved by kube-controller-manager).
  No binding of ...:nodeclient: kube-controller-manager's approval of a first client certificate
  checks no name (kilonode.node.node_client_approver.rules says what it checks), so that approval
  is the node client approver's, per pool;
- the node client approver's ClusterRole, bound to its user, and nothing more: get/list/watch
  CSRs, update their approval, `approve` for the kubelet client signer only (the CSR approval
  admission plugin checks that verb on `signers` with the signer's name as resourceName:
  plugin/pkg/admission/certificates/approval/admission.go), get Nodes; and in kube-system a Role
  to get its pool table, a ConfigMap of each pool's scale-set computer-name prefixes;
- the cluster-admins group of the stack's admin generation bound to cluster-admin (the exported
  admin kubeconfig's identity; raising adminGeneration moves the binding and so revokes old copies);
- the apiservers' kubelet client user bound to the built-in system:kubelet-api-admin: what lets
  them reach a kubelet (logs, exec, port-forward) now that their certificate is in no group
  (kilonode.plan.defaults.APISERVER_KUBELET_CLIENT_USER). Every join token Secret waits for it: no
  node authenticates before the binding exists, so no kubelet is ever asked by an apiserver it
  would refuse.

Kubelet *serving* certificates are the ServingCertApprover's (kilonode.k8s.approver).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import core, meta, rbac

from kilonode.node.node_client_approver.rules import POOLS_CONFIGMAP, POOLS_KEY, POOLS_NAMESPACE, Pool, pools_to_json
from kilonode.plan import defaults, pki
from kilonode.plan.model import JoinTokenPlan

KUBE_SYSTEM = "kube-system"
RBAC_GROUP = "rbac.authorization.k8s.io"
KUBELET_CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
NODE_CLIENT_APPROVER_ROLE = "kilonode:node-client-approver"

# kubeadm's names for the same bindings (cmd/kubeadm/app/phases/bootstraptoken/node), less
# kubeadm's node-autoapprove-bootstrap (nodeclient for every bootstrap token).
BINDINGS = {
    "kilonode:kubelet-bootstrap": ("system:node-bootstrapper", defaults.BOOTSTRAP_GROUP),
    "kilonode:node-autoapprove-certificate-rotation": (
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes",
    ),
}
# The exported admin credential's binding: to the group of the stack's admin generation alone
# (kilonode.plan.pki.cluster_admins_group), so that raising the generation revokes earlier copies.
CLUSTER_ADMINS_BINDING = "kilonode:cluster-admins"
# The apiservers' kubelet client (no group) to the built-in role for the kubelet API
# (bootstrappolicy/policy.go: system:kubelet-api-admin, "a role to use for full access to the
# kubelet API"; kubernetes.io/docs/reference/access-authn-authz/kubelet-authn-authz)
KUBELET_API_BINDING = "kilonode:apiserver-kubelet-client"
KUBELET_API_ROLE = "system:kubelet-api-admin"

# (api group, resource, verbs, resource names): exactly the approver's requests
# (kilonode.node.node_client_approver.main)
NODE_CLIENT_APPROVER_RULES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("certificates.k8s.io", "certificatesigningrequests", ("get", "list", "watch"), ()),
    ("certificates.k8s.io", "certificatesigningrequests/approval", ("update",), ()),
    ("certificates.k8s.io", "signers", ("approve",), (KUBELET_CLIENT_SIGNER,)),
    ("", "nodes", ("get",), ()),
)


@dataclass(frozen=True)
class NodeBootstrapArgs:
    tokens: Sequence[JoinTokenPlan]
    # (pool, team, generation) -> the token's id and secret (secret): kilonode.azure.tls
    values: Mapping[tuple[str, str | None, int], tuple[pulumi.Output[str], pulumi.Output[str]]]
    # the stack's admin generation: its group is the one bound (kilonode.plan.pki.cluster_admins_group)
    admin_generation: int = 0


def cluster_role_binding(name: str, role: str, group: str, opts: pulumi.ResourceOptions,
                         resource_name: str, kind: str = "Group") -> rbac.v1.ClusterRoleBinding:
    return rbac.v1.ClusterRoleBinding(
        resource_name,
        metadata=meta.v1.ObjectMetaArgs(name=name, labels={"app.kubernetes.io/managed-by": "kilonode"}),
        role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role),
        subjects=[rbac.v1.SubjectArgs(api_group=RBAC_GROUP, kind=kind, name=group)],
        opts=opts,
    )


def pool_table(tokens: Sequence[JoinTokenPlan]) -> str:
    """Each registration group with a token (a pool's shared shards, a team's), and its scale
    sets' computerNamePrefixes (the approver's table: a token's group gets names of its own
    shards only)."""
    prefixes = {t.registration: t.prefixes for t in tokens}
    return pools_to_json([Pool(group, names) for group, names in prefixes.items()])


def token_data(token: JoinTokenPlan, token_id: pulumi.Input[str],
               token_secret: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """The Secret's keys, as cluster-bootstrap names them (token/api/types.go)."""
    data: dict[str, pulumi.Input[str]] = {
        "description": f"kilonode: {token.registration}'s join token, generation {token.generation}; its kubelets "
                       "authenticate with it until they have a client certificate",
        "token-id": token_id,
        "token-secret": token_secret,
        "usage-bootstrap-authentication": "true",
        "usage-bootstrap-signing": "true",
        "auth-extra-groups": f"{defaults.BOOTSTRAP_GROUP},{token.group}",
    }
    if token.expires is not None:
        data["expiration"] = token.expires
    return data


class NodeBootstrap(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeBootstrapArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:NodeBootstrap", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        kubelet_api = cluster_role_binding(KUBELET_API_BINDING, KUBELET_API_ROLE,
                                           defaults.APISERVER_KUBELET_CLIENT_USER, child,
                                           f"{name}-apiserver-kubelet-client", kind="User")
        # the tokens after it: a node joins only once its apiservers may reach its kubelet
        after_binding = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[kubelet_api]))
        for token in args.tokens:
            token_id, token_secret = args.values[(token.pool, token.team, token.generation)]
            group = token.pool if token.team is None else f"{token.pool}-team-{token.team}"
            core.v1.Secret(
                f"{name}-token-{group}-g{token.generation}",
                metadata=meta.v1.ObjectMetaArgs(
                    name=pulumi.Output.concat("bootstrap-token-", token_id), namespace=KUBE_SYSTEM,
                    labels={"app.kubernetes.io/managed-by": "kilonode", "kilonode.io/pool": token.pool,
                            **({"kilonode.io/team": token.team} if token.team else {})},
                ),
                type="bootstrap.kubernetes.io/token",
                string_data=token_data(token, token_id, token_secret),
                opts=after_binding,
            )
        admins = {CLUSTER_ADMINS_BINDING: ("cluster-admin", pki.cluster_admins_group(args.admin_generation))}
        for binding, (role, group) in {**BINDINGS, **admins}.items():
            cluster_role_binding(binding, role, group, child, f"{name}-{binding.split(':', 1)[1]}")
        rbac.v1.ClusterRole(
            f"{name}-node-client-approver",
            metadata=meta.v1.ObjectMetaArgs(name=NODE_CLIENT_APPROVER_ROLE,
                                            labels={"app.kubernetes.io/managed-by": "kilonode"}),
            rules=[rbac.v1.PolicyRuleArgs(api_groups=[group], resources=[resource], verbs=list(verbs),
                                          resource_names=list(names) or None)
                   for group, resource, verbs, names in NODE_CLIENT_APPROVER_RULES],
            opts=child,
        )
        cluster_role_binding(NODE_CLIENT_APPROVER_ROLE, NODE_CLIENT_APPROVER_ROLE, defaults.NODE_CLIENT_APPROVER_USER,
                             child, f"{name}-node-client-approver-binding", kind="User")
        self._pool_table(name, args.tokens, child)
        self.register_outputs({})

    def _pool_table(self, name: str, tokens: Sequence[JoinTokenPlan], child: pulumi.ResourceOptions) -> None:
        labels = {"app.kubernetes.io/managed-by": "kilonode"}
        # No pod mounts it, so nothing to roll (kilonode.k8s.pods.CONFIG_DIGEST_ANNOTATION): the node
        # client approver GETs it through the API for every CSR it judges
        # (kilonode.node.node_client_approver.main Approver.pools), so a change applies at the next CSR.
        core.v1.ConfigMap(
            f"{name}-node-client-approver-pools",
            metadata=meta.v1.ObjectMetaArgs(name=POOLS_CONFIGMAP, namespace=POOLS_NAMESPACE, labels=labels),
            data={POOLS_KEY: pool_table(tokens)},
            opts=child,
        )
        rbac.v1.Role(
            f"{name}-node-client-approver-pools-reader",
            metadata=meta.v1.ObjectMetaArgs(name=NODE_CLIENT_APPROVER_ROLE, namespace=POOLS_NAMESPACE, labels=labels),
            rules=[rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["configmaps"], verbs=["get"],
                                          resource_names=[POOLS_CONFIGMAP])],
            opts=child,
        )
        rbac.v1.RoleBinding(
            f"{name}-node-client-approver-pools-reader-binding",
            metadata=meta.v1.ObjectMetaArgs(name=NODE_CLIENT_APPROVER_ROLE, namespace=POOLS_NAMESPACE, labels=labels),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="Role", name=NODE_CLIENT_APPROVER_ROLE),
            subjects=[rbac.v1.SubjectArgs(api_group=RBAC_GROUP, kind="User", name=defaults.NODE_CLIENT_APPROVER_USER)],
            opts=child,
        )
