"""The GPU health agent's and taint controller's metrics, from the host to the scrape: Prometheus'
own parser (promtool check metrics) reads what kilonode.gpu.metrics answers; every GPU pool's
nodes and every apiserver VM of a cluster with GPU pools render the socket and service, start the
socket from their user-data, and systemd-analyze accepts them; the units read the record where the
agent and the controller write it; the scrape jobs reach those ports on those hosts only (the
agents' job keeps the GPU pools' nodes alone), and the NSGs admit them from the pools; the plan's
series estimate counts the agents on GPU nodes only and the controllers on the apiservers. The
alerts' promtool cases are in tests/monitoring/alert_cases.py (gpu_health_*)."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from kilonode.azure.graph import Graph
from kilonode.node.gpu import agent, metrics
from kilonode.node.ship import GPU_HEALTH
from kilonode.plan import ClusterPlan, defaults, wellknown
from kilonode.plan.resolve.monitoring import dcgm_exporter_series, node_exporter_series, per_node_series
from kilonode.render import gpu_metrics, monitoring, node_ports, render_cluster
from kilonode.render.control_plane import GPU_HEALTH_CONTROLLER_UNIT
from kilonode.render.files import USER_DATA
from tests.azure.conftest import covers_port, nsg_rules_for, sources
from tests.node.gpu.test_metrics import _data, full_agent_record
from tests.render.consumers import systemd_verify, verify_rendered_units

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

STACKS = ["local", "research-2500", "research-7500"]


def check_metrics(promtool: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)


def test_prometheus_reads_both_answers_without_a_lint(promtool: Path) -> None:
    record = full_agent_record(8)
    record.note_findings([("pcie-width-idle", False), ("xid", True)])
    record.driver = 'odd "driver"\\ string\n'
    answers = [metrics.agent_metrics(_data(record), "b"), metrics.agent_metrics(None, "b"),
               metrics.controller_metrics(_data(metrics.ControllerRecord(1.0, last_sync=2.0, writes=3))),
               metrics.controller_metrics(None)]
    for text in answers:
        result = check_metrics(promtool, text)
        # a clean exit: parsed, and nothing for the linter (names, units, counters' _total, HELP)
        assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr
    # the same check fails on a counter without _total (so it can fail)
    broken = answers[2].replace("_node_writes_total", "_node_writes")
    assert check_metrics(promtool, broken).returncode != 0


def hosts_with(plan: ClusterPlan, path: str) -> set[str]:
    return {name for name, files in render_cluster(plan).items() if path in files}


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_nodes_and_apiservers_start_their_metrics_sockets_and_no_other_host_has_one(
        plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    hosts = render_cluster(plan)
    gpu_pools = {f"pool-{p.name}" for p in plan.gpu_pools}
    apiservers = {i.name for i in plan.control_plane.instances} if plan.gpu_pools else set()
    agents = {n for n, f in hosts.items() if gpu_metrics.AGENT_SOCKET_PATH in f}
    assert {n.split(".")[0] for n in agents} == gpu_pools  # team shards of a GPU pool included
    assert hosts_with(plan, gpu_metrics.CONTROLLER_SOCKET_PATH) == apiservers
    for name in agents | apiservers:
        files = hosts[name]
        socket_unit = gpu_metrics.AGENT_SOCKET if name in agents else gpu_metrics.CONTROLLER_SOCKET
        data = yaml.safe_load(files[USER_DATA].content)
        written = {f["path"]: f["content"] for f in data["write_files"]}
        for path, file in files.items():
            if "gpu-health" in path and path.startswith("etc/systemd/"):
                assert written[f"/{path}"] == file.content, (name, path)
        starts = [c for c in data["runcmd"] if c[:3] == ["systemctl", "enable", "--now"]]
        assert any(socket_unit in c for c in starts), name
    if stack == "local":
        assert not agents and not apiservers  # no GPU pools: no agent, no controller, nothing to scrape


def unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_the_units_pass_systemd_analyze_verify_and_read_the_records_where_they_are_written(
        plans: dict[str, ClusterPlan], tmp_path: Path) -> None:
    hosts = render_cluster(plans["research-7500"])
    pool, apiserver = hosts["pool-h100-ib"], hosts["apiserver-2"]
    for where in ("agent", "controller", "broken"):
        (tmp_path / where).mkdir()
    # with the node firewall its socket requires (kilonode.render.node_ports)
    assert verify_rendered_units(tmp_path / "agent", pool, (gpu_metrics.AGENT_SOCKET_PATH,
                                                            gpu_metrics.AGENT_SERVICE_PATH, node_ports.UNIT)) == []
    assert verify_rendered_units(tmp_path / "controller", apiserver, (
        gpu_metrics.CONTROLLER_SOCKET_PATH, gpu_metrics.CONTROLLER_SERVICE_PATH, GPU_HEALTH_CONTROLLER_UNIT)) == []
    # a misspelt key is caught by the same check (the check can fail)
    broken = tmp_path / "broken"
    (broken / gpu_metrics.AGENT_SOCKET).write_text(pool[gpu_metrics.AGENT_SOCKET_PATH].content.replace(
        "Accept=", "Acept="))
    assert any("Acept" in line for line in systemd_verify(broken, [broken / gpu_metrics.AGENT_SOCKET]))

    def state_of(service_text: str) -> str:
        words = shlex.split(unit(service_text)["Service"]["ExecStart"])
        assert words[:4] == ["/usr/bin/python3", "-m", f"{GPU_HEALTH.module}.metrics", words[3]]
        return words[words.index("--state") + 1]

    # the agent's record: its default stateDir (the rendered config sets none), the image unit's
    # RuntimeDirectory; the controller's: the --metrics-file its unit passes, in its RuntimeDirectory
    agent_service = unit(pool[gpu_metrics.AGENT_SERVICE_PATH].content)["Service"]
    assert state_of(pool[gpu_metrics.AGENT_SERVICE_PATH].content) == metrics.AGENT_RECORD
    config = tmp_path / "gpu-health.json"
    config.write_text(pool["etc/kilonode/gpu-health.json"].content)
    assert agent.load_config(config).state_dir / metrics.METRICS_FILE == Path(metrics.AGENT_RECORD)
    controller = unit(apiserver[GPU_HEALTH_CONTROLLER_UNIT].content)["Service"]
    flag = next(w for w in shlex.split(controller["ExecStart"].replace("\\\n", " ")) if w.startswith("--metrics-file="))
    assert flag.split("=", 1)[1] == state_of(apiserver[gpu_metrics.CONTROLLER_SERVICE_PATH].content)
    assert flag.split("=", 1)[1] == f"/run/{controller['RuntimeDirectory']}/{metrics.METRICS_FILE}"
    # one answer per connection, sandboxed: a dynamic user, no capabilities, bounded in time
    for service in (agent_service, unit(apiserver[gpu_metrics.CONTROLLER_SERVICE_PATH].content)["Service"]):
        assert service["DynamicUser"] == "yes" and service["CapabilityBoundingSet"] == ""
        assert service["Environment"] == f"PYTHONPATH={GPU_HEALTH.pythonpath}"
        assert int(service["TimeoutStartSec"]) > 0 and service["Type"] == "oneshot"


def job(plan: ClusterPlan, name: str) -> dict[str, object]:
    [found] = [j for j in yaml.safe_load(monitoring.scrape_config(plan))["scrape_configs"] if j["job_name"] == name]
    return found


@pytest.mark.parametrize("stack", ["research-2500", "research-7500"])
def test_the_agents_job_keeps_the_gpu_pools_nodes_only_and_reaches_their_port(plans: dict[str, ClusterPlan],
                                                                              stack: str) -> None:
    plan = plans[stack]
    agents = job(plan, monitoring.JOB_GPU_HEALTH_AGENT)
    assert agents["kubernetes_sd_configs"] == [{"role": "node"}]
    assert agents["scrape_interval"] == f"{plan.prometheus.per_node_interval_s}s"
    relabel = agents["relabel_configs"]
    [keep] = [r for r in relabel if r.get("action") == "keep"]
    assert keep["source_labels"] == ["__meta_kubernetes_node_label_kilonode_io_pool"]
    # Prometheus anchors relabelling regexes: exactly the GPU pools' names, as the pool label carries them
    kept = {p.name for p in plan.node_pools if re.fullmatch(keep["regex"], p.labels["kilonode.io/pool"])}
    assert kept == {p.name for p in plan.gpu_pools} and kept != {p.name for p in plan.node_pools}
    [address] = [r for r in relabel if r.get("target_label") == "__address__"]
    assert address["replacement"] == f"$1:{wellknown.GPU_HEALTH_AGENT_METRICS_PORT}"
    listen = render_cluster(plan)[f"pool-{plan.gpu_pools[0].name}"][gpu_metrics.AGENT_SOCKET_PATH].content
    assert f"\nListenStream={wellknown.GPU_HEALTH_AGENT_METRICS_PORT}\n" in listen
    assert relabel.index(keep) < relabel.index(address)  # the others are never scraped, not just relabelled


@pytest.mark.parametrize("stack", ["research-2500", "research-7500"])
def test_the_controllers_job_names_every_apiserver_where_its_socket_listens(plans: dict[str, ClusterPlan],
                                                                            stack: str) -> None:
    plan = plans[stack]
    controllers = job(plan, monitoring.JOB_GPU_HEALTH_CONTROLLER)
    targets = {group["labels"]["host"]: group["targets"] for group in controllers["static_configs"]}
    hosts = render_cluster(plan)
    for name in [i.name for i in plan.control_plane.instances]:
        listen = unit(hosts[name][gpu_metrics.CONTROLLER_SOCKET_PATH].content)["Socket"]["ListenStream"]
        assert targets.pop(name) == [listen], name
    assert targets == {}


def test_without_gpu_pools_there_is_nothing_of_it_to_scrape(plans: dict[str, ClusterPlan]) -> None:
    plan = plans["local"]
    names = {j["job_name"] for j in yaml.safe_load(monitoring.scrape_config(plan))["scrape_configs"]}
    assert not {monitoring.JOB_GPU_HEALTH_AGENT, monitoring.JOB_GPU_HEALTH_CONTROLLER} & names
    assert not [a for a in monitoring.alerts(plan) if a.name.startswith("KilonodeGpuHealth")]


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_prometheus_reaches_both_ports_and_the_control_plane_admits_no_other_pool(
        graphs: dict[str, Graph], plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    assert plan.prometheus is not None
    pools = {str(p.subnet) for p in plan.node_pools}
    control = [r for r in nsg_rules_for(graphs[stack], "control-plane")
               if r["access"] == "Allow" and covers_port(r, wellknown.GPU_HEALTH_CONTROLLER_METRICS_PORT)]
    if plan.gpu_pools:
        # plain HTTP: the Prometheus pool's subnet alone (kilonode.azure.network)
        assert {s for r in control for s in sources(r)} == {
            str(p.subnet) for p in plan.node_pools if p.name == plan.prometheus.pool}
        # the agents' port: the pools' NSG admits every pool (pods talk to pods); the node
        # firewall keeps it to the scraper (tests/render/test_node_ports.py)
        for pool in plan.gpu_pools:
            rules = [r for r in nsg_rules_for(graphs[stack], f"pool-{pool.name}")
                     if r["access"] == "Allow" and covers_port(r, wellknown.GPU_HEALTH_AGENT_METRICS_PORT)]
            assert pools <= {s for r in rules for s in sources(r)}, pool.name
    else:
        assert control == []  # no controller, no opening
    priorities = [r["priority"] for r in nsg_rules_for(graphs[stack], "control-plane")]
    assert len(priorities) == len(set(priorities))


@pytest.mark.parametrize("stack", STACKS)
def test_the_series_estimate_counts_the_agents_on_gpu_nodes_and_the_controllers_on_the_apiservers(
        plans: dict[str, ClusterPlan], stack: str) -> None:
    plan = plans[stack]
    p = plan.prometheus
    assert p is not None
    for pool in plan.node_pools:
        agent_series = 0 if not pool.gpus_per_node else (
            defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_NODE + defaults.PROMETHEUS_GPU_AGENT_FINDING_SERIES
            + defaults.PROMETHEUS_GPU_AGENT_SERIES_PER_GPU * pool.gpus_per_node)
        without = (defaults.PROMETHEUS_SERIES_PER_KUBELET + defaults.PROMETHEUS_CADVISOR_SERIES_PER_CONTAINER
                   * pool.max_pods + defaults.PROMETHEUS_KSM_SERIES_PER_NODE
                   + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_NODE
                   + defaults.PROMETHEUS_POD_TRAFFIC_SERIES_PER_POD * pool.max_pods
                   + node_exporter_series(pool) + dcgm_exporter_series(pool))
        assert per_node_series(pool) == without + agent_series, pool.name
    controllers = [t for t in p.terms if t.what.startswith("GPU health taint controllers")]
    if plan.gpu_pools:
        assert [(t.targets, t.per_target) for t in controllers] == [
            (len(plan.control_plane.instances), defaults.PROMETHEUS_SERIES_PER_GPU_HEALTH_CONTROLLER)]
    else:
        assert controllers == []
    if stack == "research-7500":
        # 7,500 8-GPU nodes: 18 fixed + 2 findings + 3 x 8 figures = 44 each, 330,000 in all
        gpu_terms = [t for t in p.terms if "GPU health agent of 8 GPUs" in t.what]
        assert sum(t.targets for t in gpu_terms) == 7_500 and per_node_series(gpu := plan.gpu_pools[0]) - (
            1_200 + 3 * gpu.max_pods + 40 + 3 + 4 * gpu.max_pods
            + node_exporter_series(gpu) + dcgm_exporter_series(gpu)) == 44
