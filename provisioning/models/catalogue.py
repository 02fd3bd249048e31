"""The catalogue: Proxmox clusters with their nodes, templates and machine types.

A ``Cluster`` row holds seed 000 entry 15's block; its children are edited inline in the admin
and imported from the catalogue YAML. Validation is the provider's own
(``ProxmoxConfig.problems``), so a value refused on import is refused in the admin too. The
token and the CA are never stored: only the paths of the files that hold them, and the SHA-256
fingerprint of the CA trusted for the url (issue 11). Vendor-data may carry secrets as user-data
does, so it is stored sealed (``provisioning.sealing``).
"""

from __future__ import annotations

from typing import Any, Self

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from provisioning import sealing
from provisioning.proxmox.config import (
    MachineType as MachineTypeSpec,
)
from provisioning.proxmox.config import (
    ProxmoxConfig,
    TemplateRef,
)

from .choices import DriftPolicy

LABEL = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
    "lower-case letters, digits and inner hyphens (a DNS label)",
)

# The largest quota a catalogue or the admin accepts: far above any real fleet, and small enough
# that a typo of a few extra digits is refused instead of meaning "unlimited".
QUOTA_MAX = 1_000_000

# Seed key path (ProxmoxConfig) → model field, so admin errors land on the right field.
_FIELD_FOR_PATH = {
    "name": "name",
    "url": "url",
    "tokenFile": "token_file",
    "caFile": "ca_file",
    "isoStorage": "iso_storage",
    "storage": "storage",
    "bridge": "bridge",
    "vlanTag": "vlan_tag",
    "pool": "pool",
    "vmidRange.min": "vmid_min",
    "vmidRange.max": "vmid_max",
    "requestTimeoutSeconds": "request_timeout_seconds",
    "driftPolicy": "drift_policy",
}


