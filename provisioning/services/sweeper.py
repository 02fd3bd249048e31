"""Re-sending lost step messages (DESIGN.md §6).

Every unfinished operation has the time its next step is due. One whose due time passed by a
grace period while no delivery holds its claim has lost its message (a broker restart, a killed
worker before it acked a countdown message): it gets a new dispatch token and a new message.
The old message, should it still arrive, no longer matches the token and does nothing. So a
lost message delays work by at most one sweep interval plus the grace, and never loses it.
"""

from __future__ import annotations

import functools
import logging
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from provisioning.models import Operation
from provisioning.models.choices import ACTIVE_STATES

log = logging.getLogger("proxyhub.operations")

# How late a step may be before it counts as lost (setting PROXYHUB_SWEEPER_GRACE_SECONDS).
GRACE = timedelta(seconds=30)
BATCH = 1000


def operations_sweep(*, grace: timedelta | None = None) -> int:
    """Re-send every overdue step; returns how many were re-sent."""
    from provisioning.tasks import send_step

    if grace is None:
        grace = timedelta(
            seconds=float(
                getattr(settings, "PROXYHUB_SWEEPER_GRACE_SECONDS", GRACE.total_seconds())
            )
        )
    now = timezone.now()
    overdue = (
        Operation.objects.filter(state__in=ACTIVE_STATES, next_step_at__lte=now - grace)
        .filter(Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=now))
        .values_list("pk", "next_step_at")[:BATCH]
    )
    resent = 0
    for pk, due in overdue:
        token = secrets.token_hex(8)
        with transaction.atomic():
            # Conditional: a delivery that claimed or rescheduled it meanwhile wins.
            updated = (
                Operation.objects.filter(pk=pk, next_step_at=due, state__in=ACTIVE_STATES)
                .filter(Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=now))
                .update(dispatch_token=token, dispatched_at=now, next_step_at=now)
            )
            if updated:
                # Bound now: the callback runs after commit, when the loop has moved on.
                transaction.on_commit(functools.partial(send_step, str(pk), token))
                resent += 1
    if resent:
        log.info("lost step messages re-sent", extra={"count": resent})
    return resent
