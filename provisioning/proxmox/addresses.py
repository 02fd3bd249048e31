"""The address a proxy is reached at, from the QEMU guest agent (seed 000 entry 7).

The agent is the only address source the API offers (no ARP, no DHCP leases). Right after
boot it may list only ``lo``, or an interface still without IPv4 (pve-reference §7.19), so
"no address yet" is a normal answer and the proxy stays Provisioning.

Seed 003's readiness rule: an address counts only when it is an IPv4 on the interface whose MAC
is net0's. A guest also lists ``lo`` and whatever runs inside it (``docker0``, ``tun0``, a
bridge of its own; pve-reference §7.19), often before its real NIC and with addresses the proxy
is not reachable at, so the agent's order and the interface's name prove nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

# What guests name their loopback interface (Linux ``lo``; Windows' agent reports this one).
_LOOPBACK_NAMES = frozenset({"lo", "loopback pseudo-interface 1"})


def _usable_ipv4(text: object) -> str | None:
    if not isinstance(text, str):
        return None
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if address.version != 4:
        return None
    if address.is_loopback or address.is_link_local or address.is_unspecified:
        return None
    return str(address)


def pick_address(interfaces: Sequence[Mapping[str, Any]], *, mac: str | None) -> str | None:
    """The first IPv4 of the interface whose ``hardware-address`` is ``mac`` (net0's); None
    when that interface has none yet, when no interface has that MAC, or when ``mac`` is None
    (a VM without net0 has no address a proxy could be reached at).

    Loopback (127/8), link-local (169.254/16) and unspecified (0.0.0.0) addresses are never a
    proxy's address, nor is anything on a loopback interface. Interfaces without
    ``ip-addresses`` are skipped, as are entries the agent filled oddly (not a mapping, no
    ``ip-address``): the agent runs inside an untrusted guest.
    """
    if not mac:
        return None
    wanted = mac.strip().casefold()
    for interface in interfaces:
        if not isinstance(interface, Mapping):
            continue
        name = str(interface.get("name", "")).strip().casefold()
        if name in _LOOPBACK_NAMES:
            continue
        if str(interface.get("hardware-address", "")).strip().casefold() != wanted:
            continue
        addresses = interface.get("ip-addresses")
        if not isinstance(addresses, list):
            continue
        for entry in addresses:
            if not isinstance(entry, Mapping):
                continue
            found = _usable_ipv4(entry.get("ip-address"))
            if found is not None:
                return found
    return None
