"""Clone and resize (pve-reference §7.14, §7.15; §8 rule 2).

Clone: every synchronous check in qemu-server's order, then the target exists at once as the
temporary config (``# qmclone temporary file`` / ``lock: clone``), which ``/cluster/resources``
lists as a bare nameless entry and any write refuses with ``VM is locked (clone)``. The
``qmclone`` task's id is the *source* VMID. When it ends the target holds the source's keys
(new MACs, a new SMBIOS uuid, a new vmgenid if the source had one, no ``template``, no
pending changes), copies of its disks, and its own name; on failure the target is gone and
the task says ``clone failed: <error>``.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from .router import Ctx, handler
from .simtasks import Task
from .state import Guest, SimError, Storage, TaskError, Volume
from .vmconfig import (
    NET_KEY,
    UNUSED_KEY,
    Drive,
    format_size,
    parse_drive,
    parse_net,
    parse_size,
    print_net,
    random_mac,
)

TEMP_CONFIG = {"description": " qmclone temporary file", "lock": "clone"}

# Keys a clone never copies (§7.14 step 4).
_NOT_COPIED = frozenset(
    {
        "snapshots",
        "parent",
        "snaptime",
        "vmstate",
        "snapstate",
        "runningcpu",
        "runningmachine",
        "running-nets-host-mtu",
        "template",
        "lock",
    }
)


def _human(size: int) -> str:
    """qemu-img's progress sizes: ``0.0 B``, ``1.5 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _uuid(ctx: Ctx) -> str:
    return str(uuid.UUID(int=ctx.cluster.rng.getrandbits(128), version=4))


def _new_smbios(ctx: Ctx, value: object) -> str:
    """``smbios1``: always a new ``uuid``, the other fields kept (§7.14)."""
    parts = [p for p in str(value or "").split(",") if p and not p.startswith("uuid=")]
    return ",".join([f"uuid={_uuid(ctx)}", *parts])


