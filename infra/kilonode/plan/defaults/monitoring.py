"""The cluster's Prometheus (kilonode.k8s.monitoring): what it is estimated to hold and how its
flags are sized (kilonode.plan.resolve.monitoring). Prometheus' own figures (bytes per series and
per sample, the retention-size share) are outside facts: kilonode.catalog limits.yaml `prometheus`.

The per-target series counts below are ESTIMATES, not measurements: they decide the VM size and
the scrape interval before any cluster exists. Replace one with what a running cluster shows
(`count by (job) ({__name__=~".+"}) / count by (job) (up)` in its Prometheus) when it differs.
"""

from __future__ import annotations

# Where the ConfigMap (kilonode.k8s.monitoring) is mounted in the Prometheus pod, and the file in
# it Prometheus runs: the renderer writes the paths into prometheus.yml, the pod mounts them.
PROMETHEUS_CONFIG_DIR = "/etc/prometheus/kilonode"
PROMETHEUS_CONFIG_FILE = "prometheus.yml"
# Namespaces Prometheus discovers pods and EndpointSlices in (a Role in each, not a cluster-wide
# watch of every pod): cluster-autoscaler's, and kube-state-metrics's (kilonode.k8s.exporters, kube-system).
PROMETHEUS_DISCOVERY_NAMESPACES = ("kube-system", "monitoring")

