"""The address a proxy is reached at, from the QEMU guest agent (seed 000 entry 7).

The agent is the only address source the API offers (no ARP, no DHCP leases). Right after
boot it may list only ``lo``, or an interface still without IPv4 (pve-reference §7.19), so
"no address yet" is a normal answer and the proxy stays Provisioning.
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


def pick_address(interfaces: Sequence[Mapping[str, Any]]) -> str | None:
    """The first IPv4, in the agent's order, of a non-loopback interface; None if there is none.

    Loopback (127/8), link-local (169.254/16) and unspecified (0.0.0.0) addresses are never a
    proxy's address. Interfaces without ``ip-addresses`` are skipped, as are entries the agent
    filled oddly (not a mapping, no ``ip-address``): the agent runs inside an untrusted guest.
    """
    for interface in interfaces:
        if not isinstance(interface, Mapping):
            continue
        name = str(interface.get("name", "")).strip().casefold()
        if name in _LOOPBACK_NAMES:
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
