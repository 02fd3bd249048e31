"""Seed 000 entries 4 and 6: the boot disk, its size, and a template's cloud-init drive."""

from __future__ import annotations

import pytest

from provisioning.proxmox.disks import boot_disk, cloudinit_drive, disk_size_bytes, gib

DISK = "local-lvm:vm-100-disk-0,discard=on,size=8G"
CDROM = "local:iso/proxy-a-seed.iso,media=cdrom"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # The template as Phase 0 found it, and after the seed is attached (F19).
        ({"boot": "order=scsi0", "scsi0": DISK}, "scsi0"),
        ({"boot": "order=scsi0;ide2", "scsi0": DISK, "ide2": CDROM}, "scsi0"),
        ({"boot": "order=scsi0;ide2;net0", "scsi0": DISK, "ide2": CDROM, "net0": "x"}, "scsi0"),
        # A CD-ROM first in the order is skipped for the first real disk.
        ({"boot": "order=ide2;virtio1", "ide2": CDROM, "virtio1": DISK}, "virtio1"),
        # An order entry that is not present is skipped.
        ({"boot": "order=scsi1;sata0", "sata0": DISK}, "sata0"),
        # The legacy `bootdisk` key, when the order names no disk.
        ({"boot": "cdn", "bootdisk": "virtio0", "virtio0": DISK, "scsi0": DISK}, "virtio0"),
        ({"boot": "order=net0", "net0": "x", "bootdisk": "sata1", "sata1": DISK}, "sata1"),
        # Then the first present of scsi0, virtio0, sata0, ide0.
        ({"virtio0": DISK, "ide0": DISK}, "virtio0"),
        ({"ide0": DISK, "sata0": DISK}, "sata0"),
        ({"ide0": DISK}, "ide0"),
        # A CD-ROM in a default slot is not a boot disk.
        ({"ide0": "none,media=cdrom", "sata0": DISK}, "sata0"),
        # Efidisk and tpmstate never boot; none at all.
        ({"efidisk0": DISK, "tpmstate0": DISK}, None),
        ({"boot": "order=ide2", "ide2": CDROM}, None),
        ({}, None),
    ],
)
def test_boot_disk_table(config: dict[str, str], expected: str | None) -> None:
    assert boot_disk(config) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (DISK, gib(8)),
        ("local-lvm:vm-100-disk-0,size=4712M", 4712 * 1024**2),
        ("local-lvm:vm-100-disk-0,size=2T,ssd=1", 2 * 1024**4),
        ("local-lvm:vm-100-disk-0,size=512K", 512 * 1024),
        ("local-lvm:vm-100-disk-0,size=1.5G", 3 * 1024**3 // 2),
        ("local-lvm:vm-100-disk-0,size=10GiB", gib(10)),
        ("local-lvm:vm-100-disk-0,size=4096", 4096),
        ("local-lvm:vm-100-disk-0", None),
        ("local-lvm:vm-100-disk-0,size=", None),
        ("local-lvm:vm-100-disk-0,size=big", None),
        ("local-lvm:vm-100-disk-0,size=8P", None),
    ],
)
def test_disk_size_bytes(value: str, expected: int | None) -> None:
    assert disk_size_bytes(value) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"scsi0": DISK, "ide2": "local-lvm:vm-9000-cloudinit,media=cdrom"}, "ide2"),
        ({"scsi0": DISK, "sata3": "local-lvm:vm-9000-cloudinit,media=cdrom,size=4M"}, "sata3"),
        ({"scsi0": DISK, "ide2": CDROM}, None),
        # Only disk slots count; a description mentioning cloud-init does not.
        ({"scsi0": DISK, "description": "uses cloudinit"}, None),
    ],
)
def test_cloudinit_drive(config: dict[str, str], expected: str | None) -> None:
    assert cloudinit_drive(config) == expected
