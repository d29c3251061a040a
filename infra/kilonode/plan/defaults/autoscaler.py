"""The cluster autoscaler (kilonode.k8s.autoscaler) on pools with `autoscaling` (Azure VMSS);
releases and image: the catalogue's clusterAutoscaler."""

from kilonode.plan.defaults.node import NODE_READY_MIN

# Two replicas, one active (leader election on a Lease): the other takes over within the
# lease period when a node goes away.
CLUSTER_AUTOSCALER_REPLICAS = 2
# Its FAQ ("What are the Service Level Objectives"): "request full 1 core ... for CA pod in
# bigger clusters". Memory: it keeps every Node and Pod in informers plus a simulated copy
# of the cluster each loop; 2 GiB requested, 8 GiB at most, for ~7,500 nodes is an estimate,
# not a measurement. No CPU limit: a throttled loop is the FAQ's "overloaded node".
CLUSTER_AUTOSCALER_REQUESTS = {"cpu": "1", "memory": "2Gi"}
CLUSTER_AUTOSCALER_LIMITS = {"memory": "8Gi"}
# --address (its default :8085): /metrics and /health-check. hostNetwork, so the port is the
# node's; clear of the kubelet (10250), kube-proxy (10249, 10256) and the CCM (10268).
CLUSTER_AUTOSCALER_PORT = 8085
# Gradual scale-up (field notes: adding hundreds of nodes at once overloads the apiservers).
# What the autoscaler can and cannot bound, read at every pinned tag (cluster-autoscaler-1.32.7
# main.go, -1.33.6/-1.34.5/-1.35.2 config/flags/flags.go; the lines in tests/k8s/
# test_autoscaler.py):
# - --max-nodes-per-scaleup: "Max nodes added in a single scale-up. This is intended strictly
#   for optimizing CA algorithm latency and not a tool to rate-limit scale-up throughput." One
#   scale-up adds at most one InfiniBand scale set's worth (100, a placement group), and never
#   more than one wave of the plan's joins (kilonode.plan.resolve.joins: the lower of the two,
#   kilonode.k8s.autoscaler), so one scale-up's nodes boot no more at once than a wave's.
# - Not a rate: after a scale-up the next loop starts at once (loop/trigger.go l.78-80,
#   "starts new iteration immediately if the previous one was productive"), so --scan-interval
#   does not space scale-ups, and neither does --new-pod-scale-up-delay (pods left pending
#   after one scale-up are already older than any delay); both left at upstream's defaults
#   (10s, 0s), which keep a gang's scale-up prompt.
# - --parallel-scale-up=false (upstream's default, stated): one loop scales one pool's node
#   groups, not several pools at once, each up to --max-nodes-per-scaleup.
# - --max-node-startup-time exists at 1.35.2 only (flags.go l.128), so it is not passed.
# - What bounds a burst: each pool's node groups' max sizes (a pool grows at most from its floor,
#   half its nodes, to its ceiling), and the apiservers' APF levels, which queue the joins
#   (kilonode.k8s.flowcontrol). --max-total-unready-percentage (below) halts scale-up too, but
#   only once joined nodes stay unready: nodes younger than 15 min count as starting.
CLUSTER_AUTOSCALER_MAX_NODES_PER_SCALEUP = 100
CLUSTER_AUTOSCALER_PARALLEL_SCALE_UP = False
# A new VM's way to a Ready node (NODE_READY_MIN, kilonode.plan.defaults.node, which `pulumi
# up`'s awaits are sized from too). Upstream's 15m is for ordinary VMs.
CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME = f"{NODE_READY_MIN}m"
# The 2,500-node guard (field notes: an etcd outage failed every node's health check and the
# autoscaler tried to remove the fleet). It halts all activity while more than this share of
# the cluster's nodes (and more than the count below) is unready; upstream's 45% lets a
# partial outage (a zone, a third of the fleet) go on scaling down. 10% of 7,500 is 750 nodes:
# far above the GPU faults a healthy fleet carries, far below an outage.
CLUSTER_AUTOSCALER_MAX_TOTAL_UNREADY_PERCENTAGE = 10
# Upstream's 3, kept: the count only matters below 30 nodes (3 = 10% of 30), where one or two
# unready nodes must not stop every scale-up; at this toolkit's scale the percentage decides.
CLUSTER_AUTOSCALER_OK_TOTAL_UNREADY_COUNT = 3
# How much one loop removes (the node groups' min sizes keep every pool at half or more):
# at most 10 nodes being deleted at once (upstream's default, stated), of which at most one
# drained (evicting a pod of an MPI job restarts the whole job; field notes).
CLUSTER_AUTOSCALER_MAX_SCALE_DOWN_PARALLELISM = 10
CLUSTER_AUTOSCALER_MAX_DRAIN_PARALLELISM = 1
# One pod per GPU node (field notes): a node is a scale-down candidate only when no pod on it
# requests a GPU (GPU nodes are judged on GPUs alone) or, on nodes without GPUs, when no pod
# requests CPU or memory; DaemonSet pods do not count (--ignore-daemonsets-utilization). The
# scheduler packs nodes, so idle capacity shows as empty nodes; the autoscaler removes those
# and never evicts running work to consolidate half-used nodes (upstream's 0.5 would drain a
# node running a 4-GPU job). Not 0: older releases kept a node while its utilization was at or
# above the threshold (eligibility.go isNodeBelowUtilizationThreshold: `if utilInfo.Utilization >=
# threshold { return false }`), so at 0 not even an empty node was removable (the 7th independent
# trace of issue 38 read it there); the pinned releases carry the fix ("Fix scale-down eligibility
# when utilization and threshold are zero": isNodeAtOrBelowUtilizationThreshold keeps a node only
# while its utilization is above the threshold), under which 0 would work too. One millionth works
# under both: below any request a pod can make of a node (1 GPU of 8 is 0.125; 1m of CPU of a
# 96-core node is about 0.00001), above an empty node's 0.
CLUSTER_AUTOSCALER_SCALE_DOWN_UTILIZATION_THRESHOLD = "0.000001"
CLUSTER_AUTOSCALER_SCALE_DOWN_GPU_UTILIZATION_THRESHOLD = "0.000001"
# A GPU node idle for less than it takes to get one back (provision time) is churn: jobs
# arrive in bursts (field notes: a new job creates hundreds of pods at once).
CLUSTER_AUTOSCALER_SCALE_DOWN_UNNEEDED_TIME = "30m"
# No scale-down while the nodes of the last scale-up may still be on their way.
CLUSTER_AUTOSCALER_SCALE_DOWN_DELAY_AFTER_ADD = CLUSTER_AUTOSCALER_MAX_NODE_PROVISION_TIME
# Verbosity: its FAQ ("How can I increase the information that the CA is logging?"): 0 or 1
# suffices to follow its activity; more slows it past 1,000 nodes.
CLUSTER_AUTOSCALER_VERBOSITY = 1
