"""The simulated QEMU guest agent (pve-reference §3.3, §7.19; seed 000 entry 7).

Whether the agent answers depends, in Proxmox's order, on the config (an ``agent`` key at
all, then ``enabled``), on the VM running (and not paused), and on the guest: an agent baked
into the template answers ``agent_start`` seconds after boot; one that the seed's vendor-data
installs answers only once the network is up and the package is in (``address_after +
agent_install``); a guest with neither never answers. Addresses come from the bridge's subnet,
a different one per VLAN tag, and are fixed per VMID:

* ``vmbr0`` untagged: ``10.20.0.0/16`` (the nodes are ``10.20.0.11``, ``.12``, ``.13``);
* ``vmbr0`` with VLAN tag ``t``: ``10.<21 + (t - 1) % 235>.0.0/16`` (tags 1-235 distinct);
* a bridge the node does not have, or ``link_down=1``: no IPv4 ever (no DHCP answers).

The host part is ``2 + vmid % 65532``, so VMIDs within any window of 65532 never collide.

A guest may list more interfaces than its NICs (docker0, tun0, a bridge of its own; §7.19): a
test scripts them per guest (``Control.set_guest_interfaces``), before or after the NICs, and
may keep the NICs on IPv6 only.

Files (``agent/file-read``): the guest has one, cloud-init's ``/run/cloud-init/result.json``,
written by its final stage ``profile.cloud_init`` seconds after the address (or as a test
scripted it, ``Control.set_cloud_init``). Any other path, or that one before it is written, is
the agent's "No such file or directory".
"""

from __future__ import annotations

import base64
import ipaddress
import json
from typing import Any

from .profiles import Profile
from .state import Guest, Node, SimError
from .vmconfig import NET_KEY, agent_enabled, net_tag, parse_net

UNTAGGED_SUBNET = ipaddress.IPv4Network("10.20.0.0/16")
_NOT_RUNNING_AGENT = "QEMU guest agent is not running"


def subnet_for(tag: int | None) -> ipaddress.IPv4Network:
    if tag is None:
        return UNTAGGED_SUBNET
    second = 21 + (tag - 1) % 235
    return ipaddress.IPv4Network(f"10.{second}.0.0/16")


def guest_ipv4(vmid: int, tag: int | None) -> ipaddress.IPv4Address:
    net = subnet_for(tag)
    return net.network_address + 2 + vmid % 65532


def _link_local(mac: str) -> str:
    """The EUI-64 IPv6 link-local address every Linux guest derives from its MAC."""
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 0xFF, 0xFE, *octets[3:]]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return str(ipaddress.IPv6Address("fe80::" + ":".join(groups)))


def agent_up_at(guest: Guest, profile: Profile) -> float | None:
    """When the guest's agent starts answering (engine time), or ``None`` for never."""
    if guest.booted_at is None:
        return None
    if guest.agent_baked:
        return guest.booted_at + profile.agent_start
    if guest.agent_installed:
        return guest.booted_at + profile.address_after + profile.agent_install
    return None


def assert_agent(guest: Guest, profile: Profile, now: float) -> None:
    """qemu-server ``assert_agent_available`` then ``guest-ping``, with Proxmox's texts."""
    if "agent" not in guest.config:
        raise SimError(500, "No QEMU guest agent configured")
    if not guest.running:
        raise SimError(500, f"VM {guest.vmid} is not running")
    up = agent_up_at(guest, profile)
    if not agent_enabled(guest.config["agent"]) or guest.paused or up is None or now < up:
        raise SimError(500, _NOT_RUNNING_AGENT)


