"""A circuit breaker per cluster: one unreachable Proxmox must not hold every worker slot."""

from __future__ import annotations

from django.db import models

from .catalogue import Cluster


class CircuitState(models.TextChoices):
    CLOSED = "closed"  # requests flow
    OPEN = "open"  # the cluster is deemed unreachable; its steps are deferred until retry_at
    HALF_OPEN = "half_open"  # one step probes the cluster; the others wait for its verdict


class CircuitBreaker(models.Model):
    """The breaker of one cluster, shared by every worker through the database.

    It opens after ``PROXYHUB_CIRCUIT_FAILURES`` consecutive connection failures (refused,
    reset, timed out: Proxmox never answered), then defers that cluster's steps without running
    them, so no worker slot waits on it. At ``retry_at`` one step is let through as a probe:
    success closes the breaker, failure opens it again for twice as long (up to
    ``PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS``).
    """

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, primary_key=True, related_name="circuit"
    )
    state = models.CharField(
        max_length=16, choices=CircuitState.choices, default=CircuitState.CLOSED
    )
    failures = models.PositiveIntegerField(default=0, help_text="connection failures in a row")
    opened_at = models.DateTimeField(null=True, blank=True)
    # Open: when a probe may go. Half-open: when a probe that never reported counts as lost.
    retry_at = models.DateTimeField(null=True, blank=True)
    open_seconds = models.FloatField(default=0.0, help_text="the current open interval")
    times_opened = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)
    # When the cluster last answered (kept to within WARM_REFRESH_SECONDS): a cluster that has
    # not answered lately runs one step at a time until it does.
    last_success_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.state}"
