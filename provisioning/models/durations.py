"""How long Proxmox work took lately, per cluster: what every wait on it is planned from."""

from __future__ import annotations

from django.db import models

from .catalogue import Cluster


class WorkDuration(models.Model):
    """A running estimate of one kind of Proxmox work on one cluster (``proxmox.waits``).

    ``kind`` is a task type as its UPIDs name it (``qmclone``, ``imgcopy``, ``resize``,
    ``qmstart``, ``qmshutdown``, ``qmdestroy``...) with ``scope`` the node it runs on, or
    ``boot`` with ``scope`` the image (start to the guest agent's address). ``seconds`` is when a
    look should find the work over, learned from the journal's finished waits; a cluster has at
    most a few rows per node and image, and losing them only makes the next waits start short.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="durations")
    kind = models.CharField(max_length=32)
    scope = models.CharField(max_length=128, help_text="the node, or the image for a boot")
    seconds = models.FloatField()
    samples = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "kind", "scope"], name="workduration_unique_kind_scope"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} on {self.scope}: {self.seconds:.3f} s"