def interfaces(guest: Guest, node: Node, profile: Profile, now: float) -> list[dict[str, Any]]:
    """``guest-network-get-interfaces``: ``lo`` then one ``ethN`` per ``netN``, in index order,
    with the guest's scripted extra interfaces after them (or right after ``lo``)."""
    out: list[dict[str, Any]] = [
        {
            "hardware-address": "00:00:00:00:00:00",
            "ip-addresses": [
                {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128},
            ],
            "name": "lo",
            "statistics": _stats(guest, 0),
        }
    ]
    booted = guest.booted_at if guest.booted_at is not None else now
    has_lease = now >= booted + profile.address_after
    nets = sorted((k for k in guest.config if NET_KEY.fullmatch(k)), key=lambda k: int(k[3:]))
    for position, key in enumerate(nets):
        net = parse_net(str(guest.config[key]))
        mac = net.get("macaddr", "00:00:00:00:00:00").lower()
        addresses: list[dict[str, Any]] = []
        reachable = net.get("bridge") in node.bridges and net.get("link_down") != "1"
        if has_lease and reachable and guest.nic_ipv4:
            address = guest_ipv4(guest.vmid, net_tag(net))
            addresses.append({"ip-address": str(address), "ip-address-type": "ipv4", "prefix": 16})
        addresses.append({"ip-address": _link_local(mac), "ip-address-type": "ipv6", "prefix": 64})
        out.append(
            {
                "hardware-address": mac,
                "ip-addresses": addresses,
                "name": f"eth{position}",
                "statistics": _stats(guest, position + 1),
            }
        )
    extras = [dict(i) for i in guest.extra_interfaces]
    if guest.extra_first:
        return [out[0], *extras, *out[1:]]
    return [*out, *extras]


def _stats(guest: Guest, salt: int) -> dict[str, int]:
    base = (guest.vmid * 7919 + salt * 104729) % 1000000
    return {
        "rx-bytes": base * 3 + 163244,
        "rx-dropped": 0,
        "rx-errs": 0,
        "rx-packets": base // 100 + 1623,
        "tx-bytes": base * 2 + 163244,
        "tx-dropped": 0,
        "tx-errs": 0,
        "tx-packets": base // 120 + 1623,
    }


OSINFO = {
    "id": "debian",
    "kernel-release": "6.12.43+deb13-amd64",
    "kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.12.43-1 (2025-08-27)",
    "machine": "x86_64",
    "name": "Debian GNU/Linux",
    "pretty-name": "Debian GNU/Linux 13 (trixie)",
    "version": "13 (trixie)",
    "version-id": "13",
}

SUPPORTED_COMMANDS = (
    "guest-get-osinfo",
    "guest-info",
    "guest-network-get-interfaces",
    "guest-ping",
    "guest-shutdown",
)


def info() -> dict[str, Any]:
    return {
        "version": "9.2.0",
        "supported_commands": [
            {"enabled": True, "name": name, "success-response": True} for name in SUPPORTED_COMMANDS
        ],
    }


CLOUD_INIT_RESULT = "/run/cloud-init/result.json"
# file-read's limit (schema: ``count`` at most 16777216, its default).
FILE_READ_MAX = 16777216
# pvesim's NoCloud seed is a CD-ROM (pve-reference has no capture of result.json; this is the
# shape cloud-init's ``status`` writes: ``v1.datasource``, ``v1.errors``,
# ``v1.recoverable_errors``).
_DATASOURCE = "DataSourceNoCloud [seed=/dev/sr0]"


def file_text(guest: Guest, profile: Profile, path: str, now: float) -> str:
    """The content of ``path`` in the guest, or the agent's error for a file it does not have:
    qemu-ga's ``guest-file-open`` text, which qemu-server's ``check_agent_error`` prefixes with
    ``Agent error:`` (proxmox/qemu-server ``QemuServer/Agent.pm``; not in pve-reference)."""
    missing = SimError(
        500, f"Agent error: failed to open file '{path}' (mode: 'r'): No such file or directory"
    )
    if path != CLOUD_INIT_RESULT or guest.booted_at is None:
        raise missing
    if guest.cloud_init_outcome == "never":
        raise missing
    after = profile.cloud_init if guest.cloud_init_after is None else guest.cloud_init_after
    if now < guest.booted_at + profile.address_after + after:
        raise missing
    result = {
        "v1": {
            "datasource": _DATASOURCE,
            "errors": list(guest.cloud_init_errors),
            "recoverable_errors": {},
        }
    }
    return json.dumps(result, indent=1) + "\n"


def file_read(text: str, *, offset: int, count: int, decode: bool) -> dict[str, Any]:
    """qemu-server's ``file-read`` answer: ``content`` (base64 unless ``decode``), and
    ``truncated: 1`` only when ``count`` bytes did not reach the end of the file."""
    data = text.encode()
    chunk = data[offset : offset + count]
    out: dict[str, Any] = {
        "content": chunk.decode(errors="replace") if decode else base64.b64encode(chunk).decode()
    }
    if offset + count < len(data):
        out["truncated"] = 1
    return out
