"""Maintenance windows (issue 14): while one is on, proxyhub writes nothing to its cluster or node.

A row is one switch that is on: the whole cluster (``node`` blank) or one of its nodes. Turning
maintenance off deletes the row; no history is kept beyond the journal of what waited. Every
step of every operation reads this table before it may write (``services.maintenance``), so it
stays small (one row per switch that is on) and is read by its unique index.
"""

from __future__ import annotations

from django.db import models

from .catalogue import Cluster

REASON_MAX = 200


class MaintenanceWindow(models.Model):
    """Maintenance that is on now, who turned it on, when and why (shown on every page)."""

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="maintenance_windows"
    )
    node = models.CharField(max_length=63, blank=True, help_text="blank: the whole cluster")
    reason = models.CharField(max_length=REASON_MAX)
    started_by = models.CharField(max_length=150)
    started_at = models.DateTimeField()

    class Meta:
        ordering = ["cluster__name", "node"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "node"], name="maintenance_one_per_target")
        ]
        permissions = [("change_maintenance", "Can turn maintenance on and off")]

    def __str__(self) -> str:
        return f"maintenance on {self.target}"

    @property
    def target(self) -> str:
        """``cluster`` or ``cluster/node``, as the banner and the command name it."""
        name = self.cluster.name
        return f"{name}/{self.node}" if self.node else name
