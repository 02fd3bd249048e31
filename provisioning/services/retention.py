"""How long the journal keeps finished operations (``PROXYHUB_JOURNAL_RETENTION_DAYS``).

The journal outlives the proxy it served (DESIGN.md §4), but not forever: every create, power
action and delete adds an operation and a handful of step rows, and a fleet that is replaced
daily grows the table without bound. ``journal_prune`` deletes finished operations (and their
steps) whose end lies further back than the retention, with two exceptions:

* an unfinished operation (queued, running, waiting, unknown) is never touched, however old:
  it is live work, and the sweeper and reconcile still read it;
* for a proxy that still exists, its newest finished operation *of each kind* stays. That keeps
  the answer to the audit questions that outlive any retention window: who created the VM that
  is running now, and who last started, stopped, rebooted or replaced it. A fixed "last N" would
  not: five reboots would push out the create. A proxy's record shrinks to at most one row per
  kind; once the proxy is gone, its history ages out like any other.

Rows go in batches, each batch its own short transaction, so a first prune of a large journal
never holds a long lock on the table the workers write to.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q, QuerySet

from provisioning.models import Operation
from provisioning.models.choices import OperationState

from .clock import db_now

log = logging.getLogger("proxyhub.operations")

DEFAULT_RETENTION_DAYS = 90
BATCH = 500

FINISHED_STATES = (OperationState.SUCCEEDED, OperationState.FAILED)


def retention_days() -> int:
    """The configured retention; 0 or less keeps the journal forever."""
    return int(getattr(settings, "PROXYHUB_JOURNAL_RETENTION_DAYS", DEFAULT_RETENTION_DAYS))


def prunable_operations(*, cutoff: datetime) -> QuerySet[Operation]:
    """Finished operations that ended before ``cutoff`` and are not their live proxy's newest of
    their kind (module docstring)."""
    newer_of_kind = Operation.objects.filter(
        proxy=OuterRef("proxy"),
        kind=OuterRef("kind"),
        state__in=FINISHED_STATES,
        created_at__gt=OuterRef("created_at"),
    )
    # An operation ended when finished_at says; one that never recorded it ends at creation.
    ended_before = Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, created_at__lt=cutoff)
    return (
        Operation.objects.filter(state__in=FINISHED_STATES)
        .filter(ended_before)
        .filter(Q(proxy__isnull=True) | Exists(newer_of_kind))
    )


def journal_prune(*, now: datetime | None = None, batch: int = BATCH) -> int:
    """Delete finished operations older than the retention; returns how many were deleted."""
    days = retention_days()
    if days <= 0:
        return 0
    cutoff = (now or db_now()) - timedelta(days=days)
    deleted = 0
    while True:
        pks = list(prunable_operations(cutoff=cutoff).values_list("pk", flat=True)[:batch])
        if not pks:
            break
        # Re-checked in the DELETE itself: an operation cannot become unfinished again, but the
        # state filter costs nothing and keeps a live row safe from any future state change.
        _, per_model = Operation.objects.filter(pk__in=pks, state__in=FINISHED_STATES).delete()
        deleted += per_model.get(Operation._meta.label, 0)
        if len(pks) < batch:
            break
    if deleted:
        log.info("journal pruned", extra={"deleted": deleted, "days": days})
    return deleted
