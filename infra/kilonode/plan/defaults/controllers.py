"""The control plane's own API clients: kube-controller-manager's and kube-scheduler's QPS and burst
(kilonode.plan.resolve.clients sizes them from the plan's node joins; kilonode.render.control_plane writes them).

Upstream's defaults (catalogue limits.yaml kubernetes.controllerManagerQps/Burst, schedulerQps/Burst, with
their sources), and why they do not hold at this size:

- kube-controller-manager --kube-api-qps 20, --kube-api-burst 30. With --use-service-account-credentials
  (kilonode sets it) each controller builds its own client from that configuration
  (clientbuilder.SAControllerClientBuilder: a client per controller name), so the rate is per controller:
  the DaemonSet controller alone creates every DaemonSet pod of every joining node at that rate. At
  research-7500 that is 7 pods a GPU node, 52,520 for 7,504 nodes: 44 minutes at 20 a second, where the
  join waves end in 24.
- kube-scheduler clientConnection.qps 50, burst 100: every DaemonSet pod is bound by the default scheduler
  (a binding POST each), so it binds the same fan-out.
"""

from __future__ import annotations

# kilonode's judgement: twice the joins' DaemonSet fan-out, for the retries of refused requests, the
# DaemonSets' status writes and the workload pods a bring-up starts beside them.
CLIENT_HEADROOM = 2
# Rounded up to a multiple of this, so that a pool grown by a few scale sets does not move the flags (they
# are in the apiservers' custom data: a change replaces each apiserver VM, one at a time).
CLIENT_QPS_STEP = 50
# burst: a second's worth of requests beyond the rate, as upstream's own defaults (30/20, 100/50) hold
CLIENT_BURST_RATIO = 2
