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
