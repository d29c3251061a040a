"""Networking: networkd configures the synthetic NIC only. With accelerated networking,
Azure adds a virtual function with the synthetic NIC's MAC on another driver (mlx4/mlx5,
mana); the local verify adds a vmxnet3 NIC with the same MAC in its place. Matching by name
(eth*) would run DHCP on both."""

from __future__ import annotations

import pytest
import testinfra

from kilonode.image.probes import run_ok

SYNTHETIC_DRIVERS = {"hv_netvsc", "virtio_net"}

# name, MAC and driver of every interface backed by a device (not lo, docker0, veths)
LIST = (
    'for d in /sys/class/net/*; do [ -e "$d/device/driver" ] || continue; '
    'echo "${d##*/} $(cat "$d/address") $(basename "$(readlink -f "$d/device/driver")")"; done'
)


def interfaces(host: testinfra.host.Host) -> list[tuple[str, str, str]]:
    links = [tuple(line.split()) for line in run_ok(host, LIST).splitlines() if line.strip()]
    assert all(len(link) == 3 for link in links), f"unexpected interface listing: {links}"
    return links  # type: ignore[return-value]


def setup_state(host: testinfra.host.Host, name: str) -> str:
    """networkd's SETUP column for one link: configured, unmanaged, ..."""
    for line in run_ok(host, "networkctl list --no-legend --no-pager").splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[1] == name:
            return fields[4]
    raise AssertionError(f"networkctl does not list {name}")


@pytest.mark.persistent
def test_networkd_configures_the_synthetic_nic_and_leaves_its_mac_twin_alone(host: testinfra.host.Host) -> None:
    links = interfaces(host)
    synthetic = [link for link in links if link[2] in SYNTHETIC_DRIVERS]
    assert len(synthetic) == 1, f"one synthetic NIC expected, found {links}"
    name, mac, driver = synthetic[0]
    assert setup_state(host, name) == "configured", f"{name} ({driver}) is not configured by networkd"
    twins = [link for link in links if link[1] == mac and link[0] != name]
    if not twins:
        pytest.skip(f"no other interface carries {mac} (accelerated networking off)")
    for twin, _, twin_driver in twins:
        state = setup_state(host, twin)
        addresses = run_ok(host, f"ip -4 -o addr show dev {twin}").strip()
        assert state == "unmanaged" and not addresses, (
            f"{twin} ({twin_driver}) shares {name}'s MAC {mac} but networkd {state} it: {addresses or 'no address'}"
        )
