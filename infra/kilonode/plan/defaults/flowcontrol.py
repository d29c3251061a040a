"""API Priority and Fairness and the apiservers' concurrency."""

from __future__ import annotations

from kilonode.plan.defaults.network import LB_PROBE_INTERVAL_S, LB_PROBE_THRESHOLD

# API Priority and Fairness and the apiservers' concurrency (kilonode.k8s.flowcontrol,
# kilonode.render.control_plane apiserver_flags). Field notes: monitoring agents that LIST/poll
# the apiserver from every node drove 500 MB/s of reads from etcd; avoid DaemonSets that talk
# to the apiserver; alert on 429s. Today's mechanism: flowcontrol.apiserver.k8s.io/v1 (GA 1.29).
#
# Upstream's suggested priority levels and their nominalConcurrencyShares are an outside fact
# (the catalogue's kubernetes.apfBuiltinShares); the plan carries them (components).
# kilonode's two levels. Per-node agents (kube-proxy, cloud-node-manager: one ServiceAccount
# each for thousands of pods) would otherwise share workload-high with kube-scheduler and
# kube-controller-manager (the built-in kube-system-service-accounts schema); monitoring agents
# would share workload-low or global-default with every workload. Their shares are half and a
# quarter of workload-high's: a DaemonSet rollout over 10% of 7,500 nodes re-LISTs from the watch
# cache (a few seats for milliseconds each; never more than 15% of the level's seats per
# request: apf_controller.go l.886-892 at kubernetes-1.34.2), which ~160 seats per apiserver
# clear in well under a second; a monitoring fleet that LISTs from etcd is what the field
# notes warn of, and gets the smallest level.
APF_NODE_AGENTS_SHARES = 20
APF_MONITORING_SHARES = 10
# The levels' names (kilonode.k8s.flowcontrol creates them; the plan's join arithmetic reads
# their seats, kilonode.plan.resolve.joins).
APF_NODE_AGENTS_LEVEL = "kilonode-node-agents"
APF_MONITORING_LEVEL = "kilonode-monitoring"
APF_BOOTSTRAP_LEVEL = "kilonode-node-bootstrap"
# A joining node's first requests, made with the bootstrap token (user system:bootstrap:<id>,
# groups system:bootstrappers and system:authenticated: kubernetes/cluster-bootstrap
# util/secrets/secrets.go GetGroups l.92-94 "always include the default group", token/api/
# types.go l.87-91, at kubernetes-1.32.0 and -1.35.0; kubernetes/apiserver pkg/authentication/
# group/authenticated_group_adder.go l.56 at kubernetes-1.32.0 ... -1.35.0). No built-in
# FlowSchema names system:bootstrappers, so without a level of their own they fall to
# global-default (precedence 9900, default.go l.422-438 at kubernetes-1.34.2), beside every
# cluster admin and every user; and since every node uses the same token, ByUser makes the
# whole fleet's joins one flow there: a burst fills that flow's 6 queues of 50 (handSize x
# queueLengthLimit) and the rest is answered 429 and retried. Its own level gives joins their
# seats and deep queues, and takes none from the built-in levels (apiserver_inflight grows by
# its shares). What the token does (kubernetes/client-go util/certificate/csr/csr.go at
# kubernetes-1.35.0: RequestCertificateWithContext creates the CSR, l.141; WaitForCertificate
# LISTs it by name, l.185, then LISTs and WATCHes it, l.189-194; the same at kubernetes-1.32.0
# l.165-181): four requests, one after the other, per node, so a wave of N nodes holds at
# most N of them at once. Everything after (the node's client certificate: group system:nodes)
# is the kubelet's, in the built-in system-node-high and system-nodes schemas; the approval is
# kube-controller-manager's (workload-high).
# Shares: as monitoring's, the smallest: ~80 seats per apiserver at research-7500 serve a
# request that takes milliseconds; lends 90% (joins are rare: the level is idle most of the
# time); queues: one flow per token (8 of 8 queues: 3 bits x 8 <= 60), 128 each, so 1,024
# bootstrap requests per apiserver wait rather than fail -- a wave's whole burst, spread over
# the apiservers. A queued request waits at most a quarter of its deadline, 15 s of the
# apiserver's 60 s request timeout (kubernetes/apiserver pkg/server/filters/
# priority-and-fairness.go getRequestWaitContext l.419; pkg/server/config.go l.444), then 429.
APF_BOOTSTRAP_SHARES = 10
APF_BOOTSTRAP_LENDABLE_PERCENT = 90
APF_BOOTSTRAP_QUEUING = (8, 8, 128)
# After kilonode's other schemas, before global-default (9900), the only built-in schema that
# names these identities (through system:authenticated).
APF_BOOTSTRAP_PRECEDENCE = 870
# What each lends to other levels while idle (watches hold no seat once started, so agents are
# idle most of the time): half for node agents (kube-proxy keeps the data plane in step with
# Services; half its seats are always its own), 90% for monitoring, as upstream's own
# least-important level (workload-low) lends.
APF_NODE_AGENTS_LENDABLE_PERCENT = 50
APF_MONITORING_LENDABLE_PERCENT = 90
# Borrowing nothing: a busy agent fleet never holds more than its own nominal seats, however
# idle the control plane's levels look at that moment (nil would let it borrow up to the whole
# server limit: apf_controller.go l.868-872 at kubernetes-1.34.2).
APF_AGENTS_BORROWING_LIMIT_PERCENT = 0
# Queuing (queues, handSize, queueLengthLimit). Each ServiceAccount is one flow (ByUser), so
# all 7,500 kube-proxies share one flow: its room to wait is handSize x queueLengthLimit (800)
# per apiserver, beside ~160 seats that serve a cache LIST in milliseconds -- a 10% DaemonSet
# rollout sends about 1,500 LISTs and watch starts to each apiserver (750 pods x ~10 requests
# / 5), spread over the seconds the pods take to start; few flows (two agents) need few
# queues. Monitoring: upstream's suggested 64 x 6 x 50 (default.go
# system/node-high): many agents (each ServiceAccount or group member a flow) shuffle-sharded
# so one noisy agent fills its own queues only. Both within the shuffle-sharding limit
# ceil(log2(queues)) x handSize <= 60 bits (pkg/util/shufflesharding/shufflesharding.go l.24-36).
APF_NODE_AGENTS_QUEUING = (16, 8, 100)
APF_MONITORING_QUEUING = (64, 6, 50)
# matchingPrecedence (lower wins; ties by name: pkg/util/apihelpers/helpers.go l.95-102). After
# every built-in schema that names control-plane identities -- probes 2, system-leader-election
# 100, endpoint-controller 150 and workload-leader-election 200 (1.32/1.33 only),
# system-node-high 400, system-nodes 500, kube-controller-manager and kube-scheduler 800 -- so
# those requests keep their levels even from an identity also listed here; before the broad
# ones that would otherwise take these agents: kube-system-service-accounts 900 (kube-proxy,
# cloud-node-manager -> workload-high), service-accounts 9000 (monitoring ServiceAccounts ->
# workload-low), global-default 9900 (the group's members -> global-default).
APF_NODE_AGENTS_PRECEDENCE = 850
APF_MONITORING_PRECEDENCE = 860
# The hook for monitoring agents: ServiceAccounts in this namespace, or any identity in this
# group (a client certificate's O=, an OIDC groups claim). The group grants nothing (no RBAC
# names it); it only classifies requests.
MONITORING_NAMESPACE = "monitoring"
MONITORING_AGENTS_GROUP = "kilonode:monitoring-agents"

