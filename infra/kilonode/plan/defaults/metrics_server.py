"""metrics-server, the resource metrics API (its image: the catalogue's metricsServer; its sizing
figures: the catalogue's limits, metricsServer)."""

# Two replicas, as upstream's high-availability manifest runs it (manifests/components/
# high-availability at v0.8.0: replicas 2, required anti-affinity on the host name, a PDB keeping
# one): the apiservers serve metrics.k8s.io only while one replica answers, and while none does
# every API discovery lists the group as unavailable, which stops the namespace controller from
# deleting namespaces and the garbage collector from finishing (both refuse to act on a partial
# discovery) besides `kubectl top` and every HorizontalPodAutoscaler.
METRICS_SERVER_REPLICAS = 2
# How often it scrapes every kubelet's /metrics/resource: upstream's manifest's 15 s (its README:
# "collecting metrics every 15 seconds"); each scrape must finish within it (pkg/server/server.go
# tick: the context's timeout is the resolution).
METRICS_SERVER_RESOLUTION_S = 15
