"""The record of each garbage-collection round: what it removed and what it held back."""

from __future__ import annotations

from django.db import models


class GcRound(models.Model):
    """One GC round over every cluster, kept so an operator sees what GC did and did not do.

    ``held_back`` lists the candidates over the per-round cap (they wait for the next round),
    and ``refused`` says why a cluster was not collected at all (an installation identity that
    disagrees with the database, an unreachable cluster).
    """

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    dry_run = models.BooleanField(default=False)
    requested_via = models.CharField(max_length=16, blank=True)
    removed = models.JSONField(default=list, blank=True)
    held_back = models.JSONField(default=list, blank=True)
    refused = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name = "GC round"

    def __str__(self) -> str:
        return f"GC round {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def removed_count(self) -> int:
        return len(self.removed)

    @property
    def held_back_count(self) -> int:
        return len(self.held_back)