@handler("POST /nodes/{node}/qemu/{vmid}/clone")
def vm_clone(ctx: Ctx) -> str:
    cluster = ctx.cluster
    node, vmid, newid = ctx.node_name, ctx.vmid, int(ctx.params["newid"])
    source = cluster.guests.get(vmid)
    if source is None or source.node != node or source.kind != "qemu":
        raise SimError(500, f"unable to find configuration file for VM {vmid} on node '{node}'")
    pool = ctx.text("pool")
    if pool and pool not in cluster.access.pools:
        raise SimError(403, f"Permission check failed (pool '{pool}' does not exist)")
    target = ctx.text("target")
    if target == node:
        target = None
    if target is not None and target not in cluster.nodes:
        raise SimError(500, f"no such cluster node '{target}'")
    storage_id = ctx.text("storage")
    if storage_id:
        storage = cluster.storage(node, storage_id)
        if storage is None:
            raise SimError(500, f"storage '{storage_id}' does not exist")
        if "images" not in storage.content:
            raise SimError.params({"storage": f"storage '{storage_id}' does not support vm images"})
    if source.lock:
        raise SimError(500, f"VM is locked ({source.lock})")
    snapname = ctx.text("snapname")
    if snapname:
        raise SimError(500, f"snapshot '{snapname}' does not exist")
    full = ctx.flag("full", default=not source.is_template)
    if not full and storage_id:
        raise SimError(500, "parameter 'storage' not allowed for linked clones")
    if not full and ctx.text("format"):
        raise SimError(500, "parameter 'format' not allowed for linked clones")

    plan = _plan_disks(ctx, source, full=full, storage_id=storage_id)
    if target is not None:
        for _key, _drive, dest, _linked in plan:
            if not dest.shared:
                if storage_id:
                    raise SimError(500, f"can't clone to non-shared storage '{dest.id}'")
                raise SimError(500, f"can't clone VM to node '{target}' (VM uses local storage)")
    existing = cluster.guests.get(newid)
    if existing is not None and existing.node == node and existing.kind == "qemu":
        raise SimError(500, f"unable to create VM {newid}: config file already exists")
    for dest in {id(d): d for _k, _d, d, _l in plan}.values():
        ctx.perms.require(f"/storage/{dest.id}", "Datastore.AllocateSpace")

    if existing is not None:
        # The id belongs to a guest elsewhere in the cluster (another node, or a container):
        # only the worker's write of the temporary config finds out (§7.14, UNVERIFIED text).
        folder = "qemu-server"
        path = f"/etc/pve/nodes/{node}/{folder}/{newid}.conf"

        def taken(task: Task, at: float) -> Any:
            raise TaskError(f"unable to create VM {newid}: {path} - File exists")

        return ctx.submit("qmclone", str(vmid), taken).upid

    clone = Guest(
        vmid=newid,
        node=node,
        kind="qemu",
        config=dict(TEMP_CONFIG),
        temp=True,
        created_at=ctx.now,
    )
    cluster.add_guest(clone)
    allocated: list[tuple[Storage, str]] = []

    def cleanup(at: float) -> None:
        cluster.discard_unfinished(clone, allocated)

    def run(task: Task, at: float) -> Any:
        task.write(f"creating a clone of VM {vmid} with ID {newid}")
        if source.pending or source.pending_delete:
            keys = ",".join(sorted({*source.pending, *source.pending_delete}))
            task.write(f"found pending changes for '{keys}', discarding for clone")
        new_config = _copied_config(ctx, source)
        wall = cluster.wall(at)
        for key, drive, dest, linked in plan:
            volid = drive.volid
            base = cluster.volume(node, volid)
            size = base[1].size if base else parse_size(drive.opts.get("size", "0")) or 0
            kind = "linked" if linked else "full"
            task.write(f"create {kind} clone of drive {key} ({volid})")
            volname = _new_volname(dest, newid, drive, linked, base[1] if base else None)
            dest.volumes[volname] = Volume(
                volname=volname,
                content="images",
                format="qcow2" if dest.type == "dir" else "raw",
                size=size,
                ctime=wall,
                vmid=newid,
                parent=base[1].volname if linked and base else None,
            )
            allocated.append((dest, volname))
            new_drive = Drive(dest.volid(volname), dict(drive.opts))
            if not linked:
                task.write(f"allocated target volume '{new_drive.volid}'")
                if not drive.is_cloudinit:
                    for pct in (0, 50, 100):
                        done = size * pct // 100
                        task.write(f"transferred {_human(done)} of {_human(size)} ({pct:.2f}%)")
            new_config[key] = new_drive.print()

        def finish(end: float) -> None:
            clone.config = new_config
            clone.temp = False
            clone.agent_baked = source.agent_baked
            clone.extra_interfaces = [dict(i) for i in source.extra_interfaces]
            clone.extra_first = source.extra_first
            clone.nic_ipv4 = source.nic_ipv4
            clone.cloud_init_outcome = source.cloud_init_outcome
            clone.cloud_init_after = source.cloud_init_after
            clone.cloud_init_errors = list(source.cloud_init_errors)
            clone.lock_holder = None
            if target is not None:
                clone.node = target
            if pool and pool in cluster.access.pools:
                # The worker's last step (§7.14 step 5): the clone joins the pool.
                cluster.access.pools[pool].vms.add(newid)
            clone.changed()

        return finish

    task = ctx.submit("qmclone", str(vmid), run, cleanup=cleanup, error_prefix="clone failed: ")
    clone.lock_holder = task
    return task.upid


def _plan_disks(
    ctx: Ctx, source: Guest, *, full: bool, storage_id: str | None
) -> list[tuple[str, Drive, Storage, bool]]:
    """Each disk to copy or link: (key, drive, destination storage, linked?). CD-ROMs with an
    ISO are copied as config text; cloud-init drives are always copied (§7.14 step 3)."""
    cluster = ctx.cluster
    plan: list[tuple[str, Drive, Storage, bool]] = []
    for key, drive in source.drives():
        if drive.is_cdrom and not drive.is_cloudinit:
            continue
        if drive.volid in ("", "none"):
            continue
        home = cluster.storage(source.node, drive.storage or "")
        if home is None:
            raise SimError(500, f"storage '{drive.storage}' does not exist")
        linked = not full and not drive.is_cloudinit
        if linked and not source.is_template:
            raise SimError(
                500, f"Linked clone feature is not supported for '{drive.volid}' ({key})"
            )
        dest = home
        if not linked and storage_id:
            found = cluster.storage(source.node, storage_id)
            assert found is not None
            dest = found
        plan.append((key, drive, dest, linked))
    return plan


