"""QEMU config updates: qemu-server's ``$update_vm_api`` (pve-reference §7.13).

1. Synchronous checks: ``skiplock`` is root's; ``no options specified``; the ``delete`` and
   ``revert`` lists (400); per-key permissions (``only root can set '<key>' config`` for keys no
   privilege covers); then the config: ``digest``, the lock, ``balloon`` against ``memory``.
2. Every change goes into the ``[PENDING]`` section first: tags normalised, ``netN``
   canonicalised with a generated MAC, ``<storage>:<GiB>`` disks allocated, ``boot`` checked;
   a new CD-ROM is appended to an explicit boot order.
3. A stopped VM gets everything applied at once. A running VM gets the fast-plug keys and what
   hot-plug allows; the rest stays pending until Proxmox starts the VM again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .permissions import Permissions
from .schema import Schema, split_list
from .state import Cluster, Guest, SimError, Storage, Volume
from .vmconfig import (
    NET_KEY,
    UNUSED_KEY,
    Drive,
    boot_order,
    canonical_net,
    coerce,
    format_size,
    is_disk_key,
    normalise_tags,
    parse_agent,
    parse_drive,
    parse_net,
    print_boot_order,
)

# Applied at once even on a running VM (qemu-server ``vmconfig_hotplug_pending`` fast-plug list).
FAST_PLUG = frozenset(
    {
        "name",
        "description",
        "tags",
        "onboot",
        "protection",
        "startup",
        "shares",
        "lock",
        "hookscript",
        "migrate_downtime",
        "migrate_speed",
        "vmstatestorage",
    }
)
CLOUDINIT_KEYS = frozenset(
    {
        "ciuser",
        "cipassword",
        "sshkeys",
        "nameserver",
        "searchdomain",
        "citype",
        "ciupgrade",
        "cicustom",
    }
)
_NOT_CONFIG = frozenset(
    {"node", "vmid", "delete", "revert", "digest", "skiplock", "force", "background_delay"}
)
_CPU_KEYS = frozenset(
    {"cores", "sockets", "cpu", "cpulimit", "cpuunits", "numa", "vcpus", "affinity", "smp"}
)
_MEMORY_KEYS = frozenset({"memory", "balloon", "shares", "allow-ksm"})
_OPTION_KEYS = frozenset(
    {
        "name",
        "description",
        "onboot",
        "agent",
        "ostype",
        "protection",
        "template",
        "tags",
        "hookscript",
        "startup",
        "autostart",
        "freeze",
        "localtime",
        "reboot",
        "startdate",
        "tdf",
        "migrate_downtime",
        "migrate_speed",
        "keephugepages",
        "hugepages",
    }
)
_HWTYPE_KEYS = frozenset(
    {
        "acpi",
        "hotplug",
        "keyboard",
        "kvm",
        "machine",
        "scsihw",
        "smbios1",
        "tablet",
        "vga",
        "watchdog",
        "bios",
        "arch",
        "audio0",
        "rng0",
    }
)
_DISK_OPTION_KEYS = frozenset({"boot", "bootdisk", "vmstatestorage"})
_ALLOCATION = re.compile(r"([a-z][a-z0-9\-_.]*[a-z0-9]):(\d+(?:\.\d+)?)", re.IGNORECASE)
_DEFAULT_HOTPLUG = frozenset({"network", "disk", "usb"})


def option_exists(key: str) -> bool:
    """Whether ``key`` is a QEMU config option (``net3`` matches the schema's ``net[n]``)."""
    if key in _NOT_CONFIG:
        return False
    props = Schema.default().entry("PUT /nodes/{node}/qemu/{vmid}/config")["parameters"][
        "properties"
    ]
    if key in props:
        return True
    m = re.fullmatch(r"([a-z][a-z_-]*?)(\d+)", key)
    return bool(m and f"{m.group(1)}[n]" in props)


def check_key_permission(perms: Permissions, vmid: int, key: str, value: str | None) -> None:
    """``$check_vm_modify_config_perm`` and the storage/bridge checks for one key (§2.4)."""
    path = f"/vms/{vmid}"
    if is_disk_key(key) or UNUSED_KEY.fullmatch(key):
        drive = parse_drive(value) if value else None
        if drive is not None and drive.is_cdrom:
            perms.require(path, "VM.Config.CDROM")
            if drive.storage:
                perms.require(
                    f"/storage/{drive.storage}",
                    "Datastore.Audit",
                    "Datastore.AllocateSpace",
                    any_of=True,
                )
        else:
            perms.require(path, "VM.Config.Disk")
            if drive is not None and drive.storage and _ALLOCATION.fullmatch(drive.volid):
                perms.require(f"/storage/{drive.storage}", "Datastore.AllocateSpace")
    elif key in _CPU_KEYS or (key.startswith("numa") and key[4:].isdigit()):
        perms.require(path, "VM.Config.CPU")
    elif key in _MEMORY_KEYS:
        perms.require(path, "VM.Config.Memory")
    elif NET_KEY.fullmatch(key):
        perms.require(path, "VM.Config.Network")
        if value:
            net = parse_net(value)
            zone = f"/sdn/zones/localnetwork/{net.get('bridge', '')}"
            if net.get("tag"):
                zone += f"/{net['tag']}"
            perms.require(zone, "SDN.Use")
    elif key in CLOUDINIT_KEYS or re.fullmatch(r"ipconfig\d+", key):
        perms.require(path, "VM.Config.Cloudinit", "VM.Config.Network", any_of=True)
    elif key in _OPTION_KEYS:
        perms.require(path, "VM.Config.Options")
        if key == "startup":
            perms.require("/", "Sys.Modify")
    elif key in _HWTYPE_KEYS or re.fullmatch(r"serial\d+", key):
        perms.require(path, "VM.Config.HWType")
    elif key in _DISK_OPTION_KEYS:
        perms.require(path, "VM.Config.Disk")
    else:
        # hostpciN, usbN, args, lock, vmgenid...: only root@pam, and a token never is root.
        raise SimError(500, f"only root can set '{key}' config")


def hotplug_features(guest: Guest) -> frozenset[str]:
    value = str(guest.config.get("hotplug", "network,disk,usb"))
    if value == "1":
        return _DEFAULT_HOTPLUG
    if value == "0":
        return frozenset()
    return frozenset(split_list(value))


class ConfigUpdate:
    """One validated PUT/POST config request, ready to be written."""

    def __init__(
        self,
        cluster: Cluster,
        vmid: int,
        params: Mapping[str, str],
        perms: Permissions,
        *,
        ctime: int = 0,
    ) -> None:
        self.cluster = cluster
        self.vmid = vmid
        self.ctime = ctime  # creation time of disks this update allocates
        values = {k: v for k, v in params.items() if k not in ("node", "vmid")}
        self.digest = values.pop("digest", None)
        values.pop("background_delay", None)
        if values.pop("skiplock", None) == "1":
            raise SimError.params({"skiplock": "Only root may use this option."})
        delete_str = values.pop("delete", None)
        revert_str = values.pop("revert", None)
        self.force = values.pop("force", None) == "1"
        if "cdrom" in values:
            cdrom = values.pop("cdrom")
            values["ide2"] = cdrom if "media=" in cdrom else f"{cdrom},media=cdrom"
        if not delete_str and not revert_str and not values:
            raise SimError(500, "no options specified")
        self.reverts: list[str] = []
        for key in split_list(revert_str or ""):
            if not option_exists(key):
                raise SimError.params({"revert": f"unknown option '{key}'"})
            if key in values:
                raise SimError.params(
                    {"revert": f"you can't use '-{key}' and '-revert {key}' at the same time"}
                )
            self.reverts.append(key)
        self.deletes: list[str] = []
        for key in split_list(delete_str or ""):
            key = "ide2" if key == "cdrom" else key
            if key in values:
                raise SimError.params(
                    {"delete": f"you can't use '-{key}' and -delete {key}' at the same time"}
                )
            if key in self.reverts:
                both = f"you can't use '-delete {key}' and '-revert {key}' at the same time"
                raise SimError.params({"delete": both})
            if not option_exists(key):
                raise SimError.params({"delete": f"unknown option '{key}'"})
            self.deletes.append(key)
        self.values = values
        for key, value in values.items():
            check_key_permission(perms, vmid, key, value)
        for key in self.deletes:
            check_key_permission(perms, vmid, key, None)

    def check_config(self, guest: Guest) -> None:
        """The checks on the loaded config, in Proxmox's order (all synchronous)."""
        if self.digest and self.digest != guest.digest:
            raise SimError(500, "checksum mismatch (file change by other user?)")
        if guest.lock:
            raise SimError(500, f"VM is locked ({guest.lock})")
        merged = guest.merged()
        memory = self.values.get("memory", merged.get("memory", "512"))
        balloon = self.values.get("balloon", merged.get("balloon"))
        if balloon is not None:
            mem = str(memory).replace("current=", "").split(",")[0]
            if mem.isdigit() and int(balloon) > int(mem):
                raise SimError(
                    500, "balloon value too large (must be smaller than assigned memory)"
                )
        self._check_boot(guest)

    def _check_boot(self, guest: Guest) -> None:
        boot = self.values.get("boot")
        order = boot_order(boot)
        if order is None:
            return
        known = set(guest.config) | set(guest.pending) | set(self.values)
        known -= set(self.deletes)
        for device in order:
            if device not in known:
                raise SimError(500, f"invalid bootorder: device '{device}' does not exist'")

    # --- the write ----------------------------------------------------------------------

    def write(self, guest: Guest) -> None:
        """Steps 2 and 3 of the module docstring. The config lock is held by the caller."""
        for key in self.reverts:
            guest.pending.pop(key, None)
            guest.pending_delete.pop(key, None)
        base_boot = guest.pending.get("boot", guest.config.get("boot"))
        order = boot_order(str(self.values.get("boot", base_boot or "")))
        order_changed = False
        for key in self.deletes:
            if key == "tags":
                guest.config.pop("tags", None)
                guest.pending.pop("tags", None)
                continue
            if UNUSED_KEY.fullmatch(key):
                value = guest.config.pop(key, None)
                if value is not None:
                    free_volume(self.cluster, guest, str(value))
                continue
            if key not in guest.config:
                guest.pending.pop(key, None)  # a pending-only key: just drop it
                continue
            guest.pending.pop(key, None)
            guest.pending_delete[key] = self.force
            if order is not None and key in order:
                order.remove(key)
                order_changed = True
        for key in sorted(self.values):
            value = self.values[key]
            if key == "tags":
                value = normalise_tags(value)
            elif NET_KEY.fullmatch(key):
                value = canonical_net(value, self.cluster.rng)
            elif is_disk_key(key):
                drive = self._prepare_drive(guest, parse_drive(value))
                value = drive.print()
                if (
                    drive.is_cdrom
                    and not drive.is_cloudinit
                    and order is not None
                    and key not in order
                ):
                    order.append(key)  # "append new CD drives to bootorder to mark them bootable"
                    order_changed = True
            elif key == "boot" and boot_order(value) is not None and "bootdisk" in guest.config:
                guest.pending_delete["bootdisk"] = False  # ``order=`` replaces legacy ``bootdisk``
            typed = coerce("qemu", key, value)
            guest.pending_delete.pop(key, None)
            if key in guest.config and guest.config[key] == typed and key not in guest.pending:
                continue
            guest.pending[key] = typed
        if order_changed and order is not None:
            guest.pending["boot"] = print_boot_order(order)
        guest.changed()
        if guest.running:
            apply_pending(self.cluster, guest, hot_only=True)
        else:
            apply_pending(self.cluster, guest)

    def _prepare_drive(self, guest: Guest, drive: Drive) -> Drive:
        """``<storage>:<GiB>`` allocates ``vm-<vmid>-disk-<n>`` on the VM's node."""
        m = _ALLOCATION.fullmatch(drive.volid)
        if drive.is_cdrom or not m:
            return drive
        sid, gib = m.group(1), float(m.group(2))
        storage = self.cluster.storage(guest.node, sid)
        if storage is None:
            raise SimError(500, f"storage '{sid}' does not exist")
        if "images" not in storage.content:
            raise SimError(500, f"storage '{sid}' does not support vm images")
        size = int(gib * 1024**3)
        volname = storage.next_disk_name(guest.vmid)
        storage.volumes[volname] = Volume(
            volname=volname,
            content="images",
            format="qcow2" if storage.type == "dir" else "raw",
            size=size,
            ctime=self.ctime,
            vmid=guest.vmid,
        )
        drive.volid = storage.volid(volname)
        drive.opts["size"] = format_size(size)
        return drive


# --- applying pending changes --------------------------------------------------------------


def _hot_pluggable(guest: Guest, key: str, new: object | None) -> bool:
    """Whether a pending change to ``key`` takes effect on the running VM (§7.13 step 3)."""
    if key in FAST_PLUG or key in CLOUDINIT_KEYS or re.fullmatch(r"ipconfig\d+", key):
        return True
    features = hotplug_features(guest)
    old = guest.config.get(key)
    if NET_KEY.fullmatch(key):
        if old is not None and new is not None:
            before, after = parse_net(str(old)), parse_net(str(new))
            hot = {"bridge", "tag", "firewall", "trunks", "rate", "link_down"}
            if {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} <= hot:
                return True
        return "network" in features
    if is_disk_key(key):
        drive = parse_drive(str(new if new is not None else old))
        if (
            drive.is_cdrom
            and old is not None
            and parse_drive(str(old)).is_cdrom
            and new is not None
        ):
            return True  # changing the medium of an existing CD-ROM drive
        return "disk" in features and key.startswith(("scsi", "virtio"))
    if key in ("cpulimit", "cpuunits", "balloon"):
        return True
    if key == "vcpus":
        return "cpu" in features
    if key == "memory":
        return "memory" in features
    if key == "agent" and old is not None and new is not None:
        before, after = parse_agent(old), parse_agent(new)
        changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        return changed <= {"fstrim_cloned_disks"}
    return False


def apply_pending(cluster: Cluster, guest: Guest, *, hot_only: bool = False) -> None:
    """qemu-server ``vmconfig_apply_pending`` (all keys) or the hot-plug pass (running VM)."""
    for key, force in list(guest.pending_delete.items()):
        if hot_only and not _hot_pluggable(guest, key, None):
            continue
        old = guest.config.pop(key, None)
        del guest.pending_delete[key]
        if old is not None and is_disk_key(key):
            _detach(cluster, guest, str(old), force=force)
    for key, value in list(guest.pending.items()):
        if hot_only and not _hot_pluggable(guest, key, value):
            continue
        old = guest.config.get(key)
        if old is not None and is_disk_key(key) and old != value:
            before, after = parse_drive(str(old)), parse_drive(str(value))
            if before.volid != after.volid:
                _detach(cluster, guest, str(old), force=False)
        guest.config[key] = value
        del guest.pending[key]
    guest.changed()


def _detach(cluster: Cluster, guest: Guest, value: str, *, force: bool) -> None:
    """A removed or replaced disk becomes ``unusedN``, or is freed with ``force``."""
    drive = parse_drive(value)
    if drive.is_cdrom or drive.volid in ("", "none", "cdrom"):
        return
    if any(
        parse_drive(str(v)).volid == drive.volid for k, v in guest.config.items() if is_disk_key(k)
    ):
        return
    if force:
        free_volume(cluster, guest, drive.volid)
        return
    n = 0
    while f"unused{n}" in guest.config:
        n += 1
    guest.config[f"unused{n}"] = drive.volid


def free_volume(cluster: Cluster, guest: Guest, volid: str) -> None:
    found = cluster.volume(guest.node, parse_drive(volid).volid)
    if found is not None:
        storage, volume = found
        storage.volumes.pop(volume.volname, None)


def owned_volumes(cluster: Cluster, guest: Guest) -> list[tuple[Storage, Volume]]:
    """Volumes the guest's config references that belong to it (disks, unused, cloud-init)."""
    out: list[tuple[Storage, Volume]] = []
    for key in sorted(guest.config):
        if not (is_disk_key(key) or UNUSED_KEY.fullmatch(key) or key == "vmstate"):
            continue
        drive = parse_drive(str(guest.config[key]))
        if drive.is_cdrom and not drive.is_cloudinit:
            continue
        found = cluster.volume(guest.node, drive.volid)
        if found is not None and found[1].vmid == guest.vmid:
            out.append(found)
    return out
