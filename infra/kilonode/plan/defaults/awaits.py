"""How long `pulumi up` waits for the in-cluster workloads it waits for (the plan's
components.awaits, decided by kilonode.plan.resolve.components.awaits_plan; the modules of
kilonode.k8s give it as `customTimeouts`).

pulumi-kubernetes awaits a Deployment until every replica of its new ReplicaSet is available
and a Service until it has a ready endpoint, 10 minutes by default
(provider/pkg/await/deployment.go `DefaultDeploymentTimeoutMins = 10`, service.go
`DefaultServiceTimeoutMins = 10`, await.go `timeout := 10 * time.Minute` unless
`customTimeouts` or the `pulumi.com/timeoutSeconds` annotation says otherwise: metadata/
overrides.go TimeoutDuration; v4.32.0). Those 10 minutes assume the pods' nodes exist. On a
first `pulumi up` the in-cluster objects are created as soon as the apiservers answer, while
the scale sets, the system pool's included, are still allocating: the wait must hold a node's
whole way to Ready as well. A Deployment's own progressDeadlineSeconds (600 s by default) does
not end the wait earlier: past it the controller sets Progressing=False
(ProgressDeadlineExceeded), which the awaiter reports as a warning and keeps waiting, and sets
it back to NewReplicaSetAvailable once the replicas are available (deployment.go
processDeploymentEvent, v4.32.0).
"""

# pulumi-kubernetes's own wait for a Deployment, DaemonSet, StatefulSet or Service without
# customTimeouts (the module docstring's sources): what `kilonode preflight` holds a workload
# to when the graph gives it none.
PROVIDER_DEFAULT_AWAIT_MIN = 10
# The part of the wait after a pod's node is Ready: scheduling, the image pull (the boot
# images a pool image does not carry come from public registries through the pool's NAT
# gateway, every node of a first run at once: `kilonode preflight`'s boot-pulls), start and
# readiness probe. pulumi-kubernetes's own default for the whole wait, kept for this part.
WORKLOAD_START_MIN = PROVIDER_DEFAULT_AWAIT_MIN

# One step of a rolling update that replaces pods one at a time (maxUnavailable 1, maxSurge 0:
# CoreDNS, whose replicas grow with the cluster): the old pod's 30 s grace period (the
# Kubernetes default; CoreDNS's lameduck is 5 s), then up to 60 s for its replacement to be
# scheduled, pull the new image and pass its readiness probe (every 10 s).
ROLLOUT_STEP_S = 90
