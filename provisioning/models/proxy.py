"""A proxy: what the operator asked for and what Proxmox was last seen to hold (DESIGN.md §4)."""

from __future__ import annotations

import hashlib
import uuid

from django.core.validators import RegexValidator
from django.db import models

from provisioning import sealing

from .catalogue import Cluster
from .choices import DesiredPower, DesiredState, ErrorClass, Phase

PROXY_NAME = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
    "a DNS label: lower-case letters, digits and inner hyphens, at most 57 characters",
)


class Proxy(models.Model):
    """One proxy VM. Its VM is named ``proxy-<name>``; ``uid`` ties the VM's mark to this row.

    The cloud-init is stored sealed (``provisioning.sealing``) beside its keyed digest
    (``cloud_init_sha256`` holds an HMAC-SHA256, not a plain SHA-256, since issue 11); editing a
    placement field or the cloud-init replaces the VM, which ``spec_hash`` detects.
    """

    name = models.CharField(max_length=57, unique=True, validators=[PROXY_NAME])
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="proxies")
    zone = models.CharField(
        max_length=63, blank=True, help_text="a node of the cluster; blank: chosen for you"
    )
    machine_type = models.CharField(max_length=63)
    image = models.CharField(max_length=63)
    cloud_init_sealed = models.BinaryField(default=b"", editable=False)
    cloud_init_sha256 = models.CharField(max_length=64, blank=True, editable=False)
    cloud_init_bytes = models.PositiveIntegerField(default=0, editable=False)

    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.PRESENT
    )
    desired_power = models.CharField(
        max_length=8, choices=DesiredPower.choices, default=DesiredPower.ON
    )

    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.PENDING)
    provider_id = models.CharField(max_length=128, blank=True)
    vmid = models.PositiveIntegerField(null=True, blank=True)
    node = models.CharField(max_length=63, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    vm_created_at = models.DateTimeField(null=True, blank=True)
    # Seed 001's identity of the VM, recorded when a create makes or adopts it (or, for a proxy
    # from before it was kept, at its first observation); compared on every observation, power
    # action and delete, so a VM restored from backup or re-created at the VMID is never ours.
    smbios_uuid = models.CharField("SMBIOS UUID", max_length=36, blank=True, editable=False)
    vmgenid = models.CharField("vmgenid", max_length=36, blank=True, editable=False)
    # Seed 001, issue 14: when a read last compared the VM's identity with the recorded one.
    # A VM the listing shows started after it may be another one (restored, re-created at the
    # VMID), so reconcile reads its identity again (services/identity_checks.py).
    identity_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    spec_hash = models.CharField(max_length=64, blank=True, editable=False)
    # Issue 14, drift. What the VM was built with: cores, memoryMiB, bridge, vlanTag (the last
    # two only when the cluster set them) and net0's MAC, recorded when a create made or adopted
    # it. Drift is measured against this, not the catalogue of today: a catalogue edit affects
    # only VMs created afterwards (DESIGN.md §4). Empty for a proxy from before it was kept,
    # until its first config read records the catalogue's figures and the MAC it finds.
    vm_spec = models.JSONField(default=dict, blank=True, editable=False)
    drift = models.JSONField(default=list, blank=True, editable=False)
    # Issue 14, seed 001 ("configuration digests are additional confirmation conditions"): the
    # ``digest`` of the VM's config as proxyhub last read it. A confirmation page shows it and
    # the confirmed action refuses a VM whose config has another digest since; any write of the
    # config by proxyhub (a create, a drift repair) blanks it, so a stale one is never offered.
    config_digest = models.CharField(max_length=64, blank=True, editable=False)
    # When the VM's config was last compared with the spec, and the listing's maxcpu/maxmem
    # then ("<cpus>/<bytes>"): reconcile reads a config again only when the listing shows other
    # figures or the comparison is older than the drift recheck interval (``services.drift``).
    drift_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    drift_listing = models.CharField(max_length=40, blank=True, editable=False)
    last_error = models.TextField(blank=True)
    last_error_class = models.CharField(max_length=16, choices=ErrorClass.choices, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)

    # One chain at a time per proxy, across all workers: the operation holding the lease. It
    # holds it until it finishes, through its own backoffs; it has no expiry to outlive.
    lease_operation = models.ForeignKey(
        "provisioning.Operation",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
    )
    # Moves on whenever an operation of this proxy starts or ends. Reconcile remembers it from
    # its snapshot and acts only if it has not moved since: a decision taken on a listing that
    # predates an operator's action must not undo it.
    generation = models.PositiveBigIntegerField(default=0, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "proxies"
        permissions = [
            ("provision_proxy", "Can provision, retry and replace proxies"),
            ("delete_proxy_vm", "Can delete proxies and their VMs"),
            ("power_proxy", "Can start, shut down and reboot proxies"),
            ("check_proxy", "Can preview and preflight proxies"),
        ]
        indexes = [
            models.Index(fields=["phase"], name="proxy_phase_idx"),
            models.Index(fields=["cluster", "phase"], name="proxy_cluster_phase_idx"),
            models.Index(fields=["node"], name="proxy_node_idx"),
            models.Index(fields=["vmid"], name="proxy_vmid_idx"),
            models.Index(fields=["ip"], name="proxy_ip_idx"),
            models.Index(fields=["created_at"], name="proxy_created_idx"),
            # The proxy list's machine type and image filters: without them a filtered count
            # and page scan the table (70 ms and 35 ms at 100,000 proxies; 0.1 ms with).
            models.Index(fields=["machine_type"], name="proxy_machine_type_idx"),
            models.Index(fields=["image"], name="proxy_image_idx"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def vm_name(self) -> str:
        return f"proxy-{self.name}"

    @property
    def cloud_init(self) -> bytes:
        """The user-data, byte for byte. Never log or show it."""
        if not self.cloud_init_sealed:
            return b""
        return sealing.unseal(bytes(self.cloud_init_sealed))

    def set_cloud_init(self, data: bytes) -> None:
        self.cloud_init_sealed = sealing.seal(data) if data else b""
        self.cloud_init_sha256 = sealing.digest(data) if data else ""
        self.cloud_init_bytes = len(data)

    def compute_spec_hash(self) -> str:
        """What the VM was built from: placement and cloud-init (a change replaces the VM)."""
        return spec_hash_of(
            self.cluster_id, self.zone, self.machine_type, self.image, self.cloud_init_sha256
        )


def spec_hash_of(
    cluster_id: int | None, zone: str, machine_type: str, image: str, cloud_init_digest: str
) -> str:
    """``Proxy.compute_spec_hash`` from its parts: a key rotation recomputes it with the new
    digest, and needs the old value with the old digest to know whether it was current."""
    parts = [str(cluster_id), zone, machine_type, image, cloud_init_digest]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
