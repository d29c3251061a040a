"""The Prometheus rules and scrape configuration (kilonode.render.monitoring), checked by Prometheus'
own promtool (Debian's 2.42: `check rules`, `check config`, `test rules` on synthetic series), the
scrape targets against what the etcd members and apiservers are rendered to listen on, the
Kubernetes service discovery blocks against Prometheus' SDConfig (Debian's promtool is built
without it), and the delivered ConfigMap against the Kubernetes OpenAPI schema."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.k8s.gpu import POOL_LABEL as GPU_POOL_LABEL
from kilonode.k8s.monitoring import CONFIG_MAP, CONFIG_MAP_MAX_BYTES, NAMESPACE, config_map_size
from kilonode.node.gpu import protocol
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan, wellknown
from kilonode.render import monitoring
from kilonode.render.etcd import etcd_flags
from tests import shared
from tests.azure.conftest import covers_port, nsg_rules_for, sources

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]
assert REPO_ROOT is not None, "runs from a source checkout"
DOC = REPO_ROOT / monitoring.RUNBOOK_DOC

# Prometheus' Kubernetes service discovery, read at v2.42.0 (Debian's promtool) and v3.14.0
# (discovery/kubernetes/kubernetes.go: SDConfig's yaml fields l.123-131 / l.108-116, inline
# HTTPClientConfig aside; Role.UnmarshalYAML l.110-120) and the meta labels the roles set
# (node.go nodeLabels: __meta_kubernetes_node_name and ..._node_label_<sanitized key>; node.go
# nodeAddressPrefix ..._node_address_<NodeAddressType as the Node lists it, e.g. InternalIP>;
# endpointslice.go l.257 ..._endpointslice_port_name; service.go serviceLabels
# ..._service_label_<sanitized key>, attached to EndpointSlice targets by addServiceLabels l.453).
SD_FIELDS = {"api_server", "role", "kubeconfig_file", "namespaces", "selectors", "attach_metadata"}
SD_ROLES = {"node", "pod", "service", "endpoints", "endpointslice", "ingress"}
# The pod role, read at v3.5.5 (the pinned Prometheus): pod.go l.191 pod_container_port_name,
# kubernetes.go addObjectMetaLabels l.786-792 (<role>_name, <role>_label_<sanitized key>).
SD_META = {
    "node": (("__meta_kubernetes_node_name",), ("__meta_kubernetes_node_label_", "__meta_kubernetes_node_address_")),
    # an endpoint backed by a pod also carries the pod's (v3.5.5 endpointslice.go l.352-367: podLabels, pod.go
    # l.215-235: its <role>_name and pod_node_name)
    "endpointslice": (("__meta_kubernetes_endpointslice_port_name", "__meta_kubernetes_pod_name",
                       "__meta_kubernetes_pod_node_name"), "__meta_kubernetes_service_label_"),
    "pod": (("__meta_kubernetes_pod_name", "__meta_kubernetes_pod_container_port_name"),
            "__meta_kubernetes_pod_label_"),
}


def sanitize(name: str) -> str:
    """Prometheus util/strutil SanitizeLabelName: every character outside [a-zA-Z0-9_] becomes '_'."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def run(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def rule_count(plan: ClusterPlan) -> int:
    return sum(len(group.rules) for group in monitoring.rule_groups(plan))


