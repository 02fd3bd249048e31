"""Sending again the step messages that were lost (DESIGN.md §6).

The broker is only a doorbell; the journal is the truth. The sweeper looks for two things:

* **a claim that expired**: a delivery took the step and then stopped renewing its claim (its
  worker was killed). Its message is gone with it, so the step gets a new token and a new
  message at once. Claims are short and renewed while a step runs (``services.claims``), so
  this happens within seconds of the kill, not minutes;
* **a step overdue with no claim**: its due time passed by the grace period and nobody took it.
  The message may be lost (a broker restarted empty, a killed worker that held countdown
  messages) or merely still queued behind a backlog; the sweeper cannot tell, so it sends the
  *same* token again. Whichever copy arrives first runs the step and the other finds nothing to
  do, so a queued message is never cancelled. Each further re-send of one message waits twice
  as long as the last (``redispatches``), so a backlog costs a few extra messages per
  operation, not one per sweep. The copy goes at the first priority
  (``dispatch.PRIORITY_UNDER_WAY``): a step that could wait has waited long enough.

It also frees the task slots (``services.slots``) a lost worker left held, and hands free slots
to steps whose wake-up was lost.

The sweeper runs every ``PROXYHUB_SWEEPER_INTERVAL_SECONDS`` on the control queue, where step
traffic cannot starve it.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from provisioning.models import Operation
from provisioning.models.choices import ACTIVE_STATES

from . import dispatch, slots
from .clock import db_now

log = logging.getLogger("proxyhub.operations")

# How late a step may be before its message counts as lost (PROXYHUB_SWEEPER_GRACE_SECONDS).
GRACE = timedelta(seconds=10)
# The longest wait between two re-sends of one message.
MAX_RESEND_INTERVAL = timedelta(minutes=10)
BATCH = 1000


def _grace() -> timedelta:
    return timedelta(
        seconds=float(getattr(settings, "PROXYHUB_SWEEPER_GRACE_SECONDS", GRACE.total_seconds()))
    )


def operations_sweep(*, grace: timedelta | None = None) -> int:
    """Send again every step whose message looks lost; returns how many were sent."""
    grace = _grace() if grace is None else grace
    now = db_now()
    # Slots first: a freed slot wakes its waiter now rather than at the overdue re-send.
    slots.slots_recover(now=now)
    return _expired_claims(now) + _overdue(now, grace)


def _expired_claims(now: datetime) -> int:
    """Steps whose delivery died mid-step: a new token, a new message, now."""
    rows = list(
        Operation.objects.filter(state__in=ACTIVE_STATES, claim_expires_at__lt=now)
        .exclude(claim_token="")
        .values_list("pk", "claim_token")[:BATCH]
    )
    sent = 0
    for pk, claim in rows:
        token = secrets.token_hex(8)
        with transaction.atomic():
            updated = Operation.objects.filter(
                pk=pk, claim_token=claim, claim_expires_at__lt=now, state__in=ACTIVE_STATES
            ).update(
                claim_token="",
                claim_expires_at=None,
                dispatch_token=token,
                dispatched_at=now,
                next_step_at=now,
                redispatches=0,
            )
            if updated:
                dispatch.send_after_commit(str(pk), token, priority=dispatch.PRIORITY_UNDER_WAY)
                sent += 1
    if sent:
        log.info("steps of lost deliveries sent again", extra={"count": sent})
    return sent


def _overdue(now: datetime, grace: timedelta) -> int:
    """Steps due for longer than the grace with no claim: the same token, sent again."""
    free = Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=now)
    rows = list(
        Operation.objects.filter(state__in=ACTIVE_STATES, next_step_at__lte=now - grace)
        .filter(free)
        .exclude(dispatch_token="")
        .filter(Q(dispatched_at__isnull=True) | Q(dispatched_at__lte=now - grace))
        .values_list("pk", "dispatch_token", "dispatched_at", "redispatches")[:BATCH]
    )
    sent = 0
    for pk, token, dispatched_at, redispatches in rows:
        wait = min(MAX_RESEND_INTERVAL, grace * (2 ** min(redispatches, 16)))
        if dispatched_at is not None and dispatched_at > now - wait:
            continue  # sent again recently: give that message its time
        with transaction.atomic():
            updated = (
                Operation.objects.filter(
                    pk=pk,
                    dispatch_token=token,
                    state__in=ACTIVE_STATES,
                    redispatches=redispatches,
                )
                .filter(free)
                .update(dispatched_at=now, redispatches=redispatches + 1)
            )
            if updated:
                dispatch.send_after_commit(str(pk), token, priority=dispatch.PRIORITY_UNDER_WAY)
                sent += 1
    if sent:
        log.info("overdue step messages sent again", extra={"count": sent})
    return sent