def _new_volname(dest: Storage, newid: int, drive: Drive, linked: bool, base: Volume | None) -> str:
    if drive.is_cloudinit:
        return f"vm-{newid}-cloudinit"
    name = dest.next_disk_name(newid)
    if linked and base is not None and dest.type in ("rbd", "zfspool"):
        return f"{base.volname}/{name}"
    return name


def _copied_config(ctx: Ctx, source: Guest) -> dict[str, Any]:
    """The new config without disks (the disk loop adds them): §7.14 step 4."""
    config: dict[str, Any] = {}
    for key, value in source.config.items():
        if key in _NOT_COPIED or UNUSED_KEY.fullmatch(key):
            continue
        config[key] = value
    for key in [k for k in config if NET_KEY.fullmatch(k)]:
        net = parse_net(str(config[key]))
        net["macaddr"] = random_mac(ctx.cluster.rng)
        config[key] = print_net(net)
    config["smbios1"] = _new_smbios(ctx, source.config.get("smbios1"))
    vmgenid = source.config.get("vmgenid")
    if vmgenid and str(vmgenid) != "0":
        config["vmgenid"] = _uuid(ctx)
    name = ctx.text("name")
    config["name"] = name or f"Copy-of-VM-{source.config.get('name') or source.vmid}"
    description = ctx.text("description")
    if description:
        config["description"] = description
    for key, drive in source.drives():
        if not (drive.is_cdrom and not drive.is_cloudinit) and key in config:
            del config[key]  # re-added by the disk loop with the new volume
    return config


# --- resize --------------------------------------------------------------------------------

_RESIZE = re.compile(r"(\+)?(\d+(?:\.\d+)?)([KMGT]?)")


@handler("PUT /nodes/{node}/qemu/{vmid}/resize")
def vm_resize(ctx: Ctx) -> str:
    """A ``resize`` task; every check runs inside it (§7.15, seed 000 entry 6)."""
    if ctx.params.get("skiplock") not in (None, "0"):
        raise SimError.params({"skiplock": "Only root may use this option."})
    cluster = ctx.cluster
    node, vmid = ctx.node_name, ctx.vmid
    disk = ctx.params["disk"]
    size_text = ctx.params["size"]
    digest = ctx.text("digest")

    def run(task: Task, at: float) -> Any:
        guest = cluster.guests.get(vmid)
        if guest is None or guest.node != node or guest.kind != "qemu":
            raise TaskError(
                f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist"
            )
        if digest and digest != guest.digest:
            raise TaskError("checksum mismatch (file change by other user?)")
        if guest.lock:
            raise TaskError(f"VM is locked ({guest.lock})")
        value = guest.config.get(disk)
        if value is None:
            raise TaskError(f"disk '{disk}' does not exist")
        drive = parse_drive(str(value))
        if drive.is_cdrom:
            raise TaskError("you can't resize a cdrom")
        if not drive.volid or drive.volid == "none":
            raise TaskError(f"disk '{disk}' has no associated volume")
        found = cluster.volume(node, drive.volid)
        if found is None:
            raise TaskError(f"Could not determine current size of volume '{drive.volid}'")
        storage, volume = found
        if not ctx.perms.has(f"/storage/{storage.id}", "Datastore.AllocateSpace"):
            raise TaskError(
                f"Permission check failed (/storage/{storage.id}, Datastore.AllocateSpace)"
            )
        m = _RESIZE.fullmatch(size_text)
        assert m is not None  # the schema's pattern already held
        amount = int(float(m.group(2)) * 1024 ** " KMGT".index(m.group(3) or " "))
        new_size = volume.size + amount if m.group(1) else amount
        if new_size < volume.size:
            raise TaskError("shrinking disks is not supported")
        if new_size == volume.size:
            return None

        def finish(end: float) -> None:
            volume.size = new_size
            current = guest.config.get(disk)
            if current is None:
                return
            updated = parse_drive(str(current))
            updated.opts["size"] = format_size(new_size)
            guest.config[disk] = updated.print()
            guest.changed()

        return finish

    return ctx.submit("resize", str(vmid), run).upid
