"""Handing work to the queue: how services send a step without importing the tasks above them.

The services sit under the Celery tasks (tasks are thin doors onto services, STYLE.md), so they
cannot import ``provisioning.tasks``. They send by the task's registered name instead, which the
tasks declare with ``name=`` from the constants here. Every send happens after commit: a message
must never point at a row that a rolled-back transaction took back.

Tests replace ``send_step`` on this module (the service tests' pump does), so callers look it up
here at call time rather than binding it on import.
"""

from __future__ import annotations

from django.db import transaction

STEP_TASK = "proxyhub.provisioning.step"
SWEEP_TASK = "proxyhub.provisioning.sweep"
RECONCILE_TASK = "proxyhub.provisioning.reconcile"
GC_TASK = "proxyhub.provisioning.gc"
PRUNE_JOURNAL_TASK = "proxyhub.provisioning.prune_journal"

# Step messages travel on the default queue; the periodic jobs that keep the loop alive (sweep,
# reconcile, GC) have a small queue of their own, so a backlog of steps can never starve them.
STEP_QUEUE = "provisioning"
CONTROL_QUEUE = "control"


# The message header that carries the operation's trace context (services.tracing).
TRACE_HEADER = "traceparent"


def send_step(
    operation_id: str, token: str, countdown: float = 0.0, trace_parent: str = ""
) -> None:
    """Send the message for an operation's next step now (callers use ``send_after_commit``).
    ``trace_parent`` is the operation's reserved trace context: its steps' spans, on whichever
    worker, become children of the operation's span."""
    from celery import current_app

    current_app.send_task(
        STEP_TASK,
        kwargs={"operation_id": operation_id, "token": token},
        countdown=max(0.0, countdown),
        queue=STEP_QUEUE,
        headers={TRACE_HEADER: trace_parent} if trace_parent else None,
    )


def send_after_commit(
    operation_id: str, token: str, countdown: float = 0.0, trace_parent: str = ""
) -> None:
    """Send the step once the surrounding transaction commits (at once outside a transaction)."""
    transaction.on_commit(lambda: send_step(operation_id, token, countdown, trace_parent))
