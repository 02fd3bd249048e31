"""The journal: every create, delete, replace and power action, with its steps and UPIDs.

The journal is the source of truth for progress (DESIGN.md §4) and outlives the proxy it
served. ``progress`` holds the provider's step-machine record; the next step of an operation
that is not finished is due at ``next_step_at``, and the sweeper re-sends any due step whose
message was lost, so a lost message delays work and never loses it (DESIGN.md §6).
"""

from __future__ import annotations

import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from .catalogue import Cluster
from .choices import ErrorClass, OperationKind, OperationState, RequestedVia, StepState
from .proxy import Proxy


def new_trace_parent() -> str:
    """A W3C ``traceparent`` reserved for the operation's span: a new trace id and span id.

    Every step of the operation, on whichever worker, is traced as a child of this span, and
    the operation's own span is recorded with these ids when it ends (services.tracing). The
    ids are random and say nothing about the operation; with tracing off nobody reads them."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


class Operation(models.Model):
    """One piece of background work on one proxy, who asked for it, and how it went."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    proxy = models.ForeignKey(
        Proxy, on_delete=models.SET_NULL, null=True, blank=True, related_name="operations"
    )
    proxy_name = models.CharField(max_length=57, help_text="kept when the proxy is gone")
    cluster = models.ForeignKey(Cluster, on_delete=models.SET_NULL, null=True, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    # Who asked, as text, kept when the user is deleted: the console user's name, or for a
    # command the operating-system user who ran it (the audit needs both).
    requested_by_name = models.CharField(max_length=150, blank=True)
    requested_via = models.CharField(
        max_length=16, choices=RequestedVia.choices, default=RequestedVia.COMMAND
    )
    idempotency_key = models.CharField(max_length=128, null=True, blank=True, unique=True)
    # Why the control loop started it (reconcile's operations); empty when an operator asked.
    reason = models.CharField(max_length=255, blank=True)
    inputs_hash = models.CharField(max_length=64, blank=True)

    state = models.CharField(
        max_length=16, choices=OperationState.choices, default=OperationState.QUEUED
    )
    progress = models.JSONField(default=dict, blank=True)
    next_step_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # The token the one legitimate step message carries; a stale or duplicated message does not
    # match and exits without doing anything. The sweeper issues a new one for a lost message.
    dispatch_token = models.CharField(max_length=32, blank=True)
    # A delivery that is running a step holds this claim; a duplicate delivery sees it and exits.
    claim_token = models.CharField(max_length=64, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="transient failures in a row")
    faults = models.PositiveIntegerField(
        default=0, help_text="transient faults met over the operation's life"
    )
    # How often the sweeper re-sent the current message because it looked lost; each re-send
    # waits twice as long as the one before, so a queue backlog never multiplies messages.
    redispatches = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, choices=ErrorClass.choices, blank=True)

    # Set from the database's clock by the services (services.clock): ages and ceilings are
    # measured against it, whichever host created the operation.
    trace_parent = models.CharField(max_length=55, default=new_trace_parent, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Issue 14: while maintenance holds the operation's next write, ``paused_since`` is when the
    # pause began; when it ends, its length is added to ``paused_seconds``. Paused time is not
    # the operation's fault, so it does not count toward the age ceiling (services.policy).
    paused_since = models.DateTimeField(null=True, blank=True)
    paused_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["state", "next_step_at"], name="operation_due_idx"),
            models.Index(fields=["proxy", "-created_at"], name="operation_proxy_idx"),
            models.Index(fields=["kind", "state"], name="operation_kind_state_idx"),
            models.Index(fields=["-created_at"], name="operation_created_idx"),
        ]
        constraints = [
            # One chain at a time per proxy: a newer intent supersedes (ends) the older one in
            # the same transaction that starts it, so two unfinished operations on one proxy
            # mean a bug; the database refuses it rather than letting both run.
            models.UniqueConstraint(
                fields=["proxy"],
                condition=models.Q(state__in=["queued", "running", "waiting", "unknown"]),
                name="operation_one_active_per_proxy",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.proxy_name} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in (OperationState.SUCCEEDED, OperationState.FAILED)


class OperationStep(models.Model):
    """One step of an operation: a stage of the provider's step machine, with its receipt.

    A stage that spans several deliveries (a poll of a running task) stays one row, updated
    until it ends; ``upid`` is written before any wait starts.
    """

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="steps")
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=32)
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.RUNNING)
    upid = models.CharField(max_length=255, blank=True)
    message = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation", "seq"]
        constraints = [models.UniqueConstraint(fields=["operation", "seq"], name="step_unique_seq")]

    def __str__(self) -> str:
        return f"{self.seq}. {self.name} ({self.state})"

    @property
    def duration(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()
