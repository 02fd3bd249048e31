"""Seed 000 entry 7: the proxy's address from the guest agent's interfaces."""

from __future__ import annotations

from typing import Any

import pytest

from provisioning.proxmox.addresses import pick_address


def _iface(name: str, *ips: str) -> dict[str, Any]:
    return {
        "name": name,
        "hardware-address": "bc:24:11:d2:47:9a",
        "ip-addresses": [
            {"ip-address": ip, "ip-address-type": "ipv6" if ":" in ip else "ipv4", "prefix": 24}
            for ip in ips
        ],
    }


LO = _iface("lo", "127.0.0.1", "::1")


@pytest.mark.parametrize(
    ("interfaces", "expected"),
    [
        # Right after boot: only lo, or eth0 with only IPv6 link-local (pve-reference §7.19).
        ([], None),
        ([LO], None),
        ([LO, _iface("eth0", "fe80::be24:11ff:fed2:479a")], None),
        ([LO, {"name": "eth0", "hardware-address": "bc:24:11:d2:47:9a"}], None),
        # Booted: the shape of the captured answer (pve-reference examples).
        ([LO, _iface("eth0", "10.20.0.57", "fe80::be24:11ff:fed2:479a")], "10.20.0.57"),
        ([LO, _iface("eth0", "fe80::1", "192.168.4.23")], "192.168.4.23"),
        # Link-local and unspecified IPv4 are never the address.
        ([LO, _iface("eth0", "169.254.10.1", "0.0.0.0", "10.20.0.57")], "10.20.0.57"),  # noqa: S104
        # The agent's order decides between interfaces and within one.
        ([_iface("eth0", "10.0.0.5", "10.0.0.6"), _iface("eth1", "10.1.0.5")], "10.0.0.5"),
        ([LO, _iface("eth0", "fe80::1"), _iface("eth1", "10.1.0.5")], "10.1.0.5"),
        # A loopback address on another interface is still loopback.
        ([_iface("dummy0", "127.0.0.2"), _iface("eth0", "10.0.0.5")], "10.0.0.5"),
        # Odd entries from the guest are skipped, not fatal.
        ([{"name": "eth0", "ip-addresses": [{"ip-address": "not-an-ip"}, {}]}], None),
        ([{"name": "eth0", "ip-addresses": "10.0.0.1"}, _iface("eth1", "10.0.0.9")], "10.0.0.9"),
    ],
)
def test_pick_address_table(interfaces: list[dict[str, Any]], expected: str | None) -> None:
    assert pick_address(interfaces) == expected
