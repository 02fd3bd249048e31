"""Node health results: one row per node per check round (seed 000 entry 16, DESIGN.md §4).

A round writes one row per configured node and moves the ``latest`` flag onto the new rows in
the same transaction, so "the latest result of every node" is an indexed filter rather than a
"greatest per group" query; a partial unique constraint keeps at most one latest row per node.
Older rows are history, pruned after ``PROXYHUB_HEALTH_RETENTION_DAYS``.
"""

from __future__ import annotations

from django.db import models

from provisioning.models import Cluster


class Reason(models.TextChoices):
    """Entry 16's reasons: the shared ones first, then the Proxmox ones, each a different fix."""

    # Labels are the reasons themselves: operators search for them and alert on them.
    REACHABLE = "Reachable", "Reachable"
    TIMEOUT = "Timeout", "Timeout"
    UNREACHABLE = "Unreachable", "Unreachable"
    UNAUTHORIZED = "Unauthorized", "Unauthorized"
    FORBIDDEN = "Forbidden", "Forbidden"
    API_ERROR = "APIError", "APIError"
    CERTIFICATE_INVALID = "CertificateInvalid", "CertificateInvalid"
    CREDENTIALS_UNAVAILABLE = "CredentialsUnavailable", "CredentialsUnavailable"
    STORAGE_NOT_FOUND = "StorageNotFound", "StorageNotFound"
    TEMPLATE_NOT_FOUND = "TemplateNotFound", "TemplateNotFound"


class NodeHealth(models.Model):
    """One node's check in one round: ready only when the reason is ``Reachable``.

    ``details`` holds what the check learnt as far as it got (``pveVersion``, ``kernel``,
    ``tokenID`` without the secret, ``isoStorage``, ``isoStorageAvailGiB``, ``templates``,
    ``memFreeBytes``); ``isoStorage`` is always there.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="node_health")
    node = models.CharField(max_length=63)
    ready = models.BooleanField()
    reason = models.CharField(max_length=32, choices=Reason.choices)
    message = models.TextField(help_text="what happened and what to fix")
    details = models.JSONField(default=dict, blank=True)
    duration = models.FloatField(help_text="seconds the node's check took")
    checked_at = models.DateTimeField(help_text="when the round for this cluster started")
    latest = models.BooleanField(
        default=False, help_text="the newest result of this node (older rows are history)"
    )

    class Meta:
        verbose_name = "node health result"
        ordering = ["-checked_at", "node"]
        constraints = [
            # Also the index behind every "latest per node" read.
            models.UniqueConstraint(
                fields=["cluster", "node"],
                condition=models.Q(latest=True),
                name="nodehealth_one_latest_per_node",
            ),
        ]
        indexes = [
            # The admin's list (newest first) and the retention pruning.
            models.Index(fields=["-checked_at"], name="nodehealth_checked_idx"),
            # A node's history, newest first.
            models.Index(fields=["cluster", "node", "-checked_at"], name="nodehealth_node_idx"),
            # The admin's filters.
            models.Index(fields=["reason", "-checked_at"], name="nodehealth_reason_idx"),
            models.Index(fields=["ready", "-checked_at"], name="nodehealth_ready_idx"),
            # Latest per node (placement, the banner, the cluster page, /metrics) is served by
            # the partial unique index behind the constraint above.
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.node}: {self.reason}"

    @property
    def mem_free_bytes(self) -> int | None:
        value = self.details.get("memFreeBytes") if isinstance(self.details, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
        return None
