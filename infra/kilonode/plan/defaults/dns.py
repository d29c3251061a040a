"""Cluster DNS (CoreDNS; its image: the catalogue's coredns)."""

# Cluster DNS (CoreDNS). The 2,500-node post: packing put 10+ kube-dns pods on one node and
# exceeded the VM's ~200 QPS limit for external lookups, so replicas need *required* pod
# anti-affinity on kubernetes.io/hostname (each one's external lookups leave from its own
# VM). Replicas: one per DNS_NODES_PER_REPLICA nodes, at least 2 -- at one external lookup
# per node every 5 s, 250 nodes need 50 QPS: a quarter of one VM's limit, headroom for bursts.
DNS_NODES_PER_REPLICA = 250
DNS_MIN_REPLICAS = 2
