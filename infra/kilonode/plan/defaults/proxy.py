"""kube-proxy (its image: the catalogue's kubeProxy, at the cluster's own version)."""

# kube-proxy in nftables mode (GA in 1.33, beta and on by default in 1.32): a Service or
# endpoint change is an incremental nftables update, where iptables mode re-writes the
# whole ruleset (cost grows with services x endpoints, which at 7,500 nodes means multi-
# second syncs), and IPVS mode is the one upstream now steers away from (KEP-3866,
# "Add an nftables-based kube-proxy backend"). Local traffic is what comes from Azure CNI's
# pod interfaces, named azv* (AKS runs kube-proxy with the same InterfaceNamePrefix=azv).
KUBE_PROXY_MODE = "nftables"
KUBE_PROXY_POD_INTERFACE_PREFIX = "azv"
# A DaemonSet update over 7,500 nodes: 10% at a time, not one node after another.
KUBE_PROXY_MAX_UNAVAILABLE = "10%"
# Its readiness: /livez on the health port (healthzBindAddress, loopback), which answers 503 once an update
# has been queued longer than its health timeout without a sync (kubernetes/kubernetes pkg/proxy/healthcheck
# proxy_health.go: ProxyHealthServer.Health, /livez without /healthz's node-eligibility part, so a node
# tainted ToBeDeletedByClusterAutoscaler keeps its kube-proxy ready; the search index's copy of the 1.3x
# line). A kube-proxy that runs but no longer programs the node's rules is then not ready: the DaemonSet
# counts it unavailable and KilonodeDaemonSetPodsUnavailable says so, where before it stayed "available".
# The kubelet probes from the host's network namespace, so 127.0.0.1 reaches the loopback listener.
KUBE_PROXY_HEALTH_HOST = "127.0.0.1"
KUBE_PROXY_HEALTH_PORT = 10256
KUBE_PROXY_READY_PATH = "/livez"
# checked every 10 s, not ready after 3 failures: 30 s on top of kube-proxy's own timeout
KUBE_PROXY_READY_PERIOD_S = 10
KUBE_PROXY_READY_FAILURES = 3
