"""The cloud provider (kubernetes-sigs/cloud-provider-azure; releases and images: the
catalogue's cloudProviderAzure): cloud-controller-manager (load balancers for Services) and
cloud-node-manager (node initialization)."""

# Two replicas with leader election: one acts, the other takes over within a lease period.
CLOUD_CONTROLLER_MANAGER_REPLICAS = 2
# The helm chart's port (values.yaml securePort); hostNetwork pods share the node's ports, and
# 10268 is clear of the kubelet (10250), kube-proxy (10249, 10256) and the chart's CNM.
CLOUD_CONTROLLER_MANAGER_PORT = 10268
# A DaemonSet update over 7,500 nodes: 10% at a time, as kube-proxy.
CLOUD_NODE_MANAGER_MAX_UNAVAILABLE = "10%"
