"""connections: every address:port a rendered file calls, judged against the graph's NSGs; seeded
breaks (a rule removed, a call to a port nothing admits)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from kilonode.preflight import run
from kilonode.preflight.checks.connections import calls
from tests.preflight.conftest import artefacts, inputs_of

pytestmark = pytest.mark.medium  # over ~50 ms a test: `make test` runs it, `make test-fast` does not


def connection_breaks(stack: str, **planted: object) -> list[tuple[str, str]]:
    return [(f.where, f.what) for f in run(inputs_of(stack, **planted), ["connections"])  # type: ignore[arg-type]
            if f.level == "break"]


def without_rule(graph: dict[str, Any], rule: str) -> dict[str, Any]:
    for resource in graph["resources"]:
        if resource["type"] == "azure-native:network:NetworkSecurityGroup":
            rules = resource["inputs"].get("securityRules") or []
            resource["inputs"]["securityRules"] = [r for r in rules if r.get("name") != rule]
    return graph


def test_calls_are_every_address_and_port_but_the_hosts_own_and_loopback() -> None:
    files = {
        "etc/systemd/system/etcd.service": "--listen-client-urls=https://10.0.1.10:2379,https://127.0.0.1:2379\n"
                                           "--initial-cluster=a=https://10.0.1.10:2380,b=https://10.0.1.11:2380\n",
        "usr/local/lib/kilonode/etcd-join": "OTHERS='https://10.0.1.11:2379'\nversion 1.2.3.4 and 10.0.1.11:99999\n",
        "user-data": "OTHERS='https://10.0.1.11:2379'\n",
    }
    found = [(str(c.target), c.port, c.where) for c in calls(files, IPv4Network("10.0.1.10/32"))]
    assert found == [("10.0.1.11", 2380, "etc/systemd/system/etcd.service:2"),
                     ("10.0.1.11", 2379, "usr/local/lib/kilonode/etcd-join:1")]  # user-data last: the file is cited
    assert calls({"x": "10.0.1.12:2379"}, IPv4Network("10.0.1.0/24")) == []  # a pool's own subnet
    assert calls({"x": "10.0.1.12:2379"}, IPv4Network("10.0.2.0/24"))[0].target == IPv4Address("10.0.1.12")


def test_the_shipped_stacks_make_no_refused_connection() -> None:
    for stack in ("local", "research-2500", "research-7500"):
        assert connection_breaks(stack) == [], stack


def test_etcd_members_that_cannot_reach_their_peers_client_port_are_a_break() -> None:
    """etcd-join reads the member list from its peers' client URLs: an NSG that admits 2379
    only from the apiservers leaves a member that lost its disk unable to rejoin."""
    files, graph = artefacts("research-7500")
    found = connection_breaks("research-7500", files=files, graph=without_rule(graph, "allow-etcd-client-from-etcd"))
    members = {f"etcd-main-{i}" for i in range(5)} | {f"etcd-events-{i}" for i in range(3)}
    assert {where for where, _ in found} == members
    what = dict(found)["etcd-main-0"]
    assert what.startswith("it calls 10.0.1.11:2379 (usr/local/lib/kilonode/etcd-join:")
    assert "research-7500-network-etcd-nsg on subnet 10.0.1.0/24 refuses TCP 2379 from 10.0.1.10/32 " \
           "(rule deny-all-inbound)" in what


@pytest.mark.parametrize(("rule", "host", "port", "cited"), [
    ("allow-etcd-client-from-apiservers", "apiserver-0", 2379, "etc/systemd/system/kube-apiserver.service"),
    ("allow-etcd-peer-from-etcd", "etcd-events-0", 2380, "etc/systemd/system/etcd.service"),
])
def test_a_removed_rule_is_named_at_the_file_that_makes_the_call(rule: str, host: str, port: int, cited: str) -> None:
    files, graph = artefacts("research-7500")
    found = dict(connection_breaks("research-7500", files=files, graph=without_rule(graph, rule)))
    assert f"refuses TCP {port} from" in found[host] and f"({cited}:" in found[host], found.get(host)


def test_a_call_planted_in_a_script_is_judged_too() -> None:
    """Nothing lists the expected paths: a new probe in any rendered file is a new connection."""
    files, graph = artefacts("research-7500")
    files["pool-h100-ib/usr/local/lib/kilonode/probe"] = "curl -k https://10.0.1.10:2379/health\n"
    found = dict(connection_breaks("research-7500", files=files, graph=graph))
    assert "it calls 10.0.1.10:2379 (usr/local/lib/kilonode/probe:1), but" in found["pool-h100-ib"]
