"""The metadata block: every pool role of every shipped stack drops pods' traffic to Azure's
instance metadata service and WireServer, in its user-data, loaded before the kubelet, which
requires it; the rules are data, checked before they are written."""

from __future__ import annotations

import pytest

from kilonode.plan.wellknown import AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS
from kilonode.render import metadata_block
from kilonode.render.files import USER_DATA
from kilonode.render.metadata_block import METADATA_RULES, MetadataRule, ruleset
from tests import shared


def pool_roles(stack: str) -> dict[str, dict[str, str]]:
    """Each pool role of the stack's render (pool-<name>, pool-<name>.team-<team>): path -> text."""
    roles = {host: {path: f.content for path, f in files.items()}
             for host, files in shared.rendered(stack).items() if host.startswith("pool-")}
    plan = shared.plan(stack)
    assert set(roles) == {pool.role(team) for pool in plan.node_pools for team in (None, *pool.teams)}
    return roles


@pytest.mark.parametrize("stack", shared.SHIPPED_STACKS)
def test_every_pool_role_drops_pods_traffic_to_imds_and_the_wireserver_from_its_user_data(stack: str) -> None:
    for role, files in pool_roles(stack).items():
        nft = files[metadata_block.RULESET]
        assert f"ip daddr {AZURE_IMDS_ADDRESS} counter drop" in nft, role
        assert f"ip daddr {AZURE_WIRESERVER_ADDRESS} tcp dport {{ 80, 32526 }} counter drop" in nft, role
        assert "type filter hook forward priority filter - 10; policy accept;" in nft, role
        data = shared.load_yaml(files[USER_DATA])
        written = {f["path"]: f["content"] for f in data["write_files"]}
        # what the node writes is the rule file and the unit, byte for byte
        assert written[f"/{metadata_block.RULESET}"] == nft
        assert written[f"/{metadata_block.UNIT}"] == files[metadata_block.UNIT]
        assert f"ExecStart=/usr/sbin/nft -f /{metadata_block.RULESET}" in files[metadata_block.UNIT]
        # started by cloud-init before the kubelet, and the kubelet will not start without it
        [start] = [cmd for cmd in data["runcmd"] if cmd[:3] == ["systemctl", "enable", "--now"]
                   and "kubelet.service" in cmd]
        assert start.index(metadata_block.UNIT_NAME) < start.index("kubelet.service"), role
        kubelet = files["etc/systemd/system/kubelet.service"]
        assert f"Requires={metadata_block.UNIT_NAME}" in kubelet and f"After={metadata_block.UNIT_NAME}" in kubelet
        assert "ConditionPathExists" not in files[metadata_block.UNIT]  # fails closed, never skipped


def test_the_ruleset_replaces_its_own_table_only() -> None:
    text = ruleset()
    table = metadata_block.TABLE
    assert text.splitlines()[4:7] == [f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{"]
    assert "flush ruleset" not in text  # kube-proxy's, Docker's and azure-vnet's tables stay
    assert "hook output" not in text and "hook input" not in text  # the host keeps both


def test_host_and_pod_rules_are_checked_before_they_are_written() -> None:
    assert [r.address for r in METADATA_RULES] == [AZURE_IMDS_ADDRESS, AZURE_WIRESERVER_ADDRESS]
    assert MetadataRule("10.1.2.3", (443,), "a reason").statement() == (
        'ip daddr 10.1.2.3 tcp dport { 443 } counter drop comment "a reason"')
    for bad in [("169.254.169.2544", (), "r"), ("169.254.169.254/32", (), "r"), ("fe80::1", (), "r"),
                ("168.63.129.16", (0,), "r"), ("168.63.129.16", (80, 80), "r"), ("168.63.129.16", (70000,), "r"),
                ("168.63.129.16", (80,), 'a "quoted" reason'), ("168.63.129.16", (80,), "two\nlines"),
                ("168.63.129.16", (80,), ""), ("168.63.129.16", (80,), "x" * 129)]:
        with pytest.raises(ValueError):
            MetadataRule(*bad)
