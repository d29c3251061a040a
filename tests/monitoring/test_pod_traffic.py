"""Per-pod network accounting, from the node to the query: every pool role renders the table,
config and units and starts them from its user-data, and every pool image carries the program
they run; the units pass systemd-analyze;
the nft ruleset is what the program's sets expect; Prometheus' own parser reads the exposition
with hostile pod names; the scrape job reaches each node's port, which the pools' NSG admits
from the pools; and the per-namespace recording rule, evaluated by promtool, sums each
namespace's pods across nodes. The counting itself runs on a booted node:
node-image/verify/test_pod_traffic.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kilonode.azure.graph import Graph
from kilonode.node import pod_traffic as program
from kilonode.node.ship import POD_TRAFFIC, programs_for
from kilonode.plan import ClusterPlan, wellknown
from kilonode.render import monitoring, node_ports, pod_traffic
from kilonode.render.files import USER_DATA, RenderedFile
from tests import shared
from tests.azure.conftest import covers_port, nsg_rules_for, sources
from tests.node.test_pod_traffic import hostile_snapshot
from tests.render.consumers import systemd_verify, verify_rendered_units


def check_metrics(promtool: Path, text: str) -> str:
    result = subprocess.run([str(promtool), "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60, check=False)
    return result.stdout + result.stderr


def test_prometheus_parses_the_exposition_with_hostile_names(promtool: Path) -> None:
    out = check_metrics(promtool, program.metrics(hostile_snapshot()))
    # `check metrics` also lints (and exits 1 on findings); a parse failure says "error while linting"
    assert "error while linting" not in out, out
    # the same check refuses a label value whose quote is not escaped (so it can fail)
    broken = '# TYPE x counter\nx{pod="a"b"} 1\n'
    assert "error while linting" in check_metrics(promtool, broken)


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_pool_role_counts_its_pods_traffic_from_its_user_data(stack: str) -> None:
    for host, files in shared.rendered(stack).items():
        if not host.startswith("pool-"):
            assert pod_traffic.SOCKET_UNIT not in files, host  # the pools' nodes only
            continue
        data = shared.load_yaml(files[USER_DATA].content)
        written = {f["path"]: f["content"] for f in data["write_files"]}
        for path in (pod_traffic.RULESET, pod_traffic.CONFIG_PATH, pod_traffic.TABLE_UNIT,
                     pod_traffic.SYNC_UNIT, pod_traffic.PATH_UNIT, pod_traffic.SOCKET_UNIT, pod_traffic.SERVE_UNIT):
            assert written[f"/{path}"] == files[path].content, (host, path)
        # the program is the pool image's (kilonode.node.ship), not the custom data's
        assert pod_traffic.SCRIPT_PATH not in files and f"/{pod_traffic.SCRIPT_PATH}" not in written, host
        [start] = [cmd for cmd in data["runcmd"] if cmd[:3] == ["systemctl", "enable", "--now"]
                   and "kubelet.service" in cmd]
        assert set(pod_traffic.UNIT_NAMES) <= set(start), host
        assert start.index("kilonode-pod-traffic-table.service") < start.index("kubelet.service")
        # accounting never stops a node from running pods
        assert "kilonode-pod-traffic" not in files["etc/systemd/system/kubelet.service"].content


def test_every_pool_image_and_no_control_plane_image_carries_the_program_executable() -> None:
    assert POD_TRAFFIC.machine_path == f"/{pod_traffic.SCRIPT_PATH}" and POD_TRAFFIC.mode == 0o755
    assert POD_TRAFFIC.path == Path(program.__file__)
    for extras in ((), ("gpu",), ("gpu", "infiniband")):
        assert POD_TRAFFIC in programs_for(None, extras)
    assert POD_TRAFFIC not in programs_for("etcd") + programs_for("control-plane")


def test_the_ruleset_declares_the_sets_the_program_fills_and_decides_nothing() -> None:
    text = pod_traffic.ruleset()
    assert text.splitlines()[4:7] == [f"table inet {pod_traffic.TABLE}", f"delete table inet {pod_traffic.TABLE}",
                                      f"table inet {pod_traffic.TABLE} {{"]
    declared = re.findall(r"set (\w+) \{\n\t\ttype ipv(\d)_addr\n\t\tsize (\d+)\n\t\tcounter\n", text)
    assert [(name, int(v)) for name, v, _ in declared] == [(n, v) for n, v, _ in program.SETS]
    assert {int(size) for *_, size in declared} == {pod_traffic.MAX_ADDRESSES}
    assert re.findall(r"\t\t(ip6?) (saddr|daddr) @(\w+)\n", text) == [
        ("ip", "saddr", "pods_out_v4"), ("ip", "daddr", "pods_in_v4"),
        ("ip6", "saddr", "pods_out_v6"), ("ip6", "daddr", "pods_in_v6")]
    rules = [line for line in text.splitlines() if line.startswith("\t\t") and "type filter hook" not in line]
    for verdict in ("accept", "drop", "reject", "jump", "goto", "queue"):
        assert not any(re.search(rf"\b{verdict}\b", line) for line in rules), verdict
    assert "policy accept" in text and "flush ruleset" not in text
    # nft's own parser (set-up installs nftables; the VM loads the ruleset for real)
    if not shutil.which("nft"):
        pytest.fail("nft missing: run `make setup` (installs nftables, .ci/debian-packages.txt)")
    check = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True, timeout=30,
                           check=False)
    assert check.returncode == 0 or "Operation not permitted" in check.stderr, check.stderr


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # with the node firewall its socket requires (kilonode.render.node_ports)
    files = {**pod_traffic.pod_traffic_files(), node_ports.UNIT: RenderedFile(node_ports.unit())}
    assert verify_rendered_units(tmp_path, files, (
        pod_traffic.TABLE_UNIT, pod_traffic.SYNC_UNIT, pod_traffic.PATH_UNIT, pod_traffic.SOCKET_UNIT,
        pod_traffic.SERVE_UNIT, node_ports.UNIT)) == []
    broken = tmp_path / "broken"
    broken.mkdir()
    name = Path(pod_traffic.PATH_UNIT).name
    (broken / name).write_text(files[pod_traffic.PATH_UNIT].content.replace("PathChanged=", "PathChange="))
    assert any("PathChange" in line for line in systemd_verify(broken, [broken / name]))


@pytest.mark.parametrize("stack", ["local", "research-7500"])
def test_prometheus_in_the_pools_reaches_every_nodes_port(graphs: dict[str, Graph], plans: dict[str, ClusterPlan],
                                                          stack: str) -> None:
    plan = plans[stack]
    [job] = [j for j in yaml.safe_load(monitoring.scrape_config(plan))["scrape_configs"]
             if j["job_name"] == monitoring.JOB_POD_TRAFFIC]
    [address] = [r for r in job["relabel_configs"] if r.get("target_label") == "__address__"]
    assert address["source_labels"] == ["__meta_kubernetes_node_address_InternalIP"]
    assert address["replacement"] == f"$1:{wellknown.POD_TRAFFIC_METRICS_PORT}"
    listen = pod_traffic.pod_traffic_files()[pod_traffic.SOCKET_UNIT].content
    assert f"\nListenStream={wellknown.POD_TRAFFIC_METRICS_PORT}\n" in listen
    pools = {str(p.subnet) for p in plan.node_pools}
    for pool in plan.node_pools:
        rules = [r for r in nsg_rules_for(graphs[stack], f"pool-{pool.name}")
                 if r["access"] == "Allow" and covers_port(r, wellknown.POD_TRAFFIC_METRICS_PORT)]
        assert pools <= {s for r in rules for s in sources(r)}, pool.name


def test_the_namespace_rate_sums_each_namespaces_pods_across_nodes(promtool: Path, plans: dict[str, ClusterPlan],
                                                                   tmp_path: Path) -> None:
    (tmp_path / monitoring.RULES_FILE).write_text(monitoring.alert_rules(plans["local"]))
    job = f'job="{monitoring.JOB_POD_TRAFFIC}"'
    metric = "kilonode_pod_network_bytes_total"
    series = [
        # team-a: 1,000 B/s out of a pod on one node, 500 B/s out of another on a second node
        (f'{metric}{{{job},node="n1",namespace="team-a",pod="a-0",direction="out"}}', "0+60000x20"),
        (f'{metric}{{{job},node="n2",namespace="team-a",pod="a-1",direction="out"}}', "0+30000x20"),
        # team-b: 100 B/s in, with a counter reset (an address that changed owner) at 10m
        (f'{metric}{{{job},node="n1",namespace="team-b",pod="b-0",direction="in"}}', "0+6000x10 0+6000x10"),
        # another job's series of the same name is not ours
        (f'{metric}{{job="other",node="n1",namespace="team-a",pod="x",direction="out"}}', "0+600000x20"),
    ]
    test = {"rule_files": [monitoring.RULES_FILE], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        # rounded: rate's extrapolation leaves float noise (1500.0000000000002)
        "promql_expr_test": [{"expr": f"round({monitoring.POD_TRAFFIC_NAMESPACE_RATE})", "eval_time": "18m",
                              "exp_samples": [
            {"labels": '{namespace="team-a",direction="out"}', "value": 1500},
            {"labels": '{namespace="team-b",direction="in"}', "value": 100},
        ]}],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # and it can fail: the wrong sum is refused
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False).replace("value: 1500", "value: 1000"))
    wrong = subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, check=False)
    assert wrong.returncode != 0
