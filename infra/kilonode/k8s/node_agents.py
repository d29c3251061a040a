"""The per-node agents whose ServiceAccount may write Node objects, what each writes on its own
Node (read at the pinned tags), and the CEL that holds each to that (kilonode.k8s.capacity puts
it in the `kilonode-node-identity` ValidatingAdmissionPolicy).

Why: each agent runs on every node (a DaemonSet) with its token mounted, and its ClusterRole
may write every Node (one ClusterRole cannot name each node). NodeRestriction governs only the
system:node: users (kubernetes plugin/pkg/admission/noderestriction/admission.go, Admit: a
request whose user is not a node is passed untouched). So root on any GPU node reads the token
and may taint, cordon or re-address every other node (issue 37).

How the policy knows the pod's node: a token the kubelet mounts is bound to the pod (a projected
serviceAccountToken, TokenRequest with boundObjectRef Pod), and since ServiceAccountTokenPodNodeInfo
(alpha 1.29, beta and on by default 1.30, GA and locked on 1.32: kubernetes/kubernetes
pkg/features/kube_features.go) the apiserver writes the pod's node into the token's private claims
(pkg/registry/core/serviceaccount/storage/token.go, Create: pod.Spec.NodeName looked up;
pkg/serviceaccount/claims.go, Claims: `pc.Kubernetes.Node`), and the authenticator hands it on as
the user's extra `authentication.kubernetes.io/node-name` (kubernetes/apiserver@v0.34.10
pkg/authentication/serviceaccount/util.go:47 NodeNameKey, :150-156 ServiceAccountInfo.UserInfo).
A ValidatingAdmissionPolicy's CEL sees it as `request.userInfo.extra`, a map of string to list of
string (kubernetes/apiserver@v0.34.10 pkg/admission/plugin/cel/compile.go:69-74 userInfoType;
condition.go:137-140 copies every extra). A token not bound to a pod (a legacy Secret token, a
TokenRequest for no pod) carries no such extra, and is refused.

A PATCH is admitted as an UPDATE (kubernetes/apiserver@v0.34.10 pkg/endpoints/handlers/patch.go:186-194
staticUpdateAttributes, admission.Update), so a policy matching UPDATE sees both.
"""

from __future__ import annotations

from dataclasses import dataclass

from kilonode.k8s.admission import NODE_NAME_EXTRA
from kilonode.k8s.bootstrap import KUBE_SYSTEM
from kilonode.k8s.calico import NODE as CALICO_NODE
from kilonode.k8s.cloud_provider import CNM
from kilonode.k8s.pods import UNINITIALIZED_TAINT


@dataclass(frozen=True)
class NodeAgent:
    namespace: str
    account: str
    # taints it may remove from its Node (and never add); every other taint stays as it was
    removes_taints: tuple[str, ...] = ()
    # whether it may set spec.providerID where the Node has none (never change one that is set)
    sets_provider_id: bool = False

    @property
    def user(self) -> str:
        """The user the apiserver names the agent's requests by."""
        return f"system:serviceaccount:{self.namespace}:{self.account}"


# What each writes on its own Node, read at the pinned tags: the record a reader audits, and the
# rules below allow no more.
NODE_AGENTS: tuple[NodeAgent, ...] = (
    # cloud-node-manager, kubernetes-sigs/cloud-provider-azure@v1.34.13:
    # - initializeNode, once, a GET then an UPDATE of nodes (pkg/nodemanager/nodemanager.go:372-425):
    #   spec.providerID where it is empty (:453-459), the cloud's labels -- instance type, zone,
    #   region, platform sub-fault domain, interconnect group (:480-532, addCloudNodeLabel) -- and the
    #   uninitialized taint removed (:411-412, excludeCloudTaint :546-554);
    # - updateNodeAddress, a PATCH of nodes/status (:262-319, PatchNodeStatus :729): status.addresses.
    NodeAgent(KUBE_SYSTEM, CNM, removes_taints=(UNINITIALIZED_TAINT,), sets_provider_id=True),
    # calico-node, projectcalico/calico@v3.31.7:
    # - its Calico Node kept in the Node's annotations and labels, an UPDATE of nodes/status
    #   (libcalico-go/lib/backend/k8s/resources/node.go:84-98, mergeCalicoNodeIntoK8sNode then UpdateStatus);
    # - the NetworkUnavailable condition, a PATCH of nodes/status (node/pkg/lifecycle/utils/utils.go:195-226).
    # A nodes/status write cannot change spec (kubernetes pkg/registry/core/node/strategy.go,
    # nodeStatusStrategy.PrepareForUpdate: newNode.Spec = oldNode.Spec); the rules
    # below hold its taints and unschedulable anyway, should its role ever grant nodes.
    NodeAgent(KUBE_SYSTEM, CALICO_NODE),
)
AGENT_USERS = tuple(agent.user for agent in NODE_AGENTS)
_AGENT = f"request.userInfo.username in [{', '.join(repr(u) for u in AGENT_USERS)}]"


def _taints(node: str) -> str:
    return f"(has({node}.spec.taints) ? {node}.spec.taints : [])"


def _lifts(taint: str) -> str:
    """CEL: whether the requesting agent may remove taint `taint` (a comprehension's variable)."""
    terms = [f"(request.userInfo.username == {agent.user!r} && {taint}.key in "
             f"[{', '.join(repr(k) for k in agent.removes_taints)}])" for agent in NODE_AGENTS if agent.removes_taints]
    return f"({' || '.join(terms) or 'false'})"


# CEL: an agent writes only the Node its pod runs on, and only by UPDATE (or PATCH, admitted as
# one: no agent's role may create a Node).
OWN_NODE_RULE = (
    f"!({_AGENT}) || (request.operation == 'UPDATE' && has(request.userInfo.extra) && "
    f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
    f"request.userInfo.extra['{NODE_NAME_EXTRA}'] == [object.metadata.name])"
)

# CEL: on its own Node an agent leaves spec.unschedulable and every taint as they were, except
# that it may remove the taints it lifts (never add one, nor change one it keeps); it may set
# spec.providerID only where there was none. Each comparison is one pass over the taints (no
# nested loop), so the cost stays linear in a Node's taints.
_SAME_UNSCHEDULABLE = (
    "(has(object.spec.unschedulable) && object.spec.unschedulable) == "
    "(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable)"
)
_KEPT_TAINTS = (
    f"{_taints('object')}.filter(t, !{_lifts('t')}) == {_taints('oldObject')}.filter(t, !{_lifts('t')}) && "
    f"({_taints('object')}.filter(t, {_lifts('t')}) == [] || "
    f"{_taints('object')}.filter(t, {_lifts('t')}) == {_taints('oldObject')}.filter(t, {_lifts('t')}))"
)
_PROVIDER_ID_SETTERS = [agent.user for agent in NODE_AGENTS if agent.sets_provider_id]
_PROVIDER_ID = (
    "(has(object.spec.providerID) ? object.spec.providerID : '') == "
    "(has(oldObject.spec.providerID) ? oldObject.spec.providerID : '') || "
    f"(request.userInfo.username in [{', '.join(repr(u) for u in _PROVIDER_ID_SETTERS)}] && "
    "(!has(oldObject.spec.providerID) || oldObject.spec.providerID == ''))"
)
NODE_SPEC_RULE = (
    f"!({_AGENT}) || request.operation != 'UPDATE' || "
    f"({_SAME_UNSCHEDULABLE} && ({_PROVIDER_ID}) && {_KEPT_TAINTS})"
)
