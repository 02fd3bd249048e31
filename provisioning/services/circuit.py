"""The per-cluster circuit breaker (``models.CircuitBreaker``): cluster isolation.

Without it, every step of an unreachable cluster holds a worker slot for a connect or request
timeout (10 to 30 s) per attempt, and one dead cluster starves every other cluster's creates.
With it, the breaker opens after ``PROXYHUB_CIRCUIT_FAILURES`` connection failures in a row, or
at once after one that held the worker for ``COSTLY_FAILURE_SECONDS`` or more (a request that
timed out: a host that accepts connections and never answers costs a whole request timeout
per try). While it is open that cluster's steps are deferred to the breaker's ``retry_at``
without running: a delivery costs milliseconds and holds nothing.

At ``retry_at`` one delivery (a conditional UPDATE elects it) probes the cluster with one cheap
request bounded by ``PROXYHUB_CIRCUIT_PROBE_SECONDS``, not with a real step that could hold the
worker for a full request timeout. If Proxmox answers, the breaker closes and the step runs;
if not, the breaker opens again for twice as long, up to ``PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS``.
A deferred step does not count as an attempt: the outage is the cluster's, not the
operation's (its age ceiling still applies).

Only failures to reach Proxmox at all count (``ClassifiedError.unreachable``: refused, reset,
timed out). A 595 from a reachable pveproxy about one of its nodes does not: the cluster
answers, and the other nodes may be fine.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from provisioning.models import CircuitBreaker, CircuitState, Cluster
from provisioning.proxmox.deadline import Cancelled, Deadline, DeadlineExceeded
from provisioning.proxmox.errors import ProxmoxError, classify

from .clock import db_now
from .providers import provider_for

log = logging.getLogger("proxyhub.circuit")

FAILURES = 5
OPEN_SECONDS = 15.0
MAX_OPEN_SECONDS = 120.0
# The probe's own bound: one request, answered in milliseconds by a live pveproxy.
PROBE_SECONDS = 3.0
# A failure that held the worker this long opens the breaker at once.
COSTLY_FAILURE_SECONDS = 5.0
# How long a probe may take before another delivery may probe instead (its worker may have died).
PROBE_LOST_SECONDS = 60.0


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass(frozen=True)
class Admission:
    """Whether a step of the cluster may run now, and if not, until when it waits."""

    allowed: bool
    until: datetime | None = None
    probe: bool = False


ALLOWED = Admission(True)


def circuit_admit(*, cluster: Cluster, breaker: CircuitBreaker | None, now: datetime) -> Admission:
    """Decide for one step of ``cluster``. ``breaker`` is the row as read with the operation
    (``None`` when the cluster never failed), so a closed breaker costs no query."""
    if breaker is None or breaker.state == CircuitState.CLOSED:
        return ALLOWED
    if breaker.retry_at is not None and breaker.retry_at > now:
        return Admission(False, until=breaker.retry_at)
    # Time for a probe (or the last probe never reported): one delivery wins it.
    won = CircuitBreaker.objects.filter(
        pk=cluster.pk, state=breaker.state, retry_at=breaker.retry_at
    ).update(
        state=CircuitState.HALF_OPEN,
        retry_at=now + timedelta(seconds=PROBE_LOST_SECONDS),
        changed_at=now,
    )
    if not won:
        return Admission(False, until=now + timedelta(seconds=random.uniform(1.0, 3.0)))
    return _probe(cluster)


def _probe(cluster: Cluster) -> Admission:
    """One cheap, short request: does the cluster answer at all?"""
    seconds = _setting("PROXYHUB_CIRCUIT_PROBE_SECONDS", PROBE_SECONDS)
    started = time.monotonic()
    try:
        provider_for(cluster).api.version(deadline=Deadline(seconds))
    except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
        error = classify("probe", err)
        log.info("circuit probe failed", extra={"cluster": cluster.name, "error": str(error)})
        circuit_record_failure(
            cluster_id=cluster.pk,
            error=str(error),
            now=db_now(),
            seconds=time.monotonic() - started,
        )
        reopened = CircuitBreaker.objects.filter(pk=cluster.pk).values_list("retry_at", flat=True)
        return Admission(False, until=reopened.first() or db_now())
    log.info("circuit probe answered", extra={"cluster": cluster.name})
    breaker = CircuitBreaker.objects.filter(pk=cluster.pk).first()
    circuit_record_success(cluster_id=cluster.pk, breaker=breaker, now=db_now())
    return Admission(True, probe=True)


def circuit_record_failure(
    *, cluster_id: int, error: str, now: datetime, seconds: float = 0.0
) -> None:
    """One more connection failure in a row (one that held the worker ``seconds``); opens the
    breaker at the threshold, or at once when the failure was costly."""
    threshold = int(_setting("PROXYHUB_CIRCUIT_FAILURES", FAILURES))
    first = _setting("PROXYHUB_CIRCUIT_OPEN_SECONDS", OPEN_SECONDS)
    cap = _setting("PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS", MAX_OPEN_SECONDS)
    with transaction.atomic():
        breaker = _locked(cluster_id)
        breaker.failures += 1
        breaker.last_error = error[:1000]
        reopen = breaker.state == CircuitState.HALF_OPEN
        costly = seconds >= COSTLY_FAILURE_SECONDS
        if reopen or (
            breaker.state == CircuitState.CLOSED and (breaker.failures >= threshold or costly)
        ):
            interval = min(cap, max(first, breaker.open_seconds) * 2) if reopen else first
            breaker.state = CircuitState.OPEN
            breaker.open_seconds = interval
            breaker.opened_at = breaker.opened_at if reopen else now
            breaker.retry_at = now + timedelta(seconds=interval)
            breaker.changed_at = now
            breaker.times_opened += 0 if reopen else 1
            log.warning(
                "circuit open",
                extra={"cluster_id": cluster_id, "seconds": interval, "error": error},
            )
        breaker.save()


def circuit_record_success(
    *, cluster_id: int, breaker: CircuitBreaker | None, now: datetime
) -> None:
    """Proxmox answered: the failures in a row end, and an open or probing breaker closes."""
    if breaker is None or (breaker.state == CircuitState.CLOSED and breaker.failures == 0):
        return
    closed = (
        CircuitBreaker.objects.filter(pk=cluster_id)
        .exclude(state=CircuitState.CLOSED, failures=0)
        .update(
            state=CircuitState.CLOSED,
            failures=0,
            retry_at=None,
            open_seconds=0.0,
            changed_at=now,
        )
    )
    if closed and breaker.state != CircuitState.CLOSED:
        log.info("circuit closed", extra={"cluster_id": cluster_id})


def _locked(cluster_id: int) -> CircuitBreaker:
    try:
        with transaction.atomic():
            CircuitBreaker.objects.get_or_create(pk=cluster_id)
    except IntegrityError:
        pass  # created concurrently
    return CircuitBreaker.objects.select_for_update().get(pk=cluster_id)
