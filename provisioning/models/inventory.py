"""The inventory: a read-only snapshot of every guest on each cluster (issue 14, seed 001).

Written only by ``services.inventory``, which replaces one cluster's rows at once from one
listing (``proxmox.inventory``); nothing in proxyhub acts on these rows.
"""

from __future__ import annotations

from django.db import models

from .catalogue import Cluster


class GuestType(models.TextChoices):
    QEMU = "qemu", "qemu (VM)"
    LXC = "lxc", "lxc (container)"


class GuestOwner(models.TextChoices):
    """Whose proxy a guest is (``proxmox.inventory``'s module docstring gives the rule)."""

    THIS = "this", "this installation"
    OTHER = "other", "another installation"
    FOREIGN = "foreign", "foreign"


class InventoryGuest(models.Model):
    """One guest of one cluster as the last successful refresh listed it.

    ``tags`` is Proxmox's stored form (``a;b``, pve-reference §5.2). ``mark_read`` says whether
    ``owner`` rests on the VM's description mark; False means the listing alone decided (a
    container, a template, a VM not named or tagged like a proxy) or the mark could not be read,
    in which case the guest is not claimed for anyone (``foreign``)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="inventory")
    vmid = models.PositiveIntegerField("VMID")
    name = models.CharField(max_length=255, blank=True)
    node = models.CharField(max_length=63)
    type = models.CharField(max_length=8, choices=GuestType.choices)
    status = models.CharField(max_length=32)
    lock = models.CharField(max_length=32, blank=True)
    tags = models.CharField(max_length=1024, blank=True)
    hastate = models.CharField("HA state", max_length=32, blank=True)
    template = models.BooleanField(default=False)
    pool = models.CharField(max_length=255, blank=True)
    owner = models.CharField(max_length=8, choices=GuestOwner.choices)
    mark_read = models.BooleanField(default=False)
    refreshed_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster", "vmid"]
        verbose_name = "inventory guest"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "vmid"], name="inventory_one_row_per_vmid")
        ]
        indexes = [models.Index(fields=["cluster", "owner"], name="inventory_owner")]

    def __str__(self) -> str:
        return f"{self.vmid} {self.name or '(no name)'}"


class InventoryRefresh(models.Model):
    """The last inventory refresh of one cluster: when its snapshot was taken, how many rows it
    kept out of how many listed (``truncated`` when over the cap), and the last failure. A failed
    refresh keeps the previous snapshot; ``error`` says why until a refresh succeeds."""

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, related_name="inventory_refresh"
    )
    refreshed_at = models.DateTimeField(null=True, blank=True)
    attempted_at = models.DateTimeField(null=True, blank=True)
    count = models.PositiveIntegerField(default=0)
    listed = models.PositiveIntegerField(default=0)
    truncated = models.BooleanField(default=False)
    unread = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["cluster__name"]
        verbose_name = "inventory refresh"

    def __str__(self) -> str:
        return f"inventory of {self.cluster_id}"
