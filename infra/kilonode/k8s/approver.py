"""ServingCertApprover: approves kubelet serving certificates (serverTLSBootstrap: true),
and nothing else, with postfinance/kubelet-csr-approver (flags read from its
internal/cmd/cmd.go, RBAC from its chart's clusterrole.yaml, at v1.2.14).

Its scope: the kubernetes.io/kubelet-serving signer only; the requester must be
system:node:<name> with the CSR's CN equal to it (the approver's own checks); the one DNS
name must match the pools' host names (`<cluster>-<pool>-NNN` + the 6 characters a scale set
appends); every IP must lie in a pool subnet. Two replicas with leader election.

Where it runs: the nodes the cluster's controllers run on (ClusterPlan.controller_pools: the
system pools, else the untainted shared pools), required, not preferred, and tolerating only the
system pool's CriticalAddonsOnly taint. Its ServiceAccount token can approve any kubelet's serving
certificate; a replica on a GPU node would hand it to whoever owns that node. It needs no node's
serving certificate to run (a kubelet runs pods without one), so it can wait for the system nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_kubernetes import apps, core, meta, rbac

from kilonode.k8s.bootstrap import KUBE_SYSTEM, RBAC_GROUP
from kilonode.k8s.pod_security import pod_security_context
from kilonode.k8s.pods import awaited, system_pod_spec, tolerate_critical_addons
from kilonode.plan import defaults
from kilonode.plan.model import AwaitsPlan
from kilonode.plan.wellknown import POOL_LABEL, SYSTEM_LABEL

APP = "kubelet-csr-approver"
LABELS = {"app.kubernetes.io/name": APP, "app.kubernetes.io/managed-by": "kilonode"}


@dataclass(frozen=True)
class ServingCertApproverArgs:
    cluster: str
    pools: Sequence[str]  # pool names
    pool_subnets: Sequence[str]  # CIDRs
    image: str  # the plan's (components)
    awaits: AwaitsPlan  # the plan's (components): how long `pulumi up` waits for the replicas
    # where its replicas may run: the plan's controller_pools, and whether they are system pools
    # (then selected by kilonode.io/system, as every system workload; else by pool name)
    replica_pools: Sequence[str] = ()
    system_pools: bool = False


def replica_affinity(args: ServingCertApproverArgs) -> core.v1.AffinityArgs:
    """Required node affinity to the pools its replicas may run on (ServingCertApproverArgs)."""
    if args.system_pools:
        requirement = core.v1.NodeSelectorRequirementArgs(key=SYSTEM_LABEL, operator="In", values=["true"])
    elif args.replica_pools:
        requirement = core.v1.NodeSelectorRequirementArgs(key=POOL_LABEL, operator="In",
                                                          values=sorted(args.replica_pools))
    else:
        raise ValueError("ServingCertApprover: no pool to run on (the plan's controller_pools is empty)")
    return core.v1.AffinityArgs(node_affinity=core.v1.NodeAffinityArgs(
        required_during_scheduling_ignored_during_execution=core.v1.NodeSelectorArgs(
            node_selector_terms=[core.v1.NodeSelectorTermArgs(match_expressions=[requirement])]),
    ))


def host_name_regex(cluster: str, pools: Sequence[str]) -> str:
    """Scale-set instance host names: computerNamePrefix (`<cluster>-<pool>-NNN`) + 6 base-36."""
    alternatives = "|".join(re.escape(p) for p in sorted(pools))
    return f"^{re.escape(cluster)}-({alternatives})-[0-9]{{3}}[0-9a-z]{{6}}$"


class ServingCertApprover(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingCertApproverArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("kilonode:k8s:ServingCertApprover", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        metadata = meta.v1.ObjectMetaArgs(name=APP, namespace=KUBE_SYSTEM, labels=LABELS)
        account = core.v1.ServiceAccount(f"{name}-sa", metadata=metadata, opts=child)
        role = rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{APP}", labels=LABELS),
            rules=[
                rbac.v1.PolicyRuleArgs(api_groups=["certificates.k8s.io"], resources=["certificatesigningrequests"],
                                       verbs=["get", "list", "watch"]),
                rbac.v1.PolicyRuleArgs(api_groups=["certificates.k8s.io"],
                                       resources=["certificatesigningrequests/approval"], verbs=["update"]),
                rbac.v1.PolicyRuleArgs(api_groups=["certificates.k8s.io"], resources=["signers"],
                                       resource_names=["kubernetes.io/kubelet-serving"], verbs=["approve"]),
                rbac.v1.PolicyRuleArgs(api_groups=["coordination.k8s.io"], resources=["leases"],
                                       verbs=["create", "get", "update"]),
                rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["events"], verbs=["create"]),
            ],
            opts=child,
        )
        rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=meta.v1.ObjectMetaArgs(name=f"kilonode:{APP}", labels=LABELS),
            role_ref=rbac.v1.RoleRefArgs(api_group=RBAC_GROUP, kind="ClusterRole", name=role.metadata.name),
            subjects=[rbac.v1.SubjectArgs(kind="ServiceAccount", name=account.metadata.name,
                                          namespace=KUBE_SYSTEM)],
            opts=child,
        )
        env = {
            "PROVIDER_REGEX": host_name_regex(args.cluster, args.pools),
            "PROVIDER_IP_PREFIXES": ",".join(args.pool_subnets),
            # Azure's internal DNS names are not the names kubelets put in their CSRs; the
            # subnet scope above carries the address check instead.
            "BYPASS_DNS_RESOLUTION": "true",
            # CSRs from other users (not system:node:) are someone else's to decide.
            "IGNORE_NON_SYSTEM_NODE": "true",
            # Serving certificates for one year at most, like the rest of the cluster's leaves.
            "MAX_EXPIRATION_SEC": str(defaults.LEAF_VALIDITY_HOURS * 3600),
        }
        apps.v1.Deployment(
            f"{name}-deployment",
            metadata=metadata,
            spec=apps.v1.DeploymentSpecArgs(
                replicas=2,
                selector=meta.v1.LabelSelectorArgs(match_labels={"app.kubernetes.io/name": APP}),
                template=core.v1.PodTemplateSpecArgs(
                    metadata=meta.v1.ObjectMetaArgs(labels=LABELS),
                    spec=system_pod_spec(
                        "cluster",
                        service_account=account,
                        system_pool=True,
                        # the system nodes alone (the module's docstring says why)
                        affinity=replica_affinity(args),
                        tolerations=tolerate_critical_addons(),
                        security_context=pod_security_context(run_as_non_root=True, run_as_user=65532),
                        containers=[core.v1.ContainerArgs(
                            name=APP,
                            image=args.image,
                            args=["-metrics-bind-address", ":8080", "-health-probe-bind-address", ":8081",
                                  "-leader-election"],
                            env=[core.v1.EnvVarArgs(name=k, value=v) for k, v in env.items()],
                            liveness_probe=core.v1.ProbeArgs(
                                http_get=core.v1.HTTPGetActionArgs(path="/healthz", port=8081)),
                            resources=core.v1.ResourceRequirementsArgs(
                                requests={"cpu": "10m", "memory": "64Mi"}, limits={"memory": "128Mi"}),
                            security_context=core.v1.SecurityContextArgs(
                                allow_privilege_escalation=False, read_only_root_filesystem=True,
                                capabilities=core.v1.CapabilitiesArgs(drop=["ALL"])),
                        )],
                    ),
                ),
            ),
            # its pods wait for the first pool node, still allocating on a first run
            opts=awaited(child, args.awaits),
        )
        self.register_outputs({})
