"""Seed 000 entry 7 and seed 003's readiness rule: the proxy's address is an IPv4 on the
interface whose MAC is net0's, never a docker, tun or loopback address."""

from __future__ import annotations

from typing import Any

import pytest

from provisioning.proxmox.addresses import pick_address
from provisioning.proxmox.netcfg import net0_mac

NET0 = "bc:24:11:d2:47:9a"


def _iface(name: str, *ips: str, mac: str = NET0) -> dict[str, Any]:
    return {
        "name": name,
        "hardware-address": mac,
        "ip-addresses": [
            {"ip-address": ip, "ip-address-type": "ipv6" if ":" in ip else "ipv4", "prefix": 24}
            for ip in ips
        ],
    }


LO = _iface("lo", "127.0.0.1", "::1", mac="00:00:00:00:00:00")
DOCKER = _iface("docker0", "172.17.0.1", "fe80::42:acff:fe11:1", mac="02:42:ac:11:00:01")
TUN = {"name": "tun0", "ip-addresses": [{"ip-address": "10.8.0.1", "ip-address-type": "ipv4"}]}


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        # Right after boot: only lo, or eth0 with only IPv6 link-local (pve-reference §7.19).
        ([], None),
        ([LO], None),
        ([LO, _iface("eth0", "fe80::be24:11ff:fed2:479a")], None),
        ([LO, {"name": "eth0", "hardware-address": NET0}], None),
        # Booted: the shape of the captured answer (pve-reference examples).
        ([LO, _iface("eth0", "10.20.0.57", "fe80::be24:11ff:fed2:479a")], "10.20.0.57"),
        ([LO, _iface("eth0", "fe80::1", "192.168.4.23")], "192.168.4.23"),
        # Link-local and unspecified IPv4 are never the address.
        ([LO, _iface("eth0", "169.254.10.1", "0.0.0.0", "10.20.0.57")], "10.20.0.57"),  # noqa: S104
        # Within net0's interface, the agent's order decides.
        ([_iface("eth0", "10.0.0.5", "10.0.0.6")], "10.0.0.5"),
        # Several interfaces: docker and tun listed first never win (seed 003).
        ([LO, DOCKER, TUN, _iface("eth0", "10.20.0.57")], "10.20.0.57"),
        ([DOCKER, TUN, LO, _iface("ens18", "fe80::1", "10.20.0.58")], "10.20.0.58"),
        # net0's interface has only IPv6 while others have IPv4: no address yet.
        ([LO, DOCKER, TUN, _iface("eth0", "2001:db8::5", "fe80::1")], None),
        # No interface carries net0's MAC: no address, whatever else has one.
        ([LO, DOCKER, TUN, _iface("eth1", "10.1.0.5", mac="bc:24:11:00:00:01")], None),
        # The MAC is matched whatever its case (Proxmox writes upper, the agent lower).
        ([_iface("eth0", "10.0.0.7", mac=NET0.upper())], "10.0.0.7"),
        # A loopback interface never counts, even one the guest gave net0's MAC.
        ([_iface("lo", "10.0.0.9"), _iface("eth0", "10.0.0.5")], "10.0.0.5"),
        ([_iface("eth0", "127.0.0.2", "10.0.0.5")], "10.0.0.5"),
        # Odd entries from the guest are skipped, not fatal.
        ([{"name": "eth0", "hardware-address": NET0, "ip-addresses": [{}, "x"]}], None),
        (
            [{"hardware-address": NET0, "ip-addresses": "1.2.3.4"}, _iface("e", "10.0.0.9")],
            "10.0.0.9",
        ),
    ],
)
def test_pick_address_table(interfaces: list[dict[str, Any]], expected: str | None) -> None:
    assert pick_address(interfaces, mac=NET0) == expected


def test_no_net0_means_no_address() -> None:
    # A VM without net0 (or one whose MAC cannot be read) has no address a proxy is reached at.
    assert pick_address([_iface("eth0", "10.0.0.5")], mac=None) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("virtio=BC:24:11:D2:47:9A,bridge=vmbr0,firewall=1", NET0),
        ("bridge=vmbr0,e1000-82540em=BC:24:11:D2:47:9A", NET0),
        ("model=virtio,macaddr=BC:24:11:D2:47:9A,bridge=vmbr0", NET0),
        ("virtio,bridge=vmbr0", None),
        ("", None),
        (None, None),
    ],
)
def test_net0_mac(value: object, expected: str | None) -> None:
    assert net0_mac(value) == expected
