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
from kilonode.config import load_stack
from kilonode.k8s.gpu import POOL_LABEL as GPU_POOL_LABEL
from kilonode.k8s.monitoring import CONFIG_MAP, CONFIG_MAP_MAX_BYTES, NAMESPACE, config_map_size
from kilonode.node.gpu import protocol
from kilonode.paths import REPO_ROOT
from kilonode.plan import ClusterPlan, plan_stack, wellknown
from kilonode.render import monitoring
from kilonode.render.etcd import etcd_flags
from tests import shared
from tests.azure.conftest import covers_port, nsg_rules_for, sources
from tests.conftest import StackWriter, shipped_cluster_value

STACKS = ["local", "research-2500", "research-7500"]
GIB = 1024**3
assert REPO_ROOT is not None, "runs from a source checkout"
DOC = REPO_ROOT / monitoring.RUNBOOK_DOC

# Prometheus' Kubernetes service discovery, read at v2.42.0 (Debian's promtool) and v3.14.0
# (discovery/kubernetes/kubernetes.go: SDConfig's yaml fields l.123-131 / l.108-116, inline
# HTTPClientConfig aside; Role.UnmarshalYAML l.110-120) and the meta labels the roles set
# (node.go nodeLabels: __meta_kubernetes_node_name and ..._node_label_<sanitized key>;
# endpointslice.go l.257 ..._endpointslice_port_name; service.go serviceLabels
# ..._service_label_<sanitized key>, attached to EndpointSlice targets by addServiceLabels l.453).
SD_FIELDS = {"api_server", "role", "kubeconfig_file", "namespaces", "selectors", "attach_metadata"}
SD_ROLES = {"node", "pod", "service", "endpoints", "endpointslice", "ingress"}
# The pod role, read at v3.5.5 (the pinned Prometheus): pod.go l.191 pod_container_port_name,
# kubernetes.go addObjectMetaLabels l.786-792 (<role>_name, <role>_label_<sanitized key>).
SD_META = {
    "node": (("__meta_kubernetes_node_name",), "__meta_kubernetes_node_label_"),
    "endpointslice": (("__meta_kubernetes_endpointslice_port_name",), "__meta_kubernetes_service_label_"),
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


def plan_with(write_stack: StackWriter, base: str, etcd: dict[str, Any]) -> ClusterPlan:
    cluster = shipped_cluster_value(base)
    for role, values in etcd.items():
        cluster.setdefault("etcd", {}).setdefault(role, {}).update(values)
    return plan_stack(load_stack(str(write_stack(cluster))))


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
        monitoring.JOB_KUBELET, monitoring.JOB_CADVISOR, monitoring.JOB_KUBE_STATE_METRICS} | (
        {monitoring.JOB_AUTOSCALER} if plans[stack].autoscaled_pools else set())
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
def test_prometheus_in_the_pools_can_reach_the_etcd_metrics_port(
    graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str
) -> None:
    rules = [r for r in nsg_rules_for(graphs[stack], "etcd")
             if r["access"] == "Allow" and covers_port(r, wellknown.ETCD_METRICS_PORT)]
    allowed = {s for r in rules for s in sources(r)}
    assert {str(p.subnet) for p in plans[stack].node_pools} <= allowed


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
        assert rule["labels"]["severity"] in {"warning", "critical"}
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
    lines = monitoring.describe(plan)
    assert len(lines) == len(monitoring.alerts(plan))
    assert all("\n" not in line and "{{" not in line for line in lines)
    assert any("KilonodeEtcdDatabaseNearQuota [critical, for 5m]" in line and "85%" in line for line in lines)
    assert any("KilonodeApiserverThrottling [warning, for 10m]" in line and "1%" in line for line in lines)


# --- promtool test rules: the alerts fire when they should, and only then ---------------------------
def expected(plan: ClusterPlan, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The alert promtool should report: the rule's annotations with $labels filled in."""
    [rule] = [r.rule() for r in monitoring.alerts(plan)
              if r.name == name and r.severity == labels["severity"]
              and all(labels.get(k) == v for k, v in r.labels)]
    annotations = {key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], value)
                   for key, value in rule["annotations"].items()}
    return {"exp_labels": labels, "exp_annotations": annotations}


