"""preflight's `listeners` check: the shipped stacks keep every unauthenticated port to its
scraper, and each seeded break (an NSG rule widened, a node firewall rule dropped or loosened, a
socket bound to every address, kube-proxy's or the runtime's listener widened, a listener no
catalogue row describes, the reserved-pools policy missing, a user's workload tolerating a reserved
pool) is named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from kilonode.preflight import run
from kilonode.render import node_ports
from kilonode.render.files import USER_DATA
from tests.preflight.conftest import artefacts, inputs_of, resource

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not

CHECK = ["listeners"]


def found(stack: str, files: dict[str, str] | None = None,
          graph: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    return [(f.level, f.where, f.what) for f in run(inputs_of(stack, files=files, graph=graph), CHECK)]


def breaks(stack: str, files: dict[str, str] | None = None, graph: dict[str, Any] | None = None) -> str:
    return "\n".join(f"{where}: {what}" for level, where, what in found(stack, files, graph) if level == "break")


def test_the_large_stacks_keep_every_unauthenticated_port_to_their_scraper() -> None:
    assert found("research-7500") == [] and found("research-2500") == []


def test_the_local_stacks_prometheus_shares_its_pool_with_users_pods_and_says_so() -> None:
    [(level, where, what)] = found("local")
    assert (level, where) == ("warn", "pool-cpu")
    assert "users' pods run too" in what and "10.0.2.0/27" in what


def nsg_rule(graph: dict[str, Any], nsg: str, name: str) -> dict[str, Any]:
    [group] = [r for r in graph["resources"] if r["type"].endswith(":NetworkSecurityGroup") and r["name"].endswith(nsg)]
    [rule] = [r for r in group["inputs"]["securityRules"] if r["name"] == name]
    return rule


@pytest.mark.parametrize(("nsg", "rule", "port"), [
    ("-etcd-nsg", "allow-etcd-metrics-from-monitoring", 2381),
    ("-etcd-nsg", "allow-cert-metrics-from-monitoring", 9479),
    ("-control-plane-nsg", "allow-cert-metrics-from-monitoring", 9479),
    ("-control-plane-nsg", "allow-gpu-health-metrics-from-monitoring", 9482),
])
def test_a_monitoring_rule_widened_to_the_vnet_lets_every_pool_in(nsg: str, rule: str, port: int) -> None:
    files, graph = artefacts("research-7500")
    widened = nsg_rule(graph, nsg, rule)
    widened.pop("sourceAddressPrefixes", None)
    widened["sourceAddressPrefix"] = "VirtualNetwork"
    said = breaks("research-7500", files, graph)
    for pool in ("a100-ib", "h100-ib", "system"):
        assert f"pool-{pool} -> TCP {port}" in said and f"by rule {rule}" in said, said
    assert "pool-monitoring ->" not in said  # the scraper itself is meant to


def test_a_rule_widened_to_part_of_one_pool_is_seen() -> None:
    files, graph = artefacts("research-7500")
    rule = nsg_rule(graph, "-etcd-nsg", "allow-etcd-metrics-from-monitoring")
    rule["sourceAddressPrefixes"] = [*rule["sourceAddressPrefixes"], "10.0.130.0/24"]  # inside a100-ib's /17
    said = breaks("research-7500", files, graph)
    assert "pool-a100-ib -> TCP 2381" in said and "pool-h100-ib" not in said


def edit_written(files: dict[str, str], host: str, path: str, old: str, new: str | None) -> None:
    """Replace text in a file the role's user-data writes (what its nodes are given); None: drop
    every line holding it."""
    data = yaml.load(files[f"{host}/{USER_DATA}"], Loader=yaml.CSafeLoader)
    [entry] = [f for f in data["write_files"] if f["path"] == f"/{path}"]
    assert old in entry["content"], (host, path, old)
    entry["content"] = (entry["content"].replace(old, new) if new is not None else
                        "".join(line for line in entry["content"].splitlines(keepends=True) if old not in line))
    files[f"{host}/{USER_DATA}"] = "#cloud-config\n" + yaml.safe_dump(data)


RULE = node_ports.RULESET


@pytest.mark.parametrize(("host", "old", "new", "said"), [
    # the pods on a GPU node reach its per-pod traffic port (a root process), the agent's metrics and the
    # exporters' (node-exporter 9100, dcgm-exporter 9400)
    ("pool-h100-ib", 'iifname "azv*" tcp dport { 9100, 9400, 9480, 9481 } counter drop', None,
     "a pod on the node, from any address (10.0.2.64/28) on TCP 9480 (pod-traffic): accept"),
    # the drop-all at the end gone: every other pool reaches the system pool's autoscaler metrics
    ("pool-system", "\t\ttcp dport { 8085, 9100, 9480 } counter drop", "\t\ttcp dport { 8085, 9100, 9480 } counter",
     "pods of pool a100-ib (10.0.128.0/17) on TCP 8085 (cluster-autoscaler): accept (policy)"),
    # the scraper's rule widened to the VNet
    ("pool-a100-ib", "ip saddr 10.0.2.64/28", "ip saddr 10.0.0.0/16",
     "pods of pool h100-ib (10.0.64.0/18) on TCP 9480 (pod-traffic): accept"),
    # a port left out of the set
    ("pool-a100-ib.team-vision", "{ 9100, 9400, 9480, 9481 }", "{ 9100, 9400, 9480 }",
     "on TCP 9481 (gpu-health-agent-metrics): accept (policy)"),
    # Prometheus's own port open to every pod
    ("pool-monitoring", 'oifname "azv*" tcp dport 9090 counter drop', None,
     "pods of pool a100-ib (10.0.128.0/17) to Prometheus on TCP 9090: accept (policy)"),
    # the scraper shut out
    ("pool-h100-ib", "ip saddr 10.0.2.64/28 tcp dport { 9100, 9400, 9480, 9481 } accept", None,
     "the cluster's Prometheus (10.0.2.64/28) on TCP 9480 (pod-traffic): drop"),
    # the node's own probes shut out (the autoscaler's liveness probe)
    ("pool-system", 'iifname "lo" tcp dport { 8085, 9100, 9480 } accept', None,
     "the node itself (127.0.0.1/32) on TCP 8085 (cluster-autoscaler): drop"),
    # a statement the reader does not understand decides nothing it cannot vouch for
    ("pool-h100-ib", "ip saddr 10.0.2.64/28 tcp dport { 9100, 9400, 9480, 9481 } accept",
     "ct state new ip saddr 10.0.2.64/28 tcp dport { 9100, 9400, 9480, 9481 } accept", ": unknown"),
])
def test_a_node_firewall_rule_dropped_or_loosened_is_a_break(host: str, old: str, new: str | None, said: str) -> None:
    files, _ = artefacts("research-7500")
    edit_written(files, host, RULE, old, new)
    text = breaks("research-7500", files)
    assert f"{host}: the node firewall does not keep" in text and said in text, text


@pytest.mark.parametrize(("path", "old", "said"), [
    (node_ports.UNIT, f"ExecStart=/usr/sbin/nft -f /{RULE}", "no kilonode-node-ports.service loads it"),
    ("etc/systemd/system/kubelet.service", f"Requires={node_ports.UNIT_NAME}",
     "kubelet.service neither requires nor waits for kilonode-node-ports.service"),
    ("etc/systemd/system/kilonode-pod-traffic.socket", f"After={node_ports.UNIT_NAME}",
     "kilonode-pod-traffic.socket neither requires nor waits"),
])
def test_a_firewall_that_is_not_loaded_first_is_a_break(path: str, old: str, said: str) -> None:
    files, _ = artefacts("research-2500")
    edit_written(files, "pool-nc-a100", path, old, None)
    text = breaks("research-2500", files)
    assert "pool-nc-a100: the node firewall does not keep" in text and said in text, text


def test_a_firewall_cloud_init_does_not_start_is_a_break() -> None:
    files, _ = artefacts("research-2500")
    data = yaml.safe_load(files[f"pool-system/{USER_DATA}"])
    for command in data["runcmd"]:
        if node_ports.UNIT_NAME in command:
            command.remove(node_ports.UNIT_NAME)
    files[f"pool-system/{USER_DATA}"] = "#cloud-config\n" + yaml.safe_dump(data)
    assert "cloud-init does not start kilonode-node-ports.service" in breaks("research-2500", files)


def test_a_socket_bound_to_every_address_is_a_break() -> None:
    files, _ = artefacts("research-7500")
    key = "apiserver-2/etc/systemd/system/kilonode-cert-metrics.socket"
    files[key] = files[key].replace("ListenStream=10.0.0.12:9479", "ListenStream=9479")
    text = breaks("research-7500", files)
    assert "apiserver-2: etc/systemd/system/kilonode-cert-metrics.socket:9" in text
    assert "listens on every address:9479, where its catalogue row binds host" in text


@pytest.mark.parametrize(("field", "value", "said"), [
    ("metricsBindAddress", "0.0.0.0:10249", "metricsBindAddress: kube-proxy (host network) listens on every address"),
    ("healthzBindAddress", None, "healthzBindAddress: kube-proxy (host network) listens on every address:10256"),
])
def test_kube_proxys_listeners_off_loopback_are_a_break(field: str, value: str | None, said: str) -> None:
    files, graph = artefacts("research-7500")
    config_map = resource(graph, "ConfigMap", "kube-proxy")
    config = yaml.safe_load(config_map["inputs"]["data"]["config.conf"])
    if value is None:
        del config[field]  # upstream's default: every address
    else:
        config[field] = value
    config_map["inputs"]["data"]["config.conf"] = yaml.safe_dump(config)
    assert said in breaks("research-7500", files, graph)


@pytest.mark.parametrize(("stack", "path", "old"), [
    ("research-7500", "pool-system/etc/systemd/system/cri-docker.service", " \\\n    --streaming-bind-addr=127.0.0.1"),
    ("research-2500", "pool-nc-a100/etc/containerd/config.toml", 'stream_server_address = "127.0.0.1"\n'),
])
def test_the_runtimes_streaming_server_on_every_address_is_a_break(stack: str, path: str, old: str) -> None:
    files, _ = artefacts(stack)
    assert old in files[path]
    files[path] = files[path].replace(old, "")
    text = breaks(stack, files)
    runtime = "cri-dockerd" if path.endswith(".service") else "containerd CRI plugin"
    assert f"{runtime} (exec, attach and port-forward streams) listens on every address" in text, text


def test_a_listener_no_row_describes_is_a_break() -> None:
    files, graph = artefacts("research-7500")
    files["pool-h100-ib/etc/systemd/system/debug.socket"] = "[Socket]\nListenStream=7777\n"
    workload = resource(graph, "Deployment", "cluster-autoscaler")
    workload["inputs"]["spec"]["template"]["spec"]["containers"][0]["ports"].append(
        {"name": "debug", "containerPort": 6060})
    text = breaks("research-7500", files, graph)
    assert "etc/systemd/system/debug.socket:2 listens on TCP 7777" in text
    assert "Deployment kube-system/cluster-autoscaler port 6060 listens on TCP 6060" in text


def test_without_the_reserved_pools_policy_the_taints_reserve_nothing() -> None:
    files, graph = artefacts("research-7500")
    graph["resources"] = [r for r in graph["resources"]
                          if (r["inputs"].get("metadata") or {}).get("name") != "kilonode-reserved-pools"]
    text = breaks("research-7500", files, graph)
    assert "pools system, monitoring are reserved by taints alone" in text


def test_a_users_workload_that_tolerates_a_reserved_pool_is_a_break() -> None:
    files, graph = artefacts("research-7500")
    balloon = next(r for r in graph["resources"] if r["type"].endswith(":Deployment")
                   and (r["inputs"].get("metadata") or {}).get("namespace") == "kilonode-capacity")
    balloon["inputs"]["spec"]["template"]["spec"]["tolerations"] = [{"operator": "Exists"}]
    text = breaks("research-7500", files, graph)
    assert "tolerates every taint of reserved pools system, monitoring from namespace kilonode-capacity" in text
