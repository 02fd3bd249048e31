"""Create a VM (with disks imported by ``import-from``) and convert it to a template
(pve-reference §5.4, §6, §3.1, §4.5; appendix ``POST /nodes/{node}/qemu`` and
``POST /nodes/{node}/qemu/{vmid}/template``).

Create: the VMID must be unused anywhere in the cluster (§3.1, sync 500), the caller needs
``VM.Allocate`` on ``/vms/<vmid>`` or on ``/pool/<pool>`` (the endpoint's permission text) and
each key's own privilege (§2.4); then the VM exists at once holding ``lock: create`` (§6) and a
``qmcreate`` task (§4.5, id = vmid) allocates its disks: ``<storage>:<GiB>`` a new volume,
``<storage>:0,import-from=<volid>`` a copy of that volume (§5.4). When it ends the lock is gone
and the config carries what create adds (§5.6: ``meta``, an ``smbios1`` uuid, a ``vmgenid``,
canonical ``netN`` with a MAC; §5.5: the default boot order).

Template: sync refusal of a locked VM (§3.1 ``VM is locked (<lock>)``, "template conversion
(sync)"), then a ``qmtemplate`` task (§4.5) that turns each disk into a base volume
(``base-<vmid>-disk-<n>``, §5.4) and sets ``template: 1``.
"""

from __future__ import annotations

import uuid
from typing import Any

from .configupdate import check_key_permission, option_exists
from .router import Ctx, handler
from .simtasks import Task
from .state import Guest, SimError, Storage, TaskError, Volume
from .vmconfig import (
    NET_KEY,
    Drive,
    canonical_net,
    coerce,
    format_size,
    is_disk_key,
    parse_drive,
    print_boot_order,
)

GIB = 1024**3
# Request parameters of the create endpoint that are not config keys.
_NOT_KEYS = frozenset(
    {"node", "vmid", "pool", "start", "storage", "archive", "force", "unique", "bwlimit",
     "live-restore", "import-working-storage"}
)  # fmt: skip
# The qemu-server version ``meta`` records (the defaults' templates carry the same).
QEMU_VERSION = "10.1.2"


def _in_use(ctx: Ctx, vmid: int) -> SimError | None:
    """``check_vmid_unused``: the id is taken anywhere in the cluster (§3.1)."""
    guest = ctx.cluster.guests.get(vmid)
    if guest is None:
        return None
    kind = "VM" if guest.kind == "qemu" else "CT"
    return SimError(
        500, f"unable to create VM {vmid} - {kind} {vmid} already exists on node '{guest.node}'"
    )


def _target_storage(ctx: Ctx, drive: Drive) -> Storage:
    storage = ctx.cluster.storage(ctx.node_name, drive.storage or "")
    if storage is None:
        raise SimError(500, f"storage '{drive.storage}' does not exist")
    if "images" not in storage.content:
        raise SimError(500, f"storage '{storage.id}' does not support vm images")
    return storage


@handler("POST /nodes/{node}/qemu")
def vm_create(ctx: Ctx) -> str:
    cluster = ctx.cluster
    vmid, node = ctx.vmid, ctx.node_name
    pool = ctx.text("pool")
    if pool:
        if pool not in cluster.access.pools:
            raise SimError(403, f"Permission check failed (pool '{pool}' does not exist)")
        if not ctx.perms.has(f"/pool/{pool}", "VM.Allocate"):
            ctx.perms.require(f"/vms/{vmid}", "VM.Allocate")
    else:
        ctx.perms.require(f"/vms/{vmid}", "VM.Allocate")
    keys = {k: v for k, v in ctx.params.items() if k not in _NOT_KEYS}
    for key, value in keys.items():
        if not option_exists(key):
            raise SimError.params(
                {key: "property is not defined in schema and the schema does not allow "
                 "additional properties"}
            )  # fmt: skip
        check_key_permission(ctx.perms, vmid, key, value)
    # Disks are checked before anything is written: storage on this node, with images.
    imports: dict[str, tuple[Drive, Storage]] = {}
    for key in sorted(k for k in keys if is_disk_key(k)):
        drive = parse_drive(keys[key])
        if drive.is_cdrom or drive.storage is None:
            continue
        imports[key] = (drive, _target_storage(ctx, drive))
    taken = _in_use(ctx, vmid)
    if taken is not None:
        raise taken

    guest = Guest(vmid=vmid, node=node, kind="qemu", config={"lock": "create"}, created_at=ctx.now)
    cluster.add_guest(guest)
    allocated: list[tuple[Storage, str]] = []
    wall = cluster.wall(ctx.now)

    def cleanup(at: float) -> None:
        cluster.discard_unfinished(guest, allocated)

    def run(task: Task, at: float) -> Any:
        try:
            return build(task)
        except TaskError:
            cleanup(at)  # a failed create leaves neither the VM nor its disks
            raise

    def build(task: Task) -> Any:
        config: dict[str, Any] = {}
        for key, value in keys.items():
            if key in imports:
                config[key] = _allocate(ctx, task, key, *imports[key], allocated, wall)
            elif NET_KEY.fullmatch(key):
                config[key] = canonical_net(value, cluster.rng)
            else:
                config[key] = coerce("qemu", key, value)
        config.setdefault("meta", f"creation-qemu={QEMU_VERSION},ctime={wall}")
        config["smbios1"] = _smbios(ctx, config.get("smbios1"))
        if str(config.get("vmgenid", "1")) == "1":
            config["vmgenid"] = _uuid(ctx)
        elif str(config.get("vmgenid")) == "0":
            del config["vmgenid"]
        if "boot" not in config:
            config["boot"] = print_boot_order(_default_boot(config))

        def finish(end: float) -> None:
            guest.config = config  # the lock goes with the temporary config
            guest.changed()
            if pool:
                cluster.access.pools[pool].vms.add(vmid)

        return finish

    return ctx.submit("qmcreate", str(vmid), run, cleanup=cleanup).upid


