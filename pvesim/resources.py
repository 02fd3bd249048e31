"""Guest, node and storage entries of ``/cluster/resources`` (pve-reference §7.9).

Usage figures are made up but stable (derived from the VMID and the uptime). What proxyhub
relies on is exact:

* a guest created less than pvestatd's pass ago (``statd_lag``) whose config is still the
  clone's temporary file is listed bare: ``id``, ``vmid``, ``node``, ``type``,
  ``status: unknown``, ``lock: clone``; after the pass it is ``VM <vmid>``, stopped, zeroes;
* ``lock`` and ``tags`` come from the live config; ``name`` and ``status`` also follow at once
  (pvestatd's lag is modelled only for the nameless clone entry);
* a paused VM is listed as ``running``, as seed 000 observed on a real host (F14; entry 9
  reads ``status/current`` for exactly that reason);
* every guest of an offline node is listed with ``status: unknown``;
* HA-managed guests carry ``hastate``.
"""

from __future__ import annotations

from typing import Any

from .profiles import Profile
from .state import Guest, Node, Storage
from .vmconfig import boot_order, is_disk_key, parse_drive, parse_size

GIB = 1024**3
MIB = 1024**2


def boot_disk_size(guest: Guest) -> int:
    """Bytes of the boot disk: the first disk of ``boot: order=`` that is not a CD-ROM, else
    ``bootdisk``, else the first present of scsi0, virtio0, sata0, ide0 (seed 000 entry 6)."""
    config = guest.config
    if guest.kind == "lxc":
        rootfs = config.get("rootfs")
        return _size_of(str(rootfs)) if rootfs else 0
    candidates = [d for d in boot_order(str(config.get("boot", ""))) or [] if is_disk_key(d)]
    if config.get("bootdisk"):
        candidates.append(str(config["bootdisk"]))
    candidates += ["scsi0", "virtio0", "sata0", "ide0"]
    for key in candidates:
        value = config.get(key)
        if value is None:
            continue
        drive = parse_drive(str(value))
        if drive.is_cdrom:
            continue
        return _size_of(str(value))
    return 0


def _size_of(value: str) -> int:
    size = parse_drive(value).opts.get("size")
    return (parse_size(size) or 0) if size else 0


_STOPPED_USAGE: dict[str, Any] = {
    "cpu": 0,
    "mem": 0,
    "memhost": 0,
    "netin": 0,
    "netout": 0,
    "diskread": 0,
    "diskwrite": 0,
    "uptime": 0,
}


def guest_usage(guest: Guest, now: float, maxmem: int | None = None) -> dict[str, Any]:
    """Live usage numbers: zero when stopped, small stable figures when running."""
    if not guest.running or guest.booted_at is None:
        return dict(_STOPPED_USAGE)
    if maxmem is None:
        maxmem = guest.memory_mib() * MIB
    uptime = max(0, int(now - guest.booted_at))
    seed = guest.vmid % 97 + 3
    return {
        "cpu": round(0.001 * seed, 10),
        "mem": maxmem * (20 + seed % 30) // 100,
        "memhost": maxmem * (25 + seed % 30) // 100 if guest.kind == "qemu" else 0,
        "netin": uptime * 2311 + seed * 1000,
        "netout": uptime * 1013 + seed * 700,
        "diskread": 50 * MIB + seed * MIB,
        "diskwrite": 10 * MIB + uptime * 4096,
        "uptime": uptime,
    }


def _listing(guest: Guest, node: Node) -> dict[str, Any]:
    """The part of a guest's entry that only a config write changes (cached on the guest)."""
    if guest.listing is None:
        static: dict[str, Any] = {
            "id": f"{guest.kind}/{guest.vmid}",
            "vmid": guest.vmid,
            "node": guest.node,
            "type": guest.kind,
            "maxcpu": min(guest.cpus(), node.maxcpu),
            "maxdisk": boot_disk_size(guest),
            "maxmem": guest.memory_mib() * MIB,
            "name": guest.name,
            "template": 1 if guest.is_template else 0,
        }
        if guest.lock:
            static["lock"] = guest.lock
        tags = guest.config.get("tags")
        if tags:
            static["tags"] = tags
        guest.listing = static
    return guest.listing


def guest_entry(guest: Guest, node: Node, profile: Profile, now: float) -> dict[str, Any]:
    if guest.temp:
        return _midclone_entry(guest, node, profile, now)
    static = _listing(guest, node)
    entry = dict(static)
    entry.update(guest_usage(guest, now, static["maxmem"]))
    entry["disk"] = 1107296256 if guest.kind == "lxc" and guest.running else 0
    if not node.online:
        entry["status"] = "unknown"
    else:
        entry["status"] = "running" if guest.running else "stopped"
    if guest.ha_state is not None:
        entry["hastate"] = guest.ha_state
    return entry


def _midclone_entry(guest: Guest, node: Node, profile: Profile, now: float) -> dict[str, Any]:
    """A clone target still on its temporary config: bare until pvestatd's first pass."""
    entry: dict[str, Any] = {
        "id": f"{guest.kind}/{guest.vmid}",
        "vmid": guest.vmid,
        "node": guest.node,
        "type": guest.kind,
    }
    if now < guest.created_at + profile.statd_lag:
        entry["status"] = "unknown"
    else:
        entry.update(
            {
                "cpu": 0,
                "disk": 0,
                "diskread": 0,
                "diskwrite": 0,
                "maxcpu": 1,
                "maxdisk": 0,
                "maxmem": 512 * MIB,
                "mem": 0,
                "memhost": 0,
                "name": f"VM {guest.vmid}",
                "netin": 0,
                "netout": 0,
                "status": "stopped" if node.online else "unknown",
                "template": 0,
                "uptime": 0,
            }
        )
    if guest.lock:
        entry["lock"] = guest.lock
    return entry


def node_entry(node: Node, used_mem: int, now_wall: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": f"node/{node.name}",
        "node": node.name,
        "type": "node",
        "status": "online" if node.online else "offline",
        "level": "",
        "maxcpu": node.maxcpu,
        "maxmem": node.maxmem,
        "maxdisk": node.maxdisk,
    }
    if node.online:
        entry.update(
            {
                "cpu": round(0.0137 * node.index, 10),
                "mem": 4 * GIB * node.index + used_mem,
                "disk": 4303721472 + node.index * GIB,
                "uptime": max(0, now_wall - node.boot_epoch),
                "cgroup-mode": 2,
            }
        )
    return entry


def storage_entry(node: Node, storage: Storage) -> dict[str, Any]:
    return {
        "id": f"storage/{node.name}/{storage.id}",
        "storage": storage.id,
        "node": node.name,
        "type": "storage",
        "status": "available" if node.online else "unknown",
        "plugintype": storage.type,
        "content": ",".join(storage.content),
        "shared": 1 if storage.shared else 0,
        "disk": storage.used,
        "maxdisk": storage.total,
    }