# --max-requests-inflight / --max-mutating-requests-inflight. With APF on (the default, and
# set), "This and --max-mutating-requests-inflight are summed to determine the server's total
# concurrency limit" (kubernetes/apiserver kubernetes-1.34.2 pkg/server/options/
# server_run_options.go l.350-360; pkg/server/options/feature.go l.77-85 hands the sum to
# utilflowcontrol.New). Upstream's own large-cluster sizing: kube-up raises them to 1500/500
# past 500 nodes and 3000/1000 past 3,000 (kubernetes/kubernetes cluster/gce/gci/
# configure-kubeapiserver.sh, start-kube-apiserver, "If the cluster is large, increase
# max-requests-inflight limit in apiserver", read at 0214969e); apiserver defaults 400/200
# (pkg/server/config.go l.442-443). kube-up has one apiserver; here the bracket is chosen by the
# nodes each apiserver carries with one of them down (a rolling restart): 7,500 / 4 = 1,875 ->
# 1500/500. Five apiservers then hold 10,000 seats (8,000 with one down), above what kube-up
# gives 5,000 nodes scaled to 7,500 (4,000 x 1.5 = 6,000).
APISERVER_INFLIGHT_BRACKETS = ((3000, 3000, 1000), (500, 1500, 500))  # (more than N nodes, reads, mutating)
APISERVER_INFLIGHT_DEFAULT = (400, 200)
# goaway-chance: behind the Azure load balancer an HTTP/2 client keeps one connection, so after
# a rolling restart every client stays on the apiservers that stayed up. "Min is 0 (off), Max is
# .02 (1/50 requests); .001 (1/1000) is a recommended starting point"; "Clusters with single
# apiservers, or which don't use a load balancer, should NOT enable this" (server_run_options.go
# l.367-371 at kubernetes-1.34.2, validated to [0, 0.02] at l.208): set only with 2+ apiservers.
APISERVER_GOAWAY_CHANCE = "0.001"
# shutdown-delay-duration: on stop the apiserver fails /readyz at once and keeps serving this
# long, "to allow load balancer to stop sending traffic to this server" (l.387-390): the load
# balancer needs LB_PROBE_INTERVAL_S x LB_PROBE_THRESHOLD = 10 s of failed probes, plus 5 s
# margin. With 2+ apiservers only (one apiserver has nowhere to send clients). The unit's stop
# timeout (systemd's default 90 s) covers it and the 60 s request timeout's drain.
APISERVER_SHUTDOWN_DELAY_S = LB_PROBE_INTERVAL_S * LB_PROBE_THRESHOLD + 5
