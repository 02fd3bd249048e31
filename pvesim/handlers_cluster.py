"""Cluster-wide and node endpoints: version, nodes, node status and network, resources, nextid.

The simulated nodes run the release seed 000 was written against (pve-manager 9.2.20 on
kernel 7.0.14-17-pve; seed 000 header).
"""

from __future__ import annotations

from typing import Any

from .resources import guest_entry, node_entry, storage_entry
from .router import Ctx, handler
from .state import SimError

PVE_VERSION = "9.2.20"
PVE_RELEASE = "9.2"
PVE_REPOID = "49318c671b82f31e"
KERNEL_RELEASE = "7.0.14-17-pve"
KERNEL_VERSION = "#1 SMP PREEMPT_DYNAMIC PMX 7.0.14-17 (2026-08-30T10:12Z)"


@handler("GET /version")
def version(ctx: Ctx) -> dict[str, Any]:
    """pve-reference §7.1."""
    return {"release": PVE_RELEASE, "repoid": PVE_REPOID, "version": PVE_VERSION}


def _used_mem(ctx: Ctx, node_name: str) -> int:
    return sum(
        g.memory_mib() * 1024 * 1024 // 3
        for g in ctx.cluster.guests.values()
        if g.node == node_name and g.running
    )


@handler("GET /nodes")
def nodes(ctx: Ctx) -> list[dict[str, Any]]:
    """pve-reference §7.2: offline nodes keep only their maximum values."""
    wall = ctx.cluster.wall(ctx.now)
    out = []
    for node in ctx.cluster.nodes.values():
        entry = node_entry(node, _used_mem(ctx, node.name), wall)
        entry.pop("cgroup-mode", None)
        entry["ssl_fingerprint"] = node.ssl_fingerprint
        if not ctx.perms.has(f"/nodes/{node.name}", "Sys.Audit"):
            for key in ("cpu", "mem", "disk", "uptime", "maxcpu", "maxmem", "maxdisk"):
                entry.pop(key, None)
        out.append(entry)
    return out


@handler("GET /nodes/{node}/status")
def node_status(ctx: Ctx) -> dict[str, Any]:
    """pve-reference §7.3 (examples/node_status.json)."""
    node = ctx.node
    wall = ctx.cluster.wall(ctx.now)
    used = 4 * 1024**3 * node.index + _used_mem(ctx, node.name)
    return {
        "boot-info": {"mode": "efi", "secureboot": 0},
        "cpu": round(0.0137 * node.index, 10),
        "cpuinfo": {
            "cores": node.maxcpu // 2,
            "cpus": node.maxcpu,
            "flags": "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat "
            "pse36 clflush mmx fxsr sse sse2 ht syscall nx lm constant_tsc pni ssse3 "
            "sse4_1 sse4_2 popcnt aes xsave avx avx2",
            "hvm": "1",
            "mhz": "3400.000",
            "model": "AMD EPYC 7302P 16-Core Processor",
            "sockets": 1,
            "user_hz": 100,
        },
        "current-kernel": {
            "machine": "x86_64",
            "release": KERNEL_RELEASE,
            "sysname": "Linux",
            "version": KERNEL_VERSION,
        },
        "idle": 0,
        "ksm": {"shared": 0},
        "kversion": f"Linux {KERNEL_RELEASE} {KERNEL_VERSION}",
        "loadavg": ["0.42", "0.37", "0.31"],
        "memory": {
            "available": node.maxmem - used,
            "free": node.maxmem - used,
            "total": node.maxmem,
            "used": used,
        },
        "pveversion": f"pve-manager/{PVE_VERSION}/{PVE_REPOID}",
        "rootfs": {
            "avail": node.maxdisk - 10 * 1024**3,
            "free": node.maxdisk - 8 * 1024**3,
            "total": node.maxdisk,
            "used": 8 * 1024**3,
        },
        "swap": {"free": 8589930496, "total": 8589930496, "used": 0},
        "uptime": max(0, wall - node.boot_epoch),
        "wait": 0.0007812,
    }


