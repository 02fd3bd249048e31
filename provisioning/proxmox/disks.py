"""Reading disks out of a VM config: the boot disk, sizes, a cloud-init drive.

Seed 000 entry 6: the resize step grows the boot disk to ``diskGiB`` when that is larger than
what the template gave; it must therefore find the boot disk and its current size exactly as
Proxmox describes them. Seed 000 entry 4: a template carrying a Proxmox cloud-init drive is
refused, because that drive would compete with proxyhub's seed ISO.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

# pve-reference §5.5: boot order entries that are disks (efidisk and tpmstate never boot).
_DISK_KEY = re.compile(r"(scsi|virtio|sata|ide)(0|[1-9][0-9]*)")
# Seed 000 entry 6, last fallback: the first of these that is present.
_DEFAULT_BOOT_DISKS = ("scsi0", "virtio0", "sata0", "ide0")
_BUS_ORDER = {"ide": 0, "sata": 1, "scsi": 2, "virtio": 3}

# pve-reference §5.4: ``size=`` is printed with K/M/G/T (or raw bytes); parsing accepts
# K, M, G, T and KiB ... TiB, optionally fractional.
_SIZE = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)(?P<unit>[KMGT](?:iB)?)?")
_UNIT_BYTES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

GIB = 1024**3


def gib(n: int) -> int:
    """``n`` GiB in bytes."""
    return n * GIB


def is_disk_key(key: str) -> bool:
    """Whether ``key`` names a disk slot (``scsiN``, ``virtioN``, ``sataN``, ``ideN``)."""
    return _DISK_KEY.fullmatch(key) is not None


def _options(value: str) -> list[str]:
    return [part.strip() for part in value.split(",")]


def is_cdrom(value: str) -> bool:
    """Whether a disk value describes a CD-ROM (``...,media=cdrom``)."""
    return "media=cdrom" in _options(value)


def _bootable(config: Mapping[str, str], key: str) -> bool:
    value = config.get(key)
    return bool(value) and is_disk_key(key) and not is_cdrom(str(value))


def boot_order(boot: str | None) -> list[str]:
    """The devices of a ``boot: order=a;b;c`` value, in order ([] for the legacy form)."""
    for option in _options(boot or ""):
        key, sep, devices = option.partition("=")
        if sep and key == "order":
            return [dev.strip() for dev in devices.split(";") if dev.strip()]
    return []


def boot_disk(config: Mapping[str, str]) -> str | None:
    """The config key of the disk the VM boots from, or None (seed 000 entry 6).

    The first disk in ``boot: order=...`` that is present and not a CD-ROM; else the legacy
    ``bootdisk`` key; else the first present of ``scsi0``, ``virtio0``, ``sata0``, ``ide0``.
    Once the seed is attached Proxmox appends ``ide2`` to the order (``order=scsi0;ide2``),
    which is why CD-ROMs are skipped rather than trusted.
    """
    for device in boot_order(config.get("boot")):
        if _bootable(config, device):
            return device
    legacy = config.get("bootdisk")
    if legacy and _bootable(config, legacy):
        return legacy
    for key in _DEFAULT_BOOT_DISKS:
        if _bootable(config, key):
            return key
    return None


def parse_size(text: str) -> int | None:
    """Bytes for a Proxmox size (``20G``, ``4712M``, ``1.5T``, ``4096``, ``8GiB``); None if bad."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    unit = (match.group("unit") or "")[:1]
    try:
        return int(Decimal(match.group("num")) * _UNIT_BYTES[unit])
    except InvalidOperation:
        return None


def disk_size_bytes(value: str) -> int | None:
    """The ``size=`` of a disk value in bytes, or None when absent or unreadable."""
    for option in _options(value):
        key, sep, size = option.partition("=")
        if sep and key == "size":
            return parse_size(size)
    return None


def _slot_sort_key(key: str) -> tuple[int, int]:
    match = _DISK_KEY.fullmatch(key)
    if match is None:  # only disk keys are sorted; keep any other last
        return (len(_BUS_ORDER), 0)
    return (_BUS_ORDER[match.group(1)], int(match.group(2)))


def cloudinit_drive(config: Mapping[str, str]) -> str | None:
    """The disk slot holding a Proxmox cloud-init drive, or None (seed 000 entry 4).

    A cloud-init drive's volume is ``<storage>:vm-<vmid>-cloudinit`` (pve-reference §5.4).
    Slots are scanned in a fixed order so the answer does not depend on the config's order.
    """
    for key in sorted((k for k in config if is_disk_key(k)), key=_slot_sort_key):
        if "cloudinit" in str(config[key]):
            return key
    return None