# --- series per target (estimates) --------------------------------------------------------------
# The kubelet's own /metrics once kilonode.render.monitoring drops its per-operation histograms
# and feature-gate series: Go and process runtime (~60), the PLEG, pod-start and pod-worker
# histograms (a few hundred), workqueue and cgroup-manager series, per-volume stats. 1,200 leaves
# room for a kubelet with many volumes.
PROMETHEUS_SERIES_PER_KUBELET = 1_200
# cAdvisor through the kubelet, trimmed to the kept families (render.monitoring CADVISOR_KEPT:
# CPU, working set, OOM events), one series each per container; pod-level cgroups and pause
# containers are dropped. Containers per node: the pool's maxPods (one container per pod).
PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER = 3
# kube-state-metrics: per Node object its conditions x statuses, capacity/allocatable per resource,
# labels, taints, info (~40); per Pod its phase, conditions, container states, requests and limits
# (~25), which kilonode's kube-state-metrics does not export (no pods in --resources,
# kilonode.plan.defaults.exporters): the plan counts the per-node figure here (and kube-system's DaemonSets and
# Deployments once: kilonode.plan.resolve.monitoring ksm_workload_series); the review's load
# figure (kilonode.review.alerting) still counts a kube-state-metrics that exports pods.
PROMETHEUS_KSM_SERIES_PER_NODE = 40
PROMETHEUS_KSM_SERIES_PER_POD = 25
# Per-pod network accounting (kilonode.render.pod_traffic), per node: bytes and packets in each
# direction per pod address's owner (4 per pod, maxPods pods), and the node's three gauges (state
# readable, endpoints skipped, addresses). Exact, from the program's own output.
PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD = 4
PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE = 3
# The GPU health agent (kilonode.gpu.metrics), on GPU nodes only: per node its fixed series (record
# readable, first start, two check times, six check results, three condition statuses, GPUs seen
# and expected, driver info, last report, errors: exact, from the program's own output with both
# checks done) and three active-check figures per GPU (exact); its findings are one series per
# rule seen in the last check, which on a healthy node is none or a recorded-only one or two (an
# idle PCIe link, an application's Xid): an estimate.
PROMETHEUS_GPU_AGENT_SERIES_PER_NODE = 18
PROMETHEUS_GPU_AGENT_SERIES_PER_GPU = 3
PROMETHEUS_GPU_AGENT_FINDING_SERIES = 2
# The GPU health taint controller on one apiserver VM (kilonode.gpu.metrics): exact.
PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER = 17
# One apiserver once APISERVER_DROPPED is dropped: apiserver_request_total (verb x resource x code),
# the request SLI histogram kept for the latency objective (resource x verb x scope x ~20 buckets),
# APF, admission and storage series: tens of thousands at a cluster with many resource types.
PROMETHEUS_SERIES_PER_APISERVER = 30_000
# One kube-scheduler (nothing dropped): its own histograms dominate once it has led, and a former
# leader keeps them until it restarts, so every target is counted as a leader.
# plugin_execution_duration_seconds (plugin x extension point x status, 20 buckets + sum + count;
# ~18 plugins of the default profile at ~3 extension points each, Success and one failure status:
# ~2,400), framework_extension_point_duration_seconds (14 points x status, 12 buckets: ~400),
# pod_scheduling_sli_duration_seconds (attempts x 20 buckets), the scheduling attempt and
# permit histograms, then client-go's rest_client_* and workqueue_* and the Go runtime (~1,000).
# Bucket counts and labels: kubernetes pkg/scheduler/metrics/metrics.go.
PROMETHEUS_SERIES_PER_SCHEDULER = 5_000
# One kube-controller-manager (nothing dropped): workqueue_* per queue (adds, depth, retries,
# unfinished and longest-running, queue and work duration histograms of 10 buckets: ~30 series)
# over ~60 controller queues (~1,800), client-go's rest_client_* by verb and code, the node
# lifecycle, EndpointSlice, garbage-collector and job controllers' own series and the Go runtime.
PROMETHEUS_SERIES_PER_CONTROLLER_MANAGER = 5_000
# One etcd member: grpc_server_handled_total per method x code dominates, then the disk and
# backend histograms.
PROMETHEUS_SERIES_PER_ETCD_MEMBER = 1_500
# One control-plane host's certificate-expiry answer (kilonode.render.cert_metrics): one series per
# certificate file on the host.
PROMETHEUS_SERIES_PER_CERT_TARGET = 20
# One cluster-autoscaler replica: its function-duration histograms and per-node-group series.
PROMETHEUS_SERIES_PER_AUTOSCALER = 1_000
# Prometheus's own /metrics, scraped by itself (kilonode.render.monitoring, job kilonode-prometheus) and kept to
# these names, each with what it counts (PROMETHEUS_SELF_PER: one series, one per rule group, one per type or per
# Alertmanager), so that the plan's figure follows the list. Names at prometheus/prometheus v3.5.5: tsdb/head.go
# l.404 (head_series), l.442 (wal_corruptions_total), l.450 (head_samples_appended_total{type}), l.470
# (head_truncations_failed_total); tsdb/wlog/wlog.go l.251, l.263, l.267 under the prefix prometheus_tsdb_wal_
# (l.321: truncations_failed_total, writes_failed_total, storage_size_bytes); tsdb/db.go l.344
# (compactions_failed_total), l.374 (storage_blocks_bytes); cmd/prometheus/main.go l.128
# (config_last_reload_successful); rules/group.go l.949-1000 ({rule_group}: rule_group_iterations_missed_total,
# rule_evaluation_failures_total, rule_group_interval_seconds, rule_group_last_duration_seconds);
# notifier/metric.go l.42-74 (notifications_errors_total{alertmanager}, _dropped_total, _queue_length,
# _queue_capacity, notifications_alertmanagers_discovered); client_golang's process collector
# (process_resident_memory_bytes), which Prometheus registers.
PROMETHEUS_SELF_KEPT: tuple[tuple[str, str], ...] = (
    ("prometheus_tsdb_head_series", "one"), ("prometheus_tsdb_head_samples_appended_total", "type"),
    ("prometheus_tsdb_wal_corruptions_total", "one"), ("prometheus_tsdb_wal_writes_failed_total", "one"),
    ("prometheus_tsdb_wal_truncations_failed_total", "one"), ("prometheus_tsdb_wal_storage_size_bytes", "one"),
    ("prometheus_tsdb_head_truncations_failed_total", "one"), ("prometheus_tsdb_compactions_failed_total", "one"),
    ("prometheus_tsdb_storage_blocks_bytes", "one"), ("prometheus_config_last_reload_successful", "one"),
    ("prometheus_rule_evaluation_failures_total", "rule_group"),
    ("prometheus_rule_group_iterations_missed_total", "rule_group"),
    ("prometheus_rule_group_interval_seconds", "rule_group"),
    ("prometheus_rule_group_last_duration_seconds", "rule_group"),
    ("prometheus_notifications_errors_total", "alertmanager"), ("prometheus_notifications_dropped_total", "one"),
    ("prometheus_notifications_queue_length", "one"), ("prometheus_notifications_queue_capacity", "one"),
    ("prometheus_notifications_alertmanagers_discovered", "one"), ("process_resident_memory_bytes", "one"),
)
# The rule groups kilonode renders at most (tests/monitoring/test_observability.py checks the shipped stacks stay
# within), sample types appended (float, histogram), and Alertmanagers notified (one, or none yet).
PROMETHEUS_SELF_PER = {"one": 1, "rule_group": 16, "type": 2, "alertmanager": 1}
# The recording rules' results beside the per-GPU one (kilonode.render.monitoring: the apiserver rate by code, the
# etcd members' ratios, headroom and p99s, each control-plane certificate, the pools' counts, the namespaces'
# traffic by direction, CoreDNS's responses by rcode): an ESTIMATE, a few thousand. The per-GPU last Xid
# (kilonode:gpu_xid_errors:last, one series per GPU) is counted per GPU (kilonode.plan.resolve.monitoring).
PROMETHEUS_RECORDED_SERIES = 3_000
# CoreDNS's /metrics (kilonode.k8s.dns: the `prometheus :9153` plugin), kept to these names
# (kilonode.render.monitoring coredns_scrape_job), each with its series on one replica (an ESTIMATE where the
# label values vary): coredns/coredns v1.12.1 plugin/metrics/vars/vars.go l.19-26 (request_duration_seconds
# {server, zone, view}, plugin.TimeBuckets: 16 buckets + Inf, plugin/plugin.go l.106) over four zones (".",
# the cluster domain, in-addr.arpa., ip6.arpa.); l.53-58 (responses_total {server, zone, view, rcode, plugin}:
# ~4 zones x ~4 rcodes x ~3 plugins); plugin/pkg/proxy/metrics.go l.12-26 (proxy_request_duration_seconds
# {proxy_name, to, rcode}: one upstream, the node's resolver, ~3 rcodes x 17 buckets; healthcheck_failures_total
# {proxy_name, to}); plugin/forward/metrics.go l.12-24 (forward_healthcheck_broken_total,
# forward_max_concurrent_rejects_total); vars.go l.60-63 (panics_total).
COREDNS_KEPT: tuple[tuple[str, int], ...] = (
    ("coredns_dns_request_duration_seconds_bucket", 68), ("coredns_dns_request_duration_seconds_count", 4),
    ("coredns_dns_responses_total", 48),
    ("coredns_proxy_request_duration_seconds_bucket", 51), ("coredns_proxy_request_duration_seconds_count", 3),
    ("coredns_proxy_healthcheck_failures_total", 1), ("coredns_forward_healthcheck_broken_total", 1),
    ("coredns_forward_max_concurrent_rejects_total", 1), ("coredns_panics_total", 1),
)
# What a series' labels cost in the head (the catalogue's per-label-pair figure): job, instance,
# node, pool, name and the metric's own labels; the name's bytes, stored twice.
PROMETHEUS_LABEL_PAIRS_PER_SERIES = 10
PROMETHEUS_NAME_BYTES = 40