class Cluster(models.Model):
    """A configured Proxmox endpoint (seed 000 entry 15), named like ``proxmox-home``."""

    name = models.CharField(max_length=63, unique=True, validators=[LABEL])
    url = models.CharField(
        max_length=255, help_text="https://HOST:8006 of any node; the host must be in its cert"
    )
    token_file = models.CharField(
        max_length=1024,
        help_text="path of a file holding USER@REALM!TOKENID=SECRET, read on every request",
    )
    ca_file = models.CharField(
        max_length=1024, blank=True, help_text="PEM bundle to verify the node; blank: system roots"
    )
    insecure_skip_tls_verify = models.BooleanField(default=False)
    iso_storage = models.CharField(max_length=64, help_text="storage for the seed ISOs")
    storage = models.CharField(
        max_length=64, blank=True, help_text="clone target storage; blank: the template's"
    )
    bridge = models.CharField(max_length=64, blank=True)
    vlan_tag = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(4094)]
    )
    # Issue 14: the resource pool clones join (``bootstrap_cluster`` creates it and grants
    # proxyhub's role on it); blank: clones join no pool.
    pool = models.CharField(
        max_length=64, blank=True, help_text="Proxmox resource pool every clone joins; blank: none"
    )
    vmid_min = models.PositiveIntegerField(default=100000)
    vmid_max = models.PositiveIntegerField(default=199999)
    request_timeout_seconds = models.FloatField(default=30.0)
    # Sealed like a proxy's cloud-init: the ``vendor_data`` property opens it.
    vendor_data_sealed = models.BinaryField(default=b"", editable=False)
    install_guest_agent = models.BooleanField(default=True)
    # Issue 14: what reconcile does about a proxy VM whose cores, memory or net0 no longer
    # match the catalogue (``services.reconcile``, ``proxmox/drift.py``).
    drift_policy = models.CharField(
        max_length=8,
        choices=DriftPolicy.choices,
        default=DriftPolicy.REPORT,
        help_text="report: show drift on the proxy; repair: also set the VM back to the "
        "catalogue (idle proxies only, rebooting only when Proxmox keeps the change pending)",
    )
    # Issue 11: the CA proxyhub trusts for ``url``, as ``credentials.ca_fingerprint`` writes it.
    # Recorded when someone allowed to change the endpoint saves or imports it, or by the first
    # preflight; the transport refuses a caFile whose CA no longer matches. A new url clears it
    # (``save``), so trust given to one host never carries over to another.
    ca_fingerprint = models.CharField(
        "CA fingerprint (SHA-256)", max_length=95, blank=True, editable=False
    )
    # Quotas (catalogue key ``quotas``): blank is unlimited, 0 refuses every new one. They are
    # enforced when a proxy is declared (services.quotas), never on work already admitted.
    max_proxies = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(QUOTA_MAX)],
        help_text="live proxies (not being deleted) the cluster may hold; blank: unlimited",
    )
    max_concurrent_creates = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(QUOTA_MAX)],
        help_text="creates and replaces in flight at once; blank: unlimited",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            (
                "change_cluster_endpoint",
                "Can change a cluster's endpoint: url, token file, CA file and TLS verification",
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(vmid_min__lt=models.F("vmid_max")),
                name="cluster_vmid_range_ordered",
            ),
            models.CheckConstraint(
                condition=models.Q(vlan_tag__isnull=True)
                | models.Q(vlan_tag__gte=1, vlan_tag__lte=4094),
                name="cluster_vlan_tag_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    # Not fields: what ``save`` needs to know about this instance (see ``save``).
    _stored_url: str | None = None
    _ca_trust_given: bool = False

    @classmethod
    def from_db(cls, db: Any, field_names: Any, values: Any) -> Self:
        row = super().from_db(db, field_names, values)
        # The url as stored, so ``save`` can tell a new one (deferred: unknown, taken as new).
        row._stored_url = row.__dict__.get("url")
        return row

    def trust_ca(self, fingerprint: str) -> None:
        """Record ``fingerprint`` as the CA trusted for the url this row is saved with."""
        self.ca_fingerprint = fingerprint
        self._ca_trust_given = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A url other than the stored one drops the CA trust, unless the caller gave trust for
        # the new url in this very save (``trust_ca``).
        stored = getattr(self, "_stored_url", None)
        if (
            self.pk is not None
            and stored != self.url
            and not getattr(self, "_ca_trust_given", False)
        ):
            self.ca_fingerprint = ""
            update_fields = kwargs.get("update_fields")
            if update_fields is not None and "url" in update_fields:
                kwargs["update_fields"] = {*update_fields, "ca_fingerprint"}
        super().save(*args, **kwargs)
        self._stored_url = self.url
        self._ca_trust_given = False

    @property
    def vendor_data(self) -> str:
        """The extra vendor-data, in clear; never log or show it. Raises ``SealError`` when no
        configured key opens it."""
        if not self.vendor_data_sealed:
            return ""
        return sealing.unseal(bytes(self.vendor_data_sealed)).decode("utf-8")

    @vendor_data.setter
    def vendor_data(self, text: str) -> None:
        self.vendor_data_sealed = sealing.seal(text.encode("utf-8")) if text else b""

    def proxmox_config(self, installation_id: str) -> ProxmoxConfig:
        """The provider's view of this cluster, children included (one query each)."""
        return self._config(
            installation_id=installation_id,
            nodes=tuple(self.nodes.order_by("position", "name").values_list("name", flat=True)),
            templates={t.key: t.ref() for t in self.templates.order_by("key")},
            machine_types={
                m.key: MachineTypeSpec(m.cores, m.memory_mib, m.disk_gib)
                for m in self.machine_types.order_by("key")
            },
        )

    def clean(self) -> None:
        """Entry 15's rules for the cluster's own fields (children are checked by their forms,
        so stand-ins fill their places here)."""
        config = self._config(
            installation_id="x",
            nodes=("placeholder",),
            templates={"placeholder": TemplateRef(100)},
            machine_types={"placeholder": MachineTypeSpec(1, 16)},
        )
        errors: dict[str, list[str]] = {}
        for problem in config.problems():
            field = _FIELD_FOR_PATH.get(problem.path, "__all__")
            errors.setdefault(field, []).append(problem.message)
        if errors:
            raise ValidationError(errors)

    def _config(
        self,
        *,
        installation_id: str,
        nodes: tuple[str, ...],
        templates: dict[str, TemplateRef],
        machine_types: dict[str, MachineTypeSpec],
    ) -> ProxmoxConfig:
        return ProxmoxConfig(
            name=self.name,
            url=self.url,
            token_file=self.token_file,
            ca_file=self.ca_file or None,
            insecure_skip_tls_verify=self.insecure_skip_tls_verify,
            nodes=nodes,
            iso_storage=self.iso_storage,
            storage=self.storage or None,
            bridge=self.bridge or None,
            vlan_tag=self.vlan_tag,
            pool=self.pool or None,
            vmid_min=self.vmid_min,
            vmid_max=self.vmid_max,
            templates=templates,
            machine_types=machine_types,
            request_timeout_seconds=self.request_timeout_seconds,
            vendor_data=self.vendor_data or None,
            install_guest_agent=self.install_guest_agent,
            drift_policy=self.drift_policy,
            installation_id=installation_id,
            credentials_dir=settings.PROXYHUB_CREDENTIALS_DIR,
            ca_fingerprint=self.ca_fingerprint or None,
        )


class Node(models.Model):
    """A node of a cluster, as Proxmox names it; order is the config order of checks."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=63, validators=[LABEL])
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["cluster", "position", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Template(models.Model):
    """A catalogue image key mapped to a template VMID (entry 4), with seed 003's template
    declaration (blank for templates registered before issue 14) and, for a template built
    once per node on local storage, its per-node copies (node → VMID; a create clones the copy
    on its node)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="templates")
    key = models.CharField(max_length=63, validators=[LABEL])
    vmid = models.PositiveIntegerField(validators=[MinValueValidator(100)])
    template_version = models.CharField(
        max_length=128,
        blank=True,
        validators=[RegexValidator(r"^[A-Za-z0-9._+-]{1,128}$", "letters, digits, . _ + -")],
        help_text="operator-recorded template revision label (seed 003)",
    )
    disk_device = models.CharField(
        max_length=8,
        blank=True,
        choices=[("scsi0", "scsi0"), ("virtio0", "virtio0"), ("sata0", "sata0")],
        help_text="the template's boot disk",
    )
    source_disk_gib = models.PositiveIntegerField(
        "source disk GiB",
        null=True,
        blank=True,
        validators=[MinValueValidator(4), MaxValueValidator(4096)],
        help_text="the template disk's size, 4-4096 GiB",
    )
    guest_user = models.CharField(
        max_length=32,
        blank=True,
        validators=[
            RegexValidator(
                r"^(?!root$)[a-z_][a-z0-9_-]{0,31}$",
                "1-32 lower-case letters, digits, _ or -, starting with a letter or _; not root",
            )
        ],
        help_text="the image's cloud-init default user",
    )
    copies = models.JSONField(
        default=dict,
        blank=True,
        help_text="per-node copies on local storage, node name → VMID (templates build "
        "--all-nodes)",
    )
    wait_for_cloud_init = models.BooleanField(
        "wait for cloud-init",
        default=False,
        help_text="Running only once cloud-init reports done in the guest, not at its first "
        "address (needs VM.GuestAgent.FileRead)",
    )

    class Meta:
        ordering = ["cluster", "key"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "key"], name="template_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.key} (VM {self.vmid})"

    def ref(self) -> TemplateRef:
        """The provider's view of this template."""
        return TemplateRef(
            self.vmid,
            template_version=self.template_version or None,
            disk_device=self.disk_device or None,
            source_disk_gib=self.source_disk_gib,
            guest_user=self.guest_user or None,
            copies={str(k): int(v) for k, v in (self.copies or {}).items()},
            wait_for_cloud_init=self.wait_for_cloud_init,
        )


class MachineType(models.Model):
    """A catalogue machine type: cores, memory and an optional boot disk size (entry 6)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="machine_types")
    key = models.CharField(max_length=63, validators=[LABEL])
    cores = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(validators=[MinValueValidator(16)])
    disk_gib = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "key"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "key"], name="machinetype_unique_per_cluster"
            ),
            models.CheckConstraint(condition=models.Q(cores__gte=1), name="machinetype_cores_min"),
            models.CheckConstraint(
                condition=models.Q(memory_mib__gte=16), name="machinetype_memory_min"
            ),
        ]

    def __str__(self) -> str:
        disk = f", {self.disk_gib} GiB" if self.disk_gib else ""
        return f"{self.key} ({self.cores} cores, {self.memory_mib} MiB{disk})"