def promtool_test(promtool: Path, plan: ClusterPlan, tmp_path: Path, series: list[tuple[str, str]],
                  checks: list[tuple[str, str, list[dict[str, Any]]]]) -> subprocess.CompletedProcess[str]:
    """Run `promtool test rules` on the plan's rules: series (selector, values) at a 1m interval;
    checks (eval time, alert name, the alerts expected then)."""
    (tmp_path / monitoring.RULES_FILE).write_text(monitoring.alert_rules(plan))
    test = {
        "rule_files": [monitoring.RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": e} for t, a, e in checks],
        }],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return run(promtool, "test", "rules", path.name, cwd=tmp_path)


def apiserver_series(ok_per_s: int, code: str, bad_per_s: int) -> list[tuple[str, str]]:
    job = f'job="{monitoring.JOB_APISERVER}"'
    return [
        (f'apiserver_request_total{{{job},verb="LIST",resource="pods",code="200"}}', f"0+{ok_per_s * 60}x40"),
        (f'apiserver_request_total{{{job},verb="POST",resource="pods",code="{code}"}}', f"0+{bad_per_s * 60}x40"),
        # WATCH is long-running and left out: if it counted, 20 refused of 10,120 would be 0.2%
        (f'apiserver_request_total{{{job},verb="WATCH",resource="pods",code="200"}}', "0+600000x40"),
        # an aggregated API server's own 429s are not the apiservers'
        ('apiserver_request_total{job="metrics-server",verb="GET",code="429"}', "0+6000x40"),
    ]