# The apiserver's --etcd-compaction-interval, which kilonode's units leave at kube-apiserver's default 5m (the
# catalogue's limits.yaml kubernetes.compactionIntervalSeconds; tests/monitoring/test_observability_trace.py holds
# them equal): the etcd compaction alert waits several of them (kilonode.render.monitoring).
APISERVER_COMPACTION_INTERVAL_S = 300

# --- scrape intervals ----------------------------------------------------------------------------
# The per-node jobs (kubelet, cAdvisor) take the shortest of these whose samples per second stay
# within PROMETHEUS_INGEST_BUDGET: every second of interval is one scrape per node, and at 7,500
# nodes the samples per second decide the WAL's size, hence its replay time after a restart (the
# field notes' hours-long WAL replay) and the disk per day.
PROMETHEUS_PER_NODE_INTERVALS_S = (15, 30, 60)
# 200,000 samples/s: ~35 GB a day at the catalogue's 2 bytes per sample, and a WAL of two hours
# (~1.4 billion samples) that replays in minutes on the cores the pod gets. A cluster whose per-node
# jobs exceed it even at 60 s is scraped at 60 s and its cost shown (`kilonode explain`).
PROMETHEUS_INGEST_BUDGET = 200_000
# The control plane's few targets: the rules' 5-minute rates want several samples each.
PROMETHEUS_CONTROL_PLANE_INTERVAL_S = 30

# --- resources -----------------------------------------------------------------------------------
# One core per this many active series (ingestion, head compaction every two hours, rule
# evaluation), at least one: the pod's CPU request and limit, and its GOMAXPROCS.
PROMETHEUS_SERIES_PER_CPU = 1_000_000
# Memory: the head estimate plus this margin (label-value churn as pods come and go, compaction's
# temporary blocks), plus what the admitted queries may hold (query.max-concurrency x
# query.max-samples x the catalogue's bytes per query sample). Request = limit: the kubelet never
# reclaims it, and the OOM killer is the one to decide only if the estimate is wrong.
PROMETHEUS_MEMORY_MARGIN_PERCENT = 25
# What of the VM the pod may take: the rest is the kubelet's and system reservations, the node's
# DaemonSets (kube-proxy, cloud-node-manager) and the page cache Prometheus reads blocks through.
PROMETHEUS_VM_MEMORY_PERCENT = 75
PROMETHEUS_VM_RESERVED_CPUS = 2

# --- the lessons as flags ------------------------------------------------------------------------
# Field notes: Prometheus crashed under dashboard queries until they were bounded. 30 s (the
# default is 2 m): a dashboard panel that needs longer reads millions of series and should be a
# recording rule; the rules evaluate every minute and must finish well inside it.
PROMETHEUS_QUERY_TIMEOUT = "30s"
# The default 50,000,000 samples (800 MB at 16 bytes each) per query, and no more than the cores
# at once (the default is 20): a query beyond the cores only queues inside and holds its memory.
PROMETHEUS_QUERY_MAX_SAMPLES = 50_000_000

# --- storage -------------------------------------------------------------------------------------
# The TSDB's disk, sized to this share of the Prometheus pool's OS disk (where it lived as an
# emptyDir until it had a PersistentVolume of its own: kilonode.k8s.monitoring); the volume is
# this rounded up to its Premium SSD tier.
PROMETHEUS_OS_DISK_PERCENT = 60
# Prometheus' default retention time; shortened when the disk holds fewer days.
PROMETHEUS_RETENTION_DAYS_MAX = 15
# Fewer days than this and the plan refuses: the alerts' `for:` and rates need hours, but a person
# on call needs yesterday to compare with.
PROMETHEUS_RETENTION_DAYS_MIN = 2
