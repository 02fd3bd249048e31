"""Job leases: one reconcile and one GC at a time, whatever runs Beat or the commands."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from provisioning.models import JobLease

log = logging.getLogger("proxyhub.jobs")


class LeaseHeld(Exception):
    """Another process holds the job's lease."""


@contextmanager
def job_lease(name: str, *, seconds: float) -> Iterator[str]:
    """Hold the lease ``name`` for the block, or raise ``LeaseHeld`` at once."""
    holder = secrets.token_hex(8)
    now = timezone.now()
    until = now + timedelta(seconds=seconds)
    try:
        with transaction.atomic():
            JobLease.objects.get_or_create(name=name)
    except IntegrityError:
        pass  # created concurrently; the update below decides
    taken = (
        JobLease.objects.filter(name=name)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__lt=now))
        .update(holder=holder, expires_at=until)
    )
    if not taken:
        log.info("lease held", extra={"job": name})
        raise LeaseHeld(f"{name} is already running elsewhere")
    try:
        yield holder
    finally:
        JobLease.objects.filter(name=name, holder=holder).update(holder="", expires_at=None)
