"""LXC containers: listed and readable only, enough to be a foreign guest (§7.20).

Their config keeps LXC's types (``memory`` and ``swap`` are numbers), their display name is
``hostname``, and every QEMU endpoint asked about a container's VMID answers that the QEMU
config file does not exist, as Proxmox does.
"""

from __future__ import annotations

from typing import Any

from .agent import guest_ipv4
from .resources import boot_disk_size, guest_usage
from .router import Ctx, handler
from .vmconfig import parse_net

MIB = 1024 * 1024


@handler("GET /nodes/{node}/lxc")
def ct_list(ctx: Ctx) -> list[dict[str, Any]]:
    out = []
    for guest in ctx.cluster.guests_in_string_order():
        if guest.node != ctx.node_name or guest.kind != "lxc":
            continue
        usage = guest_usage(guest, ctx.now)
        entry: dict[str, Any] = {
            "vmid": guest.vmid,
            "name": guest.name,
            "status": guest.status,
            "type": "lxc",
            "cpus": guest.cpus(),
            "maxmem": guest.memory_mib() * MIB,
            "maxdisk": boot_disk_size(guest),
            "maxswap": int(guest.config.get("swap", 512)) * MIB,
            **{k: usage[k] for k in ("cpu", "mem", "netin", "netout", "uptime")},
        }
        if guest.config.get("tags"):
            entry["tags"] = guest.config["tags"]
        out.append(entry)
    return out


@handler("GET /nodes/{node}/lxc/{vmid}/config")
def ct_config(ctx: Ctx) -> dict[str, Any]:
    guest = ctx.guest("lxc")
    config = dict(guest.config) if ctx.flag("current") else guest.merged()
    out = {k: config[k] for k in sorted(config)}
    out["digest"] = guest.digest
    return out


@handler("GET /nodes/{node}/lxc/{vmid}/pending")
def ct_pending(ctx: Ctx) -> list[dict[str, Any]]:
    guest = ctx.guest("lxc")
    items: list[dict[str, Any]] = [
        {"key": k, "value": guest.config[k]} for k in sorted(guest.config)
    ]
    items.append({"key": "digest", "value": guest.digest})
    return items


@handler("GET /nodes/{node}/lxc/{vmid}/status/current")
def ct_status(ctx: Ctx) -> dict[str, Any]:
    guest = ctx.guest("lxc")
    usage = guest_usage(guest, ctx.now)
    out: dict[str, Any] = {
        "cpu": usage["cpu"],
        "cpus": guest.cpus(),
        "disk": 1107296256 if guest.running else 0,
        "diskread": usage["diskread"],
        "diskwrite": usage["diskwrite"],
        "ha": {"managed": 0} if guest.ha_state is None else {"managed": 1, "state": guest.ha_state},
        "maxdisk": boot_disk_size(guest),
        "maxmem": guest.memory_mib() * MIB,
        "maxswap": int(guest.config.get("swap", 512)) * MIB,
        "mem": usage["mem"],
        "name": guest.name,
        "netin": usage["netin"],
        "netout": usage["netout"],
        "status": guest.status,
        "swap": 0,
        "type": "lxc",
        "uptime": usage["uptime"],
        "vmid": guest.vmid,
    }
    if guest.running:
        out["pid"] = guest.pid
    if guest.config.get("tags"):
        out["tags"] = guest.config["tags"]
    if guest.lock:
        out["lock"] = guest.lock
    return out


@handler("GET /nodes/{node}/lxc/{vmid}/interfaces")
def ct_interfaces(ctx: Ctx) -> list[dict[str, Any]] | None:
    """Read from the container's network namespace; ``null`` when it is not running."""
    guest = ctx.guest("lxc")
    if not guest.running:
        return None
    out: list[dict[str, Any]] = [
        {
            "hardware-address": "00:00:00:00:00:00",
            "hwaddr": "00:00:00:00:00:00",
            "inet": "127.0.0.1/8",
            "inet6": "::1/128",
            "ip-addresses": [
                {"ip-address": "127.0.0.1", "ip-address-type": "inet", "prefix": 8},
                {"ip-address": "::1", "ip-address-type": "inet6", "prefix": 128},
            ],
            "name": "lo",
        }
    ]
    for key in sorted(k for k in guest.config if k.startswith("net")):
        net = parse_net(str(guest.config[key]))
        mac = net.get("hwaddr", "00:00:00:00:00:00").lower()
        tag = int(net["tag"]) if net.get("tag", "").isdigit() else None
        address = str(guest_ipv4(guest.vmid, tag))
        out.append(
            {
                "hardware-address": mac,
                "hwaddr": mac,
                "inet": f"{address}/16",
                "ip-addresses": [{"ip-address": address, "ip-address-type": "inet", "prefix": 16}],
                "name": net.get("name", "eth0"),
            }
        )
    return out