@handler("GET /nodes/{node}/network")
def node_network(ctx: Ctx) -> list[dict[str, Any]]:
    """The node's interfaces: ``eno1`` and the VLAN-aware bridge ``vmbr0`` on it."""
    node = ctx.node
    wanted = ctx.text("type")
    ifaces: list[dict[str, Any]] = [
        {
            "active": 1,
            "autostart": 1,
            "exists": 1,
            "families": ["inet"],
            "iface": "eno1",
            "method": "manual",
            "method6": "manual",
            "priority": 3,
            "type": "eth",
        }
    ]
    for i, bridge in enumerate(node.bridges):
        entry: dict[str, Any] = {
            "active": 1,
            "autostart": 1,
            "bridge_fd": "0",
            "bridge_ports": "eno1" if i == 0 else "",
            "bridge_stp": "off",
            "bridge_vids": "2-4094",
            "bridge_vlan_aware": 1,
            "families": ["inet"],
            "iface": bridge,
            "method": "static" if i == 0 else "manual",
            "method6": "manual",
            "priority": 4 + i,
            "type": "bridge",
        }
        if i == 0:
            entry.update(
                {
                    "address": node.address,
                    "cidr": f"{node.address}/16",
                    "gateway": "10.20.0.1",
                    "netmask": "16",
                }
            )
        ifaces.append(entry)
    if wanted in ("bridge", "any_bridge", "any_local_bridge"):
        return [i for i in ifaces if i["type"] == "bridge"]
    if wanted:
        return [i for i in ifaces if i["type"] == wanted]
    return ifaces


@handler("GET /cluster/resources")
def cluster_resources(ctx: Ctx) -> list[dict[str, Any]]:
    """pve-reference §7.9: guests in string order of their VMID, then nodes, storage, sdn."""
    wanted = ctx.text("type")
    cluster = ctx.cluster
    out: list[dict[str, Any]] = []
    if wanted in (None, "vm"):
        profile = ctx.sim.profile
        nodes = cluster.nodes
        perms = ctx.perms
        check = bool(perms.denied())
        for guest in cluster.guests_in_string_order():
            if check and not perms.has(f"/vms/{guest.vmid}", "VM.Audit"):
                continue
            entry = guest_entry(guest, nodes[guest.node], profile, ctx.now)
            pool = cluster.access.pool_of(guest.vmid) if cluster.access.pools else None
            # §7.9: ``pool`` only when the guest is in one and the caller has Pool.Audit.
            if pool and perms.has(f"/pool/{pool}", "Pool.Audit"):
                entry["pool"] = pool
            out.append(entry)
    if wanted in (None, "node"):
        wall = cluster.wall(ctx.now)
        for node in cluster.nodes.values():
            out.append(node_entry(node, _used_mem(ctx, node.name), wall))
    if wanted in (None, "storage"):
        for node in cluster.nodes.values():
            for storage in node.storages.values():
                if ctx.perms.has(f"/storage/{storage.id}", "Datastore.Audit"):
                    out.append(storage_entry(node, storage))
    if wanted in (None, "sdn"):
        for node in cluster.nodes.values():
            out.append(
                {
                    "id": f"sdn/{node.name}/localnetwork",
                    "node": node.name,
                    "sdn": "localnetwork",
                    "status": "ok" if node.online else "unknown",
                    "type": "sdn",
                }
            )
    return out


@handler("GET /cluster/nextid")
def cluster_nextid(ctx: Ctx) -> str:
    """pve-reference §7.10: a JSON *string*; ``vmid`` echoes a free id, 400 for a used one."""
    used = ctx.cluster.guests
    wanted = ctx.integer("vmid")
    if wanted is not None:
        if wanted in used:
            raise SimError.params({"vmid": f"VM {wanted} already exists"})
        return str(wanted)
    lower, upper = ctx.cluster.nextid_range
    candidate = lower
    for vmid in sorted(v for v in used if v >= lower):
        if vmid > candidate:
            break
        candidate = vmid + 1
    if candidate >= upper:
        # pve-reference §5.1 prints the exclusive upper bound.
        raise SimError(500, f"unable to get any free VMID in range [{lower}, {upper}]")
    return str(candidate)


@handler("GET /cluster/status")
def cluster_status(ctx: Ctx) -> list[dict[str, Any]]:
    nodes = list(ctx.cluster.nodes.values())
    out: list[dict[str, Any]] = [
        {
            "id": "cluster",
            "name": "pvesim",
            "nodes": len(nodes),
            "quorate": 1,
            "type": "cluster",
            "version": len(nodes) + 1,
        }
    ]
    for node in nodes:
        out.append(
            {
                "id": f"node/{node.name}",
                "ip": node.address,
                "level": "",
                "local": 1 if node.index == 1 else 0,
                "name": node.name,
                "nodeid": node.index,
                "online": 1 if node.online else 0,
                "type": "node",
            }
        )
    return out