# --- promtool check rules / check config ---------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
def test_promtool_accepts_the_rules_of_every_shipped_stack(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path, stack: str
) -> None:
    rules = tmp_path / monitoring.RULES_FILE
    rules.write_text(monitoring.alert_rules(plans[stack]))
    result = run(promtool, "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    # every rule reached promtool (duplicates are a lint error it would report)
    assert f"SUCCESS: {rule_count(plans[stack])} rules found" in result.stdout


def test_a_rule_with_broken_promql_fails_promtool_check_rules(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    document = yaml.safe_load(monitoring.alert_rules(plans["local"]))
    first = document["groups"][0]["rules"][0]
    first["expr"] = first["expr"].replace("rate(", "rate((", 1)  # an unclosed parenthesis
    rules = tmp_path / "broken.yaml"
    rules.write_text(yaml.safe_dump(document))
    result = run(promtool, "check", "rules", str(rules))
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def prometheus_yml(plan: ClusterPlan, tmp_path: Path) -> dict[str, Any]:
    """A prometheus.yml holding the fragment's jobs and the rule file, as docs/monitoring.md loads
    them. The ServiceAccount token and CA paths exist only inside a Pod: promtool checks that the
    files exist, so they point at stand-ins here (nothing else is changed)."""
    rules = tmp_path / monitoring.RULES_FILE
    rules.write_text(monitoring.alert_rules(plan))
    (tmp_path / "token").write_text("not-a-token\n")
    (tmp_path / "ca.crt").write_text("")
    text = (monitoring.scrape_config(plan)
            .replace(monitoring.SA_TOKEN, str(tmp_path / "token"))
            .replace(monitoring.SA_CA, str(tmp_path / "ca.crt")))
    fragment = yaml.safe_load(text)
    return {"global": {"scrape_interval": "30s", "evaluation_interval": "30s"}, "rule_files": [str(rules)],
            **fragment}


def without_kubernetes_sd(config: dict[str, Any]) -> dict[str, Any]:
    stripped = copy.deepcopy(config)
    for job in stripped["scrape_configs"]:
        job.pop("kubernetes_sd_configs", None)
    return stripped


@pytest.mark.parametrize("stack", STACKS)
def test_promtool_accepts_a_prometheus_yml_with_the_fragment_and_the_rules(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path, stack: str
) -> None:
    # Debian's promtool has no Kubernetes service discovery (next test): those blocks are left
    # out here and checked against Prometheus' SDConfig below; everything else goes to promtool,
    # the rule file included (check config loads it).
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(without_kubernetes_sd(prometheus_yml(plans[stack], tmp_path))))
    result = run(promtool, "check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {rule_count(plans[stack])} rules found" in result.stdout


def test_debians_promtool_is_built_without_kubernetes_service_discovery(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    # Why the previous test strips kubernetes_sd_configs. When a promtool that knows them
    # arrives this fails: then check the whole file with it.
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_yml(plans["local"], tmp_path)))
    result = run(promtool, "check", "config", str(config))
    assert result.returncode != 0
    assert "field kubernetes_sd_configs not found" in result.stdout + result.stderr


def test_a_misspelt_scrape_field_fails_promtool_check_config(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    document = without_kubernetes_sd(prometheus_yml(plans["local"], tmp_path))
    apiserver = document["scrape_configs"][0]
    apiserver["metric_relabel_config"] = apiserver.pop("metric_relabel_configs")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(document))
    result = run(promtool, "check", "config", str(config))
    assert result.returncode != 0
    assert "metric_relabel_config not found" in result.stdout + result.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_kubernetes_service_discovery_uses_only_fields_roles_and_meta_labels_prometheus_defines(
    plans: dict[str, ClusterPlan], stack: str
) -> None:
    fragment = yaml.safe_load(monitoring.scrape_config(plans[stack]))
    discovered = [job for job in fragment["scrape_configs"] if "kubernetes_sd_configs" in job]
    assert {job["job_name"] for job in discovered} == {
        monitoring.JOB_KUBELET, monitoring.JOB_CADVISOR, monitoring.JOB_KUBE_STATE_METRICS,
        monitoring.JOB_POD_TRAFFIC, monitoring.JOB_NODE_EXPORTER, monitoring.JOB_COREDNS} \
        | ({monitoring.JOB_AUTOSCALER} if plans[stack].autoscaled_pools else set()) \
        | ({monitoring.JOB_GPU_HEALTH_AGENT, monitoring.JOB_DCGM_EXPORTER} if plans[stack].gpu_pools else set())
    for job in discovered:
        [sd] = job["kubernetes_sd_configs"]
        assert set(sd) <= SD_FIELDS and sd["role"] in SD_ROLES, job["job_name"]
        names, prefix = SD_META[sd["role"]]
        for relabel in job.get("relabel_configs", []):
            for label in relabel["source_labels"]:
                assert label in names or label.startswith(prefix), (job["job_name"], label)
    # the pool label the per-node jobs copy is one every node registers with
    assert monitoring.POOL_LABEL == GPU_POOL_LABEL
    assert all(pool.labels[monitoring.POOL_LABEL] == pool.name for pool in plans[stack].node_pools)
    kubelet = next(job for job in discovered if job["job_name"] == monitoring.JOB_KUBELET)
    assert {"source_labels": [f"__meta_kubernetes_node_label_{sanitize(monitoring.POOL_LABEL)}"],
            "target_label": "pool"} in kubelet["relabel_configs"]
    # kube-state-metrics' name for the same label (internal/store/utils.go: label_ + sanitized)
    ksm_name = f"label_{sanitize(monitoring.POOL_LABEL)}"
    assert ksm_name == monitoring.KSM_POOL_LABEL


# --- what the scrape configuration points at ------------------------------------------------------
@pytest.mark.parametrize("stack", STACKS)
def test_etcd_targets_are_the_members_metrics_urls_labelled_with_their_cluster(
    plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    fragment = yaml.safe_load(monitoring.scrape_config(plan))
    jobs = {job["job_name"]: job for job in fragment["scrape_configs"]}
    for cluster in plan.etcd_clusters:
        job = jobs[monitoring.etcd_job(cluster.role)]
        scraped = {(group["labels"]["cluster_role"], group["labels"]["member"], target)
                   for group in job["static_configs"] for target in group["targets"]}
        assert scraped == {(cluster.role, m.name, f"{m.ip}:{wellknown.ETCD_METRICS_PORT}") for m in cluster.members}
        for member in cluster.members:
            # what the member is rendered to listen on (its etcd flags), scheme included
            listen = dict(etcd_flags(cluster, member))["listen-metrics-urls"]
            assert f"{job['scheme']}://{member.ip}:{wellknown.ETCD_METRICS_PORT}" in str(listen).split(",")


@pytest.mark.parametrize("stack", STACKS)
def test_each_apiserver_is_scraped_at_its_own_address_over_tls(plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    [job] = [j for j in yaml.safe_load(monitoring.scrape_config(plan))["scrape_configs"]
             if j["job_name"] == monitoring.JOB_APISERVER]
    assert job["scheme"] == "https" and job["tls_config"] == {"ca_file": monitoring.SA_CA}
    assert job["static_configs"] == [{"targets": [f"{i.ip}:6443" for i in plan.control_plane.instances]}]


def test_the_fragment_parses_to_the_jobs_it_was_built_from(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    text = monitoring.scrape_config(plan)
    assert yaml.safe_load(text) == {"scrape_configs": [job.config for job in monitoring.scrape_jobs(plan)]}
    # what must not be scraped from every node is said in the file, next to the job
    assert "Do NOT scrape it whole" in text and "kubernetes_feature_enabled" in text


@pytest.mark.parametrize("stack", STACKS)
def test_prometheus_and_no_other_pool_can_reach_the_etcd_metrics_port(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    rules = [r for r in nsg_rules_for(graphs[stack], "etcd")
             if r["access"] == "Allow" and covers_port(r, wellknown.ETCD_METRICS_PORT)]
    allowed = {s for r in rules for s in sources(r)}
    assert allowed == {str(p.subnet) for p in plan.node_pools if p.name == plan.prometheus.pool}


# --- the rules' shape ------------------------------------------------------------------------------
def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)}


@pytest.mark.parametrize("stack", STACKS)
def test_every_alert_has_for_severity_and_a_summary_description_and_runbook_that_exists(
    plans: dict[str, ClusterPlan], stack: str
) -> None:
    sections = anchors(DOC.read_text())
    document = yaml.safe_load(monitoring.alert_rules(plans[stack]))
    alerts = [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]
    assert alerts
    for rule in alerts:
        assert re.fullmatch(r"\d+[mh]", rule["for"]), rule["alert"]
        # "none": the dead man's switch alone, which fires while all is well
        assert rule["labels"]["severity"] in {"warning", "critical"} or \
            (rule["alert"], rule["labels"]["severity"]) == ("KilonodeWatchdog", "none")
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 60
        doc, _, section = rule["annotations"]["runbook"].partition("#")
        assert doc == monitoring.RUNBOOK_DOC and section in sections, rule["alert"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_rules_select_only_jobs_the_fragment_defines(plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    jobs = {job.config["job_name"] for job in monitoring.scrape_jobs(plan)}
    text = monitoring.alert_rules(plan)
    for selector in re.findall(r'job=~?"([^"]+)"', text):
        assert any(re.fullmatch(selector, job) for job in jobs), selector
    # both etcd clusters are compared with their own quota
    assert text.count("record: kilonode:etcd_db_quota:ratio") == 2


def test_gpu_rules_exist_only_for_stacks_with_gpu_pools_and_name_their_pools(plans: dict[str, ClusterPlan]) -> None:
    assert monitoring.gpu_group(plans["local"]) is None
    assert "no GPU pools: no GPU health alerts" in monitoring.describe(plans["local"])
    text = monitoring.alert_rules(plans["research-7500"])
    assert 'label_kilonode_io_pool=~"a100-ib|h100-ib"' in text
    assert f'key="{protocol.FAULT_TAINT}"' in text and f'condition="{protocol.CONDITION}"' in text


def test_describe_gives_each_alert_one_line_with_its_threshold(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["research-7500"]
    routing, *lines = monitoring.describe(plan)
    # first where each severity goes (research-7500: PagerDuty for both, no heartbeat)
    assert routing.startswith("where they go: critical -> PagerDuty as `critical` events; warning -> PagerDuty as "
                              "`warning` events (low urgency on a service with dynamic notifications)")
    assert len(lines) == len(monitoring.alerts(plan))
    assert all("\n" not in line and "{{" not in line for line in lines)
    assert any("KilonodeEtcdDatabaseNearQuota [critical, for 5m]" in line and "85%" in line for line in lines)
    assert any("KilonodeApiserverThrottling [warning, for 10m]" in line and "1%" in line for line in lines)


# --- promtool test rules: tests/monitoring/alert_cases.py holds every alert's firing and quiet cases,
# tests/monitoring/test_alert_cases.py runs them and checks that none is missing.


# --- the ConfigMap in the cluster ----------------------------------------------------------------------
def monitoring_objects(graph: Graph) -> list[Recorded]:
    [component] = [r for r in graph.resources if r.type == "kilonode:k8s:Monitoring"]
    return [r for r in graph.children(component.name) if r.custom]


@pytest.mark.parametrize("stack", STACKS)
def test_the_configmap_holds_both_files_and_is_valid_against_the_stacks_openapi_schema(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    plan = plans[stack]
    objects = {r.type: r.plain() for r in monitoring_objects(graphs[stack])}
    # and two NetworkPolicies (kilonode.k8s.network_policy; tests/k8s/test_network_policy.py)
    # and the Prometheus (tests/monitoring/test_prometheus.py)
    assert set(objects) >= {"kubernetes:core/v1:Namespace", "kubernetes:core/v1:ConfigMap",
                            "kubernetes:networking.k8s.io/v1:NetworkPolicy"}
    config = objects["kubernetes:core/v1:ConfigMap"]
    assert config["metadata"]["name"] == CONFIG_MAP and config["metadata"]["namespace"] == NAMESPACE
    assert objects["kubernetes:core/v1:Namespace"]["metadata"]["name"] == NAMESPACE
    assert config["data"] == monitoring.monitoring_files(plan)
    assert config_map_size(config["data"]) < CONFIG_MAP_MAX_BYTES
    for manifest in objects.values():
        shared.validate_object(manifest, f"1.{plan.kubernetes_minor}.0")
