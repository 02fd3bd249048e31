"""Leases: one chain of steps per proxy, and one reconcile and one GC at a time.

**The proxy lease.** An operation holds its proxy's lease from its first step until it ends,
through every wait and backoff in between; only then may another operation of that proxy run a
step. It is taken under a lock on the proxy row, deciding on the row as it is once the lock is
held. (An UPDATE whose conditions sit in a subquery is not enough: PostgreSQL's READ COMMITTED
re-checks only the outer ``id`` after waiting for the row, so two waiters both won.) The lease
has no expiry to outlive: a holder that stopped without finishing is a finished operation (it
was superseded, or it failed), whose lease is free once no delivery of it still runs.

**Job leases** keep reconcile and GC single across every process that runs Beat or a command.
They are short and renewed while the round runs, so a round whose worker died frees its job
within one lease length.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q

from provisioning.models import JobLease, Operation, Proxy
from provisioning.models.choices import ACTIVE_STATES

from .claims import claim_live
from .clock import db_now
from .heartbeat import renewed

log = logging.getLogger("proxyhub.jobs")


class LeaseHeld(Exception):
    """Another process holds the job's lease."""


def proxy_lease_take(*, operation: Operation) -> bool:
    """Hold ``operation``'s proxy for it, or say that another operation still holds it."""
    proxy_id = operation.proxy_id
    if proxy_id is None:
        return True  # nothing to hold: the proxy row is gone (a delete that finished)
    # The fast path: a lease already ours stays ours while we are unfinished, and we are
    # (our delivery holds the claim of an active operation). The driver reads the proxy with
    # the operation, after taking the claim: that row answers without another query.
    if Operation.proxy.is_cached(operation):
        if operation.proxy is not None and operation.proxy.lease_operation_id == operation.pk:
            return True
    elif Proxy.objects.filter(pk=proxy_id, lease_operation=operation.pk).exists():
        return True
    with transaction.atomic():
        row = (
            Proxy.objects.select_for_update()
            .filter(pk=proxy_id)
            .values("lease_operation_id")
            .first()
        )
        if row is None:
            return True  # the proxy is gone: the step will find out and end
        holder = row["lease_operation_id"]
        if holder is not None and holder != operation.pk and _holder_busy(holder):
            return False
        Proxy.objects.filter(pk=proxy_id).update(lease_operation=operation.pk)
        return True


def _holder_busy(holder_id: uuid.UUID) -> bool:
    """Whether the holding operation still needs its proxy: unfinished, or finished with a
    delivery still running a step (a superseded operation's last step)."""
    holder = (
        Operation.objects.filter(pk=holder_id)
        .values("state", "claim_token", "claim_expires_at")
        .first()
    )
    if holder is None:
        return False
    if holder["state"] in ACTIVE_STATES:
        return True
    return claim_live(holder["claim_token"], holder["claim_expires_at"], db_now())


def proxy_lease_release(*, operation: Operation) -> None:
    if operation.proxy_id is None:
        return
    Proxy.objects.filter(pk=operation.proxy_id, lease_operation=operation.pk).update(
        lease_operation=None
    )


@contextmanager
def job_lease(name: str, *, seconds: float) -> Iterator[str]:
    """Hold the lease ``name`` for the block, or raise ``LeaseHeld`` at once.

    The lease lasts ``seconds`` and is renewed every third of that while the block runs
    (``heartbeat.renewed``), so it is held exactly as long as the round runs: a round killed
    with its worker (or by its task's hard time limit) frees it within ``seconds``.
    """
    holder = secrets.token_hex(8)
    now = db_now()
    try:
        with transaction.atomic():
            JobLease.objects.get_or_create(name=name)
    except IntegrityError:
        pass  # created concurrently; the update below decides
    taken = (
        JobLease.objects.filter(name=name)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__lt=now))
        .update(holder=holder, expires_at=now + timedelta(seconds=seconds))
    )
    if not taken:
        log.info("lease held", extra={"job": name})
        raise LeaseHeld(f"{name} is already running elsewhere")

    def renew() -> None:
        JobLease.objects.filter(name=name, holder=holder).update(
            expires_at=db_now() + timedelta(seconds=seconds)
        )

    try:
        with renewed(renew, every=seconds / 3, name=f"job-{name}"):
            yield holder
    finally:
        JobLease.objects.filter(name=name, holder=holder).update(holder="", expires_at=None)
