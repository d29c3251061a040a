"""The exporters (kilonode.k8s.exporters) under Pulumi's mock engine: dcgm-exporter on exactly the
GPU pools with upstream's privileges and kilonode's counters, node-exporter on every node with only
its collectors, kube-state-metrics with nodes alone and the pool label; and, read from the rules
rather than from the exporters' data, every series an alert reads is one the exporter is told to
collect and the scrape job keeps."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from kilonode.azure.graph import Graph, Recorded
from kilonode.k8s.exporters import dcgm_counters_csv
from kilonode.k8s.gpu import device_plugin_tolerations
from kilonode.plan import ClusterPlan, defaults, wellknown
from kilonode.render import monitoring
from tests import shared

STACKS = list(shared.SHIPPED_STACKS)
# Every field kilonode's CSV names, as NVIDIA/dcgm-exporter etc/default-counters.csv at 4.5.3-4.8.2
# spells it (l.11, 14, 23, 29, 31, 45, 46, 51, 61-65, 72, 74; copied here by hand): a misspelt field
# makes the exporter refuse the file.
UPSTREAM_FIELDS = {
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    # etc/default-counters.csv at 4.5.3-4.8.2 l.6, l.20, l.30 (commented), l.40 (commented: the exporter's own), l.73;
    # DCGM_FI_DEV_CLOCKS_EVENT_REASONS is not in the file: go-dcgm's field map (ec245c09 pkg/dcgm/const_fields.go
    # l.1331), which the exporter's counters parser reads (internal/pkg/counters/counter_config.go l.110)
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


def objects(graph: Graph, kind: str) -> dict[str, dict[str, Any]]:
    return {r.plain()["metadata"]["name"]: r.plain() for r in graph.resources
            if isinstance(r, Recorded) and r.type == f"kubernetes:{kind}" and r.custom}


def pod(graph: Graph, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = objects(graph, kind)[name]["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("stack", STACKS)
def test_dcgm_exporter_runs_on_exactly_the_gpu_pools_with_upstreams_privileges(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    plan, graph = plans[stack], graphs[stack]
    daemonsets = objects(graph, "apps/v1:DaemonSet")
    if not plan.gpu_pools:
        assert "dcgm-exporter" not in daemonsets
        return
    spec = pod(graph, "apps/v1:DaemonSet", "dcgm-exporter")
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": wellknown.POOL_LABEL, "operator": "In",
                                         "values": sorted(p.name for p in plan.gpu_pools)}]
    assert spec["tolerations"] == device_plugin_tolerations()  # a failed GPU's node is the one to read
    assert spec["hostNetwork"] is True and spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    assert container["securityContext"] == {"runAsNonRoot": False, "runAsUser": 0, "allowPrivilegeEscalation": False,
                                            "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DCGM_EXPORTER_KUBERNETES"] == "true" and env["DCGM_EXPORTER_LISTEN"] == ":9400"
    # collected as often as scraped: no reading no scrape takes
    assert env["DCGM_EXPORTER_INTERVAL"] == str(plan.prometheus.per_node_interval_s * 1000)
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-nvidia-devices"]


def test_the_counters_csv_names_upstreams_fields_in_upstreams_format() -> None:
    rows = [line.split(",") for line in dcgm_counters_csv().splitlines() if not line.startswith("#")]
    assert {row[0] for row in rows} <= UPSTREAM_FIELDS
    assert all(len(row) == 3 and row[1].strip() in ("gauge", "counter") for row in rows)
    assert len(rows) == len(defaults.DCGM_FIELDS) == 21  # the series per GPU the plan counts


def test_the_counters_csv_is_the_config_map_the_exporter_reads(graphs: dict[str, Graph]) -> None:
    graph = graphs["research-7500"]
    data = objects(graph, "core/v1:ConfigMap")["dcgm-exporter-counters"]["data"]
    spec = pod(graph, "apps/v1:DaemonSet", "dcgm-exporter")
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    directory, _, file = env["DCGM_EXPORTER_COLLECTORS"].rpartition("/")
    assert data == {file: dcgm_counters_csv()}
    assert {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]} >= {directory}
    # read at start only: a change to the file rolls the pods
    assert objects(graph, "apps/v1:DaemonSet")["dcgm-exporter"]["spec"]["template"]["metadata"]["annotations"]


@pytest.mark.parametrize("stack", STACKS)
def test_node_exporter_runs_on_every_node_with_only_its_collectors_and_no_token(
        graphs: dict[str, Graph], stack: str) -> None:
    spec = pod(graphs[stack], "apps/v1:DaemonSet", "node-exporter")
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True and spec["automountServiceAccountToken"] is False
    [container] = spec["containers"]
    args = container["args"]
    assert "--collector.disable-defaults" in args and "--path.rootfs=/host" in args
    assert {a.removeprefix("--collector.") for a in args if re.fullmatch(r"--collector\.[a-z_]+", a)} \
        == set(defaults.NODE_EXPORTER_COLLECTORS)
    assert "cpu" not in defaults.NODE_EXPORTER_COLLECTORS  # 768 series on a 96-vCPU node
    assert container["volumeMounts"] == [{"name": "root", "mountPath": "/host", "readOnly": True,
                                          "mountPropagation": "HostToContainer"}]
    assert container["securityContext"]["runAsUser"] == 65534
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_kube_state_metrics_watches_nodes_alone_with_the_pool_label(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan]) -> None:
    graph = graphs["research-7500"]
    [container] = pod(graph, "apps/v1:Deployment", "kube-state-metrics")["containers"]
    assert "--resources=nodes,daemonsets,deployments" in container["args"]
    assert "--namespaces=kube-system" in container["args"]  # the apps resources read there alone
    assert (f"--metric-labels-allowlist=nodes=[{monitoring.POOL_LABEL},kilonode.io/team,kilonode.io/fabric]"
            in container["args"])
    role = objects(graph, "rbac.authorization.k8s.io/v1:ClusterRole")["kube-state-metrics"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    apps = objects(graph, "rbac.authorization.k8s.io/v1:Role")["kube-state-metrics"]
    assert apps["metadata"]["namespace"] == "kube-system"
    assert apps["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets", "deployments"],
                              "verbs": ["list", "watch"]}]
    # sized for the nodes the cluster may reach: upstream's 250MiB and more
    memory = int(container["resources"]["requests"]["memory"].removesuffix("Mi"))
    assert memory == int(container["resources"]["limits"]["memory"].removesuffix("Mi")) > 250
    assert "cpu" not in container["resources"].get("limits", {})
    # what the scrape job looks for: the Service's label and port name
    service = objects(graph, "core/v1:Service")["kube-state-metrics"]
    [job] = [j.config for j in monitoring.scrape_jobs(plans["research-7500"])
             if j.config["job_name"] == monitoring.JOB_KUBE_STATE_METRICS]
    name_rule, port_rule = job["relabel_configs"]
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == name_rule["regex"]
    assert port_rule["regex"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("stack", STACKS)
def test_every_exporter_series_a_rule_reads_is_collected_and_kept(plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    rules = yaml.safe_load(monitoring.alert_rules(plan))
    text = " ".join(rule["expr"] for group in rules["groups"] for rule in group["rules"])
    dcgm = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", text))
    node = set(re.findall(r"\bnode_[a-z0-9_]+", text)) - {"node_"}
    jobs = {j.config["job_name"]: j.config for j in monitoring.scrape_jobs(plan)}
    fields = {f for f, _, _ in defaults.DCGM_FIELDS}
    assert dcgm <= fields
    if dcgm:
        kept = jobs[monitoring.JOB_DCGM_EXPORTER]["metric_relabel_configs"][0]["regex"].split("|")
        assert dcgm <= set(kept)
    kept = jobs[monitoring.JOB_NODE_EXPORTER]["metric_relabel_configs"][0]["regex"].split("|")
    assert node <= set(kept), node - set(kept)
    if any(p.infiniband for p in plan.node_pools):
        assert {"node_infiniband_state_id", "node_infiniband_link_downed_total"} <= node
