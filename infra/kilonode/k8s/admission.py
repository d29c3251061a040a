"""ValidatingAdmissionPolicy, one way for every component: a policy with its CEL rules on
creates and updates of one resource (core/v1 unless told), and a binding that denies
(admissionregistration.k8s.io/v1, GA in 1.30)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
from pulumi_kubernetes import admissionregistration, meta

# The user extra that names the node a pod-bound ServiceAccount token's pod runs on
# (kubernetes/apiserver@v0.34.10 pkg/authentication/serviceaccount/util.go:47 NodeNameKey;
# kilonode.k8s.node_agents says how it gets there): how a policy holds a per-node agent to its node.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def admission_policy(name: str, policy_name: str, resource: str | Sequence[str], rules: Sequence[tuple[str, str]],
                     labels: Mapping[str, str], opts: pulumi.ResourceOptions,
                     group_version: tuple[str, str] = ("", "v1"),
                     variables: Mapping[str, str] | None = None) -> None:
    """A ValidatingAdmissionPolicy with `rules` (CEL expression, message) on creates and updates
    of `resource` (or several: a subresource is matched only where named, "nodes/status") in
    `group_version` (API group, version; core/v1 by default), and its binding that denies.
    `variables` (name -> CEL), in order, are what the rules call `variables.<name>`."""
    policy = admissionregistration.v1.ValidatingAdmissionPolicy(
        f"{name}-policy",
        metadata=meta.v1.ObjectMetaArgs(name=policy_name, labels=dict(labels)),
        spec=admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
            failure_policy="Fail",
            match_constraints=admissionregistration.v1.MatchResourcesArgs(resource_rules=[
                admissionregistration.v1.NamedRuleWithOperationsArgs(
                    api_groups=[group_version[0]], api_versions=[group_version[1]], operations=["CREATE", "UPDATE"],
                    resources=[resource] if isinstance(resource, str) else list(resource),
                ),
            ]),
            variables=[admissionregistration.v1.VariableArgs(name=key, expression=value)
                       for key, value in (variables or {}).items()] or None,
            validations=[admissionregistration.v1.ValidationArgs(expression=rule, message=message,
                                                                 reason="Forbidden") for rule, message in rules],
        ),
        opts=opts,
    )
    admissionregistration.v1.ValidatingAdmissionPolicyBinding(
        f"{name}-binding",
        metadata=meta.v1.ObjectMetaArgs(name=policy_name, labels=dict(labels)),
        spec=admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
            policy_name=policy.metadata.name, validation_actions=["Deny"],
        ),
        opts=opts,
    )
