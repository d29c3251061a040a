"""The cluster's Prometheus (kilonode.plan.resolve.monitoring, kilonode.k8s.monitoring,
kilonode.render.monitoring.prometheus_config): the series estimate's arithmetic worked by hand,
the recorded StatefulSet's flags, environment, placement and volumes, valid for the stack's
Kubernetes version, the scrape jobs for the apiservers and both etcd clusters, and the whole
prometheus.yml checked by promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from kilonode.azure.graph import Graph
from kilonode.plan import ClusterPlan
from kilonode.plan.resolve.monitoring import head_bytes_per_series, per_node_interval, per_node_series
from kilonode.render.monitoring import (
    CONFIG_DIR,
    JOB_APISERVER,
    PROMETHEUS_FILE,
    RULES_FILE,
    SA_DIR,
    alert_rules,
    etcd_job,
    monitoring_files,
    prometheus_config,
)
from tests import shared

STACKS = ["local", "research-2500", "research-7500"]

# Every flag name cmd/prometheus/main.go registers at v3.5.5 (077b7138) that kilonode passes, read
# there by hand (l.356 config.file, l.428 storage.tsdb.path, l.446/449 retention.time/size, l.462
# wal-compression, l.551/554/557 query.timeout/max-concurrency/max-samples, l.359
# config.auto-reload-interval, enable-feature with `auto-reload-config` at l.241). Kingpin refuses
# an unknown flag at start: a name missing here is a Prometheus that does not start.
PROMETHEUS_V3_5_5_FLAGS = {
    "config.file", "storage.tsdb.path", "storage.tsdb.retention.time", "storage.tsdb.retention.size",
    "storage.tsdb.wal-compression", "query.timeout", "query.max-concurrency", "query.max-samples",
    "enable-feature", "config.auto-reload-interval",
}
# discovery/kubernetes/kubernetes.go at v3.5.5 l.106-114 (SDConfig's yaml keys, HTTP client inlined)
# and l.230-233 (namespaces: own_namespace, names): what a kubernetes_sd_configs entry may hold
# besides the HTTP client's, which kilonode does not set (in-cluster credentials).
KUBERNETES_SD_KEYS = {"api_server", "role", "kubeconfig_file", "namespaces", "selectors", "attach_metadata"}
KUBERNETES_SD_ROLES = {"node", "pod", "service", "endpoints", "endpointslice", "ingress"}


def statefulset(graph: Graph) -> dict[str, Any]:
    found = [r.plain() for r in graph.of_type("kubernetes:apps/v1:StatefulSet")
             if r.plain()["metadata"]["namespace"] == "monitoring" and r.plain()["metadata"]["name"] == "prometheus"]
    assert len(found) == 1
    return found[0]


def test_the_series_estimate_is_the_sum_worked_by_hand_at_research_7500(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    p = plan.prometheus
    gpu = next(pool for pool in plan.node_pools if pool.name == "a100-ib")
    # kubelet 1,200 + cAdvisor 3 per container + kube-state-metrics 40 per node (nodes only: no
    # per-pod series) + pod traffic 3 per node and 4 per pod (bytes and packets, in and out) + the
    # GPU health agent's 18 fixed series, 2 of findings and 3 per GPU (8 on an ND96asr_v4)
    # + node-exporter's 74 kept per node (64, then 5 conntrack series and the conntrack collector's
    # node_scrape_collector_success, then eth's receive and transmit drops on 2 NICs) and 10 per InfiniBand
    # port (one HCA per GPU: the 10 node_infiniband_*
    # names kept, defaults.NODE_EXPORTER_KEPT, the port's rate and transmit wait among them)
    # + dcgm-exporter's 21 fields per GPU
    assert gpu.gpus_per_node == 8 and gpu.infiniband
    assert per_node_series(gpu) == (1_200 + 3 * gpu.max_pods + 40 + 3 + 4 * gpu.max_pods
                                    + 18 + 2 + 3 * 8 + 74 + 10 * 8 + 21 * 8) == 1_679  # maxPods 10
    assert p.series == sum(t.targets * t.per_target for t in p.terms)
    nodes = sum(t.targets for t in p.terms if t.what.startswith("nodes of "))
    assert nodes == 5_000 + 2_500 + 3 + 1
    assert [t.targets for t in p.terms if t.what == "apiservers"] == [5]
    # one scheduler and one controller manager beside each apiserver, 5,000 series each
    assert [(t.targets, t.per_target) for t in p.terms
            if t.what.startswith(("kube-scheduler", "kube-controller"))] == [(5, 5_000), (5, 5_000)]
    assert [t.targets for t in p.terms if t.what.startswith("etcd members")] == [5 + 3]
    # Prometheus's own kept names (81: 14 single series, 4 per rule group x 16, 2 sample types, 1 Alertmanager),
    # CoreDNS's 31 replicas (one per 250 of 7,504 nodes) x 178 kept, and the recording rules: 3,000 and one last
    # Xid per GPU (7,500 nodes x 8)
    assert [t.per_target for t in p.terms if t.what.startswith("Prometheus itself")] == [14 + 4 * 16 + 2 + 1]
    assert [(t.targets, t.per_target) for t in p.terms if t.what.startswith("CoreDNS")] == [(31, 178)]
    assert [t.per_target for t in p.terms if t.what.startswith("recording rules")] == [3_000 + 7_500 * 8]
    # ~12.5 million series: more than a 16 GiB system node holds, within one E16ds_v5
    assert 10_000_000 < p.series < 13_000_000
    # at 60 s: 2 x (732 + 10 x 32 + 2 x 40) cardinality + 2 x 1.5 x 2 B x 180 samples ingestion
    assert head_bytes_per_series(60) == 2 * (732 + 320 + 80) + 2 * 3 * 180 == 3_344
    assert p.head_bytes == p.series * 3_344
    assert p.memory_gib * 1024**3 >= p.head_bytes * 1.25 + p.query_bytes
    assert p.query_bytes == p.query_max_concurrency * 50_000_000 * 16


def test_the_per_node_interval_is_sized_to_the_cluster(plans: dict[str, ClusterPlan]) -> None:
    # 200,000 samples/s: 7,500 nodes x ~1,400 series need 60 s; two nodes take 15 s
    assert plans["research-7500"].prometheus.per_node_interval_s == 60
    assert plans["local"].prometheus.per_node_interval_s == 15
    assert per_node_interval(200_000 * 15) == 15
    assert per_node_interval(200_000 * 15 + 1) == 30
    assert per_node_interval(10**9) == 60


@pytest.mark.parametrize("stack", STACKS)
def test_retention_fits_the_data_volume(plans: dict[str, ClusterPlan], stack: str) -> None:
    p = plans[stack].prometheus
    assert p.retention_size_gib == p.disk_gib * 80 // 100  # Prometheus' docs: at most 80-85%
    assert 2 <= p.retention_days <= 15
    assert p.retention_days * p.daily_bytes <= p.retention_size_gib * 1024**3
    assert p.daily_bytes >= (p.samples_per_s - 1) * 86_400 * 2  # samples_per_s is rounded


def test_research_7500_runs_prometheus_alone_on_its_memory_optimised_pool(plans: dict[str, ClusterPlan]) -> None:
    p = plans["research-7500"].prometheus
    assert (p.pool, p.vm_size) == ("monitoring", "Standard_E16ds_v5")
    assert p.pool_taints == ("dedicated=monitoring:NoSchedule",)
    assert p.memory_gib <= 128 * 0.75 and p.cpus <= 16 - 2


@pytest.mark.parametrize("stack", STACKS)
def test_the_statefulset_carries_the_lessons_as_flags(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    sts = statefulset(graphs[stack])
    shared.validate_object(sts, f"1.{plans[stack].kubernetes_minor}.0")
    p = plans[stack].prometheus
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert set(args) <= PROMETHEUS_V3_5_5_FLAGS
    assert args["query.timeout"] == "30s"
    assert args["query.max-concurrency"] == str(p.cpus)
    assert args["query.max-samples"] == "50000000"
    assert args["storage.tsdb.retention.time"] == f"{p.retention_days}d"
    assert args["storage.tsdb.retention.size"] == f"{p.retention_size_gib}GB"
    assert args["storage.tsdb.wal-compression"] == "true"
    assert args["config.file"] == f"{CONFIG_DIR}/{PROMETHEUS_FILE}"
    # GOMAXPROCS is the container's CPU limit, a whole number of cores
    assert container["env"] == [{"name": "GOMAXPROCS", "value": str(p.cpus)}]
    assert container["resources"]["limits"]["cpu"] == str(p.cpus)
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["image"] == plans[stack].components.prometheus_image
    # the image's user (USER nobody), seccomp RuntimeDefault, nothing writable but the data
    assert pod["securityContext"]["runAsUser"] == 65534 and pod["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # placed on its pool, every taint of that pool tolerated
    assert pod["nodeSelector"] == {"kilonode.io/pool": p.pool}
    assert len(pod.get("tolerations", [])) == len(p.pool_taints)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "kilonode-prometheus"
    assert "data" not in volumes  # the claim template's, not an emptyDir
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"config": CONFIG_DIR, "data": "/prometheus"}


def test_the_rules_are_mounted_where_prometheus_yml_names_them(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    (config_map,) = [r.plain() for r in graphs["research-7500"].of_type("kubernetes:core/v1:ConfigMap")
                     if r.plain()["metadata"]["name"] == "kilonode-prometheus"]
    config = shared.load_yaml(config_map["data"][PROMETHEUS_FILE])
    assert config["rule_files"] == [f"{CONFIG_DIR}/{RULES_FILE}"]
    assert config_map["data"][RULES_FILE] == alert_rules(plans["research-7500"])


def test_scrape_jobs_name_every_apiserver_and_both_etcd_clusters(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    jobs = {j["job_name"]: j for j in shared.load_yaml(prometheus_config(plan))["scrape_configs"]}
    apiserver = jobs[JOB_APISERVER]
    assert apiserver["static_configs"][0]["targets"] == [f"{i.ip}:6443" for i in plan.control_plane.instances]
    assert len(apiserver["static_configs"][0]["targets"]) == 5
    assert apiserver["scheme"] == "https" and apiserver["tls_config"]["ca_file"].startswith(SA_DIR)
    for cluster, members in (("main", 5), ("events", 3)):
        job = jobs[etcd_job(cluster)]
        targets = [t for group in job["static_configs"] for t in group["targets"]]
        assert len(targets) == members
        # etcd renders --listen-metrics-urls (plain http): no client certificate needed
        assert all(t.endswith(":2381") for t in targets) and job["scheme"] == "http"
    assert jobs["kilonode-kubelet"]["scrape_interval"] == "60s"
    assert "kilonode-cluster-autoscaler" in jobs


@pytest.mark.parametrize("stack", STACKS)
def test_kubernetes_discovery_uses_only_fields_and_roles_prometheus_knows(
        plans: dict[str, ClusterPlan], stack: str) -> None:
    config = shared.load_yaml(prometheus_config(plans[stack]))
    for job in config["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            assert set(sd) <= KUBERNETES_SD_KEYS, job["job_name"]
            assert sd["role"] in KUBERNETES_SD_ROLES
            assert set(sd.get("namespaces", {})) <= {"own_namespace", "names"}


@pytest.mark.parametrize("stack", STACKS)
def test_promtool_accepts_the_whole_prometheus_yml(
        promtool: Path, plans: dict[str, ClusterPlan], stack: str, tmp_path: Path) -> None:
    """promtool check config on the file as mounted, with two substitutions it needs here: the
    ServiceAccount's token and CA (which promtool opens) as files under tmp_path, and each
    kubernetes_sd_configs as an empty static_configs, because Debian builds Prometheus without
    Kubernetes discovery (its promtool refuses the key; the fields are checked above)."""
    files = monitoring_files(plans[stack])
    (tmp_path / "sa").mkdir()
    (tmp_path / "sa" / "token").write_text("token\n")
    (tmp_path / "sa" / "ca.crt").write_text("ca\n")
    text = files[PROMETHEUS_FILE].replace(SA_DIR, str(tmp_path / "sa")).replace(CONFIG_DIR, str(tmp_path))
    config = shared.load_yaml(text)
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": []}]
    import yaml

    (tmp_path / PROMETHEUS_FILE).write_text(yaml.safe_dump(config))
    (tmp_path / RULES_FILE).write_text(files[RULES_FILE])
    result = subprocess.run([str(promtool), "check", "config", str(tmp_path / PROMETHEUS_FILE)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_prometheus_may_discover_but_not_read_or_write_anything_else(graphs: dict[str, Graph]) -> None:
    objects = [r.plain() for r in graphs["research-7500"].resources
               if r.custom and r.parent == "research-7500-k8s-monitoring"]
    (cluster_role,) = [o for o in objects if o.get("kind") == "ClusterRole" or ("rules" in o and "namespace"
                       not in o["metadata"])]
    verbs = {(tuple(r.get("resources", r.get("nonResourceURLs", []))), tuple(r["verbs"]))
             for r in cluster_role["rules"]}
    assert verbs == {(("nodes",), ("list", "watch")), (("nodes/metrics",), ("get",)), (("/metrics",), ("get",))}
    roles = [o for o in objects if "rules" in o and "namespace" in o["metadata"]]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["kube-system", "monitoring"]
    assert all(set(rule["verbs"]) == {"list", "watch"} for r in roles for rule in r["rules"])


def test_a_leases_cluster_gets_its_own_scrape_job_and_quota_rules(tmp_path: Path) -> None:
    from kilonode.config import load_stack
    from kilonode.plan import plan_stack
    from tests.golden.update import variant_stack

    plan = plan_stack(variant_stack("local-leases", tmp_path))
    assert plan.etcd_leases is not None
    jobs = {j["job_name"]: j for j in shared.load_yaml(prometheus_config(plan))["scrape_configs"]}
    leases = jobs[etcd_job("leases")]
    assert [(g["targets"], g["labels"]) for g in leases["static_configs"]] == [
        ([f"{m.ip}:2381"], {"cluster_role": "leases", "member": m.name}) for m in plan.etcd_leases.members]
    certificates = [g["labels"]["member"] for g in jobs["kilonode-certificates"]["static_configs"]]
    assert [f"etcd-leases-{i}" for i in range(3)] == [m for m in certificates if m.startswith("etcd-leases")]
    rules = shared.load_yaml(alert_rules(plan))
    etcd = next(g for g in rules["groups"] if g["name"] == "kilonode-etcd")["rules"]
    roles = [r["labels"]["cluster_role"] for r in etcd if r.get("record") == "kilonode:etcd_db_quota:ratio"]
    assert roles == ["main", "events", "leases"]
    planned = [r for r in etcd if r.get("alert") == "KilonodeEtcdQuotaNotAsPlanned"]
    assert [r["labels"]["cluster_role"] for r in planned] == ["main", "events", "leases"]
    # the shipped stack's rules are those of the variant less the leases cluster's
    assert etcd_job("leases") not in {j["job_name"] for j in shared.load_yaml(prometheus_config(
        plan_stack(load_stack("local"))))["scrape_configs"]}


def test_a_kept_node_exporter_name_is_counted_by_what_it_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 15th independent trace of kilonode diff kept node_cpu_seconds_total and the estimate, a constant then,
    # did not move: 768 series on a 96-vCPU node, 5.8 million at research-7500, unsized
    from kilonode.plan import defaults
    from kilonode.plan.resolve.monitoring import node_exporter_series

    gpu = next(pool for pool in shared.plan("research-7500").node_pools if pool.name == "a100-ib")
    before = node_exporter_series(gpu)
    kept = (*defaults.NODE_EXPORTER_KEPT, ("node_cpu_seconds_total", "cpu"))
    monkeypatch.setattr(defaults, "NODE_EXPORTER_KEPT", kept)
    assert node_exporter_series(gpu) - before == gpu.vcpus * 8 == 768