def _allocate(
    ctx: Ctx,
    task: Task,
    key: str,
    drive: Drive,
    storage: Storage,
    allocated: list[tuple[Storage, str]],
    wall: int,
) -> str:
    """A new volume for ``key``: a copy of ``import-from`` or ``<GiB>`` of space (§5.4)."""
    vmid = ctx.vmid
    opts = dict(drive.opts)
    source = opts.pop("import-from", None)
    if source is not None:
        found = ctx.cluster.volume(ctx.node_name, source)
        if found is None:
            # The reference does not quote this text; pve-storage's ``path`` says so.
            raise TaskError(f"volume '{source}' does not exist")
        size = found[1].size
        task.write(f"importing disk '{source}' to VM {vmid} ...")
    else:
        size = int(float(drive.volname or "0") * GIB)
    volname = storage.next_disk_name(vmid)
    storage.volumes[volname] = Volume(
        volname=volname,
        content="images",
        format="qcow2" if storage.type == "dir" else "raw",
        size=size,
        ctime=wall,
        vmid=vmid,
    )
    allocated.append((storage, volname))
    if source is not None:
        task.write(f"Successfully imported disk as '{key}:{storage.volid(volname)}'")
    opts["size"] = format_size(size)
    return Drive(storage.volid(volname), opts).print()


def _default_boot(config: dict[str, Any]) -> list[str]:
    """``order=<first disk>;<first cdrom>;<first net>`` (§5.5 ``get_default_bootdevices``)."""
    disks = sorted(k for k in config if is_disk_key(k))
    first_disk = next((k for k in disks if not parse_drive(str(config[k])).is_cdrom), None)
    first_cdrom = next((k for k in disks if parse_drive(str(config[k])).is_cdrom), None)
    first_net = next((k for k in sorted(config) if NET_KEY.fullmatch(k)), None)
    return [d for d in (first_disk, first_cdrom, first_net) if d]


def _uuid(ctx: Ctx) -> str:
    return str(uuid.UUID(int=ctx.cluster.rng.getrandbits(128), version=4))


def _smbios(ctx: Ctx, value: object) -> str:
    """Create adds ``uuid=<random>`` to ``smbios1`` when absent (§5.6)."""
    text = str(value or "")
    if "uuid=" in text:
        return text
    return ",".join(p for p in (f"uuid={_uuid(ctx)}", text) if p)


@handler("POST /nodes/{node}/qemu/{vmid}/template")
def vm_template(ctx: Ctx) -> str:
    guest = ctx.guest()
    if guest.lock:
        raise SimError(500, f"VM is locked ({guest.lock})")
    # qemu-server ``template`` (not quoted by the reference): no template of a template, and
    # never of a running VM.
    if guest.is_template:
        raise SimError(500, "you can't convert a template to a template")
    if guest.running:
        raise SimError(500, "you can't convert a VM to template if VM is running")
    vmid = ctx.vmid
    cluster = ctx.cluster

    def run(task: Task, at: float) -> Any:
        def finish(end: float) -> None:
            for key, drive in guest.drives():
                if drive.is_cdrom or drive.is_cloudinit or not drive.storage:
                    continue
                storage = cluster.storage(guest.node, drive.storage)
                volname = drive.volname or ""
                if storage is None or volname not in storage.volumes:
                    continue
                base = volname.replace(f"vm-{vmid}-disk-", f"base-{vmid}-disk-", 1)
                volume = storage.volumes.pop(volname)
                volume.volname = base
                storage.volumes[base] = volume
                guest.config[key] = Drive(storage.volid(base), dict(drive.opts)).print()
            guest.config["template"] = 1
            guest.changed()

        return finish

    return ctx.submit("qmtemplate", str(vmid), run).upid
