"""The Pulumi program for Azure: one ComponentResource per subsystem, fed by the plan.

    Cluster ── Network · Tls · NodeImage · EtcdCluster(main) · EtcdCluster(events)
               · ControlPlane · GpuNodePool (one per pool) · JoinWaves (their timers)

Components take every name, address and count from `ClusterPlan` and every host file from
`render_cluster`; they compute none. Nothing is created inside `apply`. `mockplan` runs the
same program under Pulumi's mock engine (`kilonode plan`), so the resource graph can be read
and tested without Azure credentials.
"""