def test_the_429_alert_fires_on_a_429_storm(promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    plan = plans["local"]
    # 20 of 120 requests a second refused: 16.7%
    result = promtool_test(promtool, plan, tmp_path, apiserver_series(100, "429", 20), [
        ("20m", "KilonodeApiserverThrottling", [
            expected(plan, "KilonodeApiserverThrottling", {"severity": "warning"}),
            expected(plan, "KilonodeApiserverThrottling", {"severity": "critical"}),
        ]),
        ("20m", "KilonodeApiserverErrors", []),
        # the warning waits its 10 minutes: at 8m only the critical (5m) fires
        ("8m", "KilonodeApiserverThrottling", [
            expected(plan, "KilonodeApiserverThrottling", {"severity": "critical"})]),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_429_alert_stays_quiet_on_healthy_traffic(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["local"]
    # 6 of 60,000 a minute refused (0.01%), and the metrics-server's own 429s besides
    series = [*apiserver_series(1000, "429", 0),
              (f'apiserver_request_total{{job="{monitoring.JOB_APISERVER}",verb="GET",code="429"}}', "0+6x40")]
    result = promtool_test(promtool, plan, tmp_path, series, [
        ("30m", "KilonodeApiserverThrottling", []),
        ("30m", "KilonodeApiserverErrors", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_5xx_alert_fires_when_the_apiservers_fail_requests(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["local"]
    # 2 of 102 a second: 2%, a warning, not a page
    result = promtool_test(promtool, plan, tmp_path, apiserver_series(100, "503", 2), [
        ("20m", "KilonodeApiserverErrors", [expected(plan, "KilonodeApiserverErrors", {"severity": "warning"})]),
        ("20m", "KilonodeApiserverThrottling", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def etcd_series(plan: ClusterPlan, size: dict[str, int], quota: dict[str, int]) -> list[tuple[str, str]]:
    """Every member of each cluster at `size[role]` bytes; exporting `quota[role]` where given."""
    series = []
    for cluster in plan.etcd_clusters:
        for m in cluster.members:
            labels = (f'job="{monitoring.etcd_job(cluster.role)}",cluster_role="{cluster.role}",'
                      f'member="{m.name}",instance="{m.ip}:{wellknown.ETCD_METRICS_PORT}"')
            series.append((f"etcd_mvcc_db_total_size_in_bytes{{{labels}}}", f"{size[cluster.role]}x40"))
            if cluster.role in quota:
                series.append((f"etcd_server_quota_backend_bytes{{{labels}}}", f"{quota[cluster.role]}x40"))
    return series


def member_alerts(plan: ClusterPlan, role: str, name: str, severities: list[str]) -> list[dict[str, Any]]:
    cluster = plan.etcd_events if role == "events" else plan.etcd_main
    return [expected(plan, name, {"severity": s, "cluster_role": role,
                                  "instance": f"{m.ip}:{wellknown.ETCD_METRICS_PORT}"})
            for m in cluster.members for s in severities]


@pytest.fixture
def events_quota_4gib(write_stack: StackWriter) -> ClusterPlan:
    """The shipped quotas are equal (8 GiB both): here the events cluster has half main's."""
    plan = plan_with(write_stack, "local", {"events": {"quotaBackendBytes": 4 * GIB}})
    assert (plan.etcd_main.quota_backend_bytes, plan.etcd_events.quota_backend_bytes) == (8 * GIB, 4 * GIB)
    return plan


@pytest.mark.parametrize("exported", [True, False], ids=["quota-exported", "quota-from-plan"])
def test_the_quota_alert_fires_for_events_at_90_percent_of_its_quota_not_for_main_at_the_same_size(
    promtool: Path, events_quota_4gib: ClusterPlan, tmp_path: Path, exported: bool
) -> None:
    plan = events_quota_4gib
    size = int(0.9 * 4 * GIB)  # 90% of events' 4 GiB, 45% of main's 8 GiB
    quota = {"main": 8 * GIB, "events": 4 * GIB} if exported else {}
    result = promtool_test(promtool, plan, tmp_path, etcd_series(plan, {"main": size, "events": size}, quota), [
        ("20m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["warning", "critical"])),
        ("20m", "KilonodeEtcdNoSpace", []),
        ("20m", "KilonodeEtcdQuotaNotAsPlanned", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_quota_alert_stays_quiet_at_half_the_quota(
    promtool: Path, events_quota_4gib: ClusterPlan, tmp_path: Path
) -> None:
    plan = events_quota_4gib
    size = {"main": 4 * GIB, "events": 2 * GIB}
    result = promtool_test(promtool, plan, tmp_path, etcd_series(plan, size, {"main": 8 * GIB, "events": 4 * GIB}), [
        ("30m", "KilonodeEtcdDatabaseNearQuota", []),
        ("30m", "KilonodeEtcdNoSpace", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_member_running_another_quota_is_reported_and_judged_by_its_own(
    promtool: Path, events_quota_4gib: ClusterPlan, tmp_path: Path
) -> None:
    plan = events_quota_4gib
    # the events members run etcd's 2 GiB default (the flag never reached them) and hold 1.9 GB:
    # 45% of the stack's 4 GiB, 89% of what etcd enforces
    size = {"main": GIB, "events": int(0.89 * 2 * GIB)}
    result = promtool_test(promtool, plan, tmp_path, etcd_series(plan, size, {"main": 8 * GIB, "events": 2 * GIB}), [
        ("20m", "KilonodeEtcdQuotaNotAsPlanned", member_alerts(plan, "events", "KilonodeEtcdQuotaNotAsPlanned",
                                                               ["warning"])),
        ("20m", "KilonodeEtcdDatabaseNearQuota",
         member_alerts(plan, "events", "KilonodeEtcdDatabaseNearQuota", ["warning", "critical"])),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_nospace_alert_fires_when_a_member_reaches_its_quota(
    promtool: Path, events_quota_4gib: ClusterPlan, tmp_path: Path
) -> None:
    plan = events_quota_4gib
    result = promtool_test(promtool, plan, tmp_path, etcd_series(plan, {"main": GIB, "events": 4 * GIB}, {}), [
        ("5m", "KilonodeEtcdNoSpace", member_alerts(plan, "events", "KilonodeEtcdNoSpace", ["critical"])),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def gpu_node_series(pool: str, nodes: int, tainted: int, prefix: str) -> list[tuple[str, str]]:
    series = []
    for i in range(nodes):
        node = f'node="{prefix}-{i}"'
        series += [
            (f'kube_node_labels{{job="{monitoring.JOB_KUBE_STATE_METRICS}",{node},label_kilonode_io_pool="{pool}"}}',
             "1x40"),
            (f'kube_node_info{{{node}}}', "1x40"),
            (f'kube_node_status_condition{{{node},condition="{protocol.CONDITION}",status="true"}}',
             "0x40" if i < tainted else "1x40"),
        ]
        if i < tainted:
            series.append((f'kube_node_spec_taint{{{node},key="{protocol.FAULT_TAINT}",value="EccVolatile",'
                           f'effect="{protocol.EFFECT}"}}', "1x40"))
    return series


def test_the_gpu_taint_alerts_fire_per_pool_when_nodes_carry_the_taint(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    series = (
        gpu_node_series("a100-ib", 40, 1, "a")  # 2.5%: a warning
        + gpu_node_series("h100-ib", 4, 1, "h")  # 25%: a page as well
        # other taints, and nodes outside the GPU pools, count for nothing
        + [('kube_node_spec_taint{node="a-5",key="kilonode.io/gpu-check",value="running",effect="NoSchedule"}',
            "1x40"),
           ('kube_node_labels{node="c-0",label_kilonode_io_pool="cpu"}', "1x40"),
           (f'kube_node_spec_taint{{node="c-0",key="{protocol.FAULT_TAINT}",value="x",effect="NoSchedule"}}',
            "1x40")]
    )
    result = promtool_test(promtool, plan, tmp_path, series, [
        ("20m", "KilonodeGpuNodesUnhealthy", [
            expected(plan, "KilonodeGpuNodesUnhealthy", {"severity": "warning", "pool": "a100-ib"}),
            expected(plan, "KilonodeGpuNodesUnhealthy", {"severity": "warning", "pool": "h100-ib"}),
        ]),
        ("20m", "KilonodeGpuPoolDegraded", [
            expected(plan, "KilonodeGpuPoolDegraded", {"severity": "critical", "pool": "h100-ib"})]),
        # before its 15 minutes the warning waits
        ("10m", "KilonodeGpuNodesUnhealthy", []),
        ("30m", "KilonodeGpuHealthNotReported", []),
        ("30m", "KilonodePoolLabelNotExported", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gpu_alerts_stay_quiet_on_a_healthy_pool(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    result = promtool_test(promtool, plan, tmp_path, gpu_node_series("a100-ib", 10, 0, "a"), [
        ("30m", "KilonodeGpuNodesUnhealthy", []),
        ("30m", "KilonodeGpuPoolDegraded", []),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_missing_pool_labels_and_silent_agents_are_reported(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    plan = plans["research-7500"]
    series = [('kube_node_labels{node="n-0"}', "1x50"), ('kube_node_info{node="n-0"}', "1x50")]
    result = promtool_test(promtool, plan, tmp_path, series, [
        ("40m", "KilonodePoolLabelNotExported", [expected(plan, "KilonodePoolLabelNotExported",
                                                          {"severity": "warning"})]),
    ])
    assert result.returncode == 0, result.stdout + result.stderr
    # a GPU-pool node with no GPUHealthy condition at all: the agent is not reporting
    series = [('kube_node_labels{node="a-0",label_kilonode_io_pool="a100-ib"}', "1x50")]
    result = promtool_test(promtool, plan, tmp_path, series, [
        ("40m", "KilonodeGpuHealthNotReported", [expected(plan, "KilonodeGpuHealthNotReported",
                                                          {"severity": "warning", "pool": "a100-ib"})]),
    ])
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_promtool_test_rules(
    promtool: Path, plans: dict[str, ClusterPlan], tmp_path: Path
) -> None:
    # the harness itself can fail: healthy traffic expected to page is reported as a failure
    plan = plans["local"]
    result = promtool_test(promtool, plan, tmp_path, apiserver_series(1000, "429", 0), [
        ("30m", "KilonodeApiserverThrottling", [expected(plan, "KilonodeApiserverThrottling",
                                                         {"severity": "critical"})]),
    ])
    assert result.returncode != 0
    assert "KilonodeApiserverThrottling" in result.stdout + result.stderr


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
