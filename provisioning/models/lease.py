"""Named leases for jobs that must run once at a time across all machines (reconcile, GC)."""

from __future__ import annotations

from django.db import models


class JobLease(models.Model):
    """Held by one process until ``expires_at``; taken by a conditional UPDATE (STYLE.md)."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=64, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.holder or 'free'})"
