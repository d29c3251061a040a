"""How fast nodes may join (kilonode.plan.resolve.joins): the estimates the join arithmetic
rests on. Field notes: adding hundreds of nodes at once overloads the apiservers; grow gradually."""

# The requests one node's join sends to the apiservers, from its first CSR to its DaemonSet
# pods running: the bootstrap token's CSR (4, kilonode.plan.defaults.flowcontrol), the
# kubelet's Node registration, first status and Lease (~6), its informers' LIST + WATCH of its
# pods, its Node, Services, CSIDrivers and RuntimeClasses (~10), its serving CSR (~4), per
# DaemonSet pod (kube-proxy, cloud-node-manager, the device plugins, the GPU health agent:
# up to 5 on a GPU node) a ServiceAccount token, the kube-root-ca.crt ConfigMap's LIST + WATCH
# and status updates (~5 each, ~25), kube-proxy's LIST + WATCH of Services, EndpointSlices and
# its Node (6), cloud-node-manager's Node reads and writes (~3), a few Events. About 60: an
# estimate by counting, not a measurement.
JOIN_REQUESTS_PER_NODE = 60
# How long a request holds its seat, at most: the Kubernetes SLO's p99 for mutating API calls
# (1 s; shared/docs/limits-and-modern-equivalents.md). Most join requests are cache reads that
# take milliseconds; taking the SLO's bound keeps the rate on the safe side.
JOIN_SEAT_SECONDS = 1
# The share of the join levels' seats (node-high, system, kilonode-node-agents,
# kilonode-node-bootstrap, on the apiservers left with one down) that joins may take: the
# running fleet keeps the rest (every kubelet renews its Lease in node-high every 10 s).
JOIN_SEAT_SHARE_PERCENT = 10
# A wave's nodes are allocated and boot together, so their joins arrive within about a minute:
# a wave holds one interval's worth of joins at the rate the apiservers are sized for, and the
# waves start one interval apart (a timer per wave, kilonode.azure.join_waves), so the joins
# arrive at that rate. The one home of the interval: the wave's size (wave_nodes) and the
# timers' sleeps (wave_gaps_s) are both derived from it.
JOIN_WAVE_INTERVAL_S = 60
# How long Azure takes to create one wave's scale sets (the scale set's create operation, from
# allocation to every VM provisioned): the waves' joins land about this long after their start.
# An assumption, not a measurement: only Azure shows it, per size and region.
SCALE_SET_CREATE_MIN = 10
# The most waves whose scale sets are being created at once: a wave also waits until the wave
# this many before it is created. At the assumed creation time that is exactly as many as the
# timers start meanwhile (10 min / 1 min), so the bound costs a bring-up that goes as assumed
# nothing; when Azure is slower, the later waves stop starting instead of piling up behind the
# slow one, so at most this many waves' VMs boot together. A tighter bound (2) would cap the
# pace at 2 waves per creation time (about 60 nodes/min at research-7500, a 2 h 40 min
# bring-up), not the rate the apiservers are sized for.
JOIN_WAVES_IN_FLIGHT = -(-SCALE_SET_CREATE_MIN * 60 // JOIN_WAVE_INTERVAL_S)
