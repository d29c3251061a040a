"""The in-cluster half of the Pulumi program (pulumi-kubernetes): a provider built from the
cluster's outputs, a readiness gate on the apiserver behind the load balancer, and the
objects a cluster needs before any node can join (`kilonode:k8s:*` components).

Sibling of kilonode.azure: neither imports the other; the composition root
(kilonode.azure.program) hands this layer the Azure side's outputs.
"""
