"""Claims: which delivery runs an operation's step right now.

A step message carries the operation's ``dispatch_token``. The delivery that takes the claim
(a conditional UPDATE: token matches, step due, no live claim) clears the token, so a duplicate
or stale message finds nothing to do. The claim is short (``PROXYHUB_STEP_CLAIM_SECONDS``) and
renewed while the step runs, so a worker killed mid-step frees its step within seconds and the
sweeper sends it again, instead of waiting out a claim sized for the longest possible step.

A message that arrives before its step is due (a countdown measured on another host's clock)
is not dropped: it is sent again with the time that remains.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q, QuerySet

from provisioning.models import Operation
from provisioning.models.choices import ACTIVE_STATES

from . import dispatch, policy
from .clock import db_now
from .compiled_update import CompiledUpdate
from .heartbeat import renewed

log = logging.getLogger("proxyhub.operations")

# A message this close to its due time counts as due: re-queueing it would cost more than the
# wait it saves.
DUE_SLACK = timedelta(milliseconds=250)


def _take(p: Mapping[str, Any]) -> tuple[QuerySet[Operation], dict[str, Any]]:
    """The claim's UPDATE: the message's token matches, the step is due and no live claim
    holds it."""
    free = Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=p["now"])
    due = Q(next_step_at__isnull=True) | Q(next_step_at__lte=p["due_by"])
    operations = Operation.objects.filter(
        pk=p["pk"], dispatch_token=p["token"], state__in=ACTIVE_STATES
    ).filter(free, due)
    values = {
        "claim_token": p["claim"],
        "claim_expires_at": p["expires"],
        "dispatch_token": "",
        "redispatches": 0,
    }
    return operations, values


# Every delivery runs it first: compiled once per process (services.compiled_update).
_TAKE = CompiledUpdate(
    _take, pk=uuid.UUID, token=str, now=datetime, due_by=datetime, claim=str, expires=datetime
)


def claim_take(*, operation_id: str, token: str, now: datetime) -> str | None:
    """The claim on the operation's step for this delivery, or ``None`` when it is not ours
    to run (a duplicate, a stale token, a finished operation, or not yet due: then the message
    is sent again for when it is)."""
    claim = secrets.token_hex(8)
    ttl = timedelta(seconds=policy.claim_seconds())
    taken = _TAKE.run(
        pk=operation_id,
        token=token,
        now=now,
        due_by=now + DUE_SLACK,
        claim=claim,
        expires=now + ttl,
    )
    if taken:
        return claim
    early = (
        Operation.objects.filter(
            pk=operation_id,
            dispatch_token=token,
            state__in=ACTIVE_STATES,
            next_step_at__gt=now + DUE_SLACK,
        )
        .values_list("next_step_at", flat=True)
        .first()
    )
    if early is not None:
        remaining = (early - now).total_seconds()
        log.debug("early step delivery re-queued", extra={"operation": operation_id})
        dispatch.send_step(operation_id, token, remaining)
    else:
        log.debug("step delivery ignored", extra={"operation": operation_id})
    return None


def claim_live(claim_token: str, claim_expires_at: datetime | None, now: datetime) -> bool:
    """Whether a delivery still runs a step under this claim (it renews it while it runs)."""
    return bool(claim_token) and claim_expires_at is not None and claim_expires_at >= now


def claim_renewed(*, operation_id: str, claim: str) -> AbstractContextManager[None]:
    """Keep the claim alive while the block runs (``heartbeat.renewed``)."""
    ttl = policy.claim_seconds()

    def renew() -> None:
        Operation.objects.filter(pk=operation_id, claim_token=claim).update(
            claim_expires_at=db_now() + timedelta(seconds=ttl)
        )

    return renewed(renew, every=ttl / 3, name=f"claim-{operation_id[:8]}")
