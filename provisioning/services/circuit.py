"""The per-cluster circuit breaker (``models.CircuitBreaker``): cluster isolation.

Without it, every step of an unreachable cluster holds a worker slot for a connect or request
timeout (10 to 30 s) per attempt, and one dead cluster starves every other cluster's creates.
With it, after ``PROXYHUB_CIRCUIT_FAILURES`` connection failures in a row the breaker opens and
that cluster's steps are deferred to the breaker's ``retry_at`` without running: a delivery
costs milliseconds and holds nothing. At ``retry_at`` exactly one step runs as the probe (a
conditional UPDATE elects it); its success closes the breaker, its failure opens it again for
twice as long, up to ``PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS``. A deferred step does not count as an
attempt: the outage is the cluster's, not the operation's (its age ceiling still applies).

Only failures to reach Proxmox at all count (``ClassifiedError.unreachable``: refused, reset,
timed out). A 595 from a reachable pveproxy about one of its nodes does not: the cluster
answers, and the other nodes may be fine.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from provisioning.models import CircuitBreaker, CircuitState

log = logging.getLogger("proxyhub.circuit")

FAILURES = 5
OPEN_SECONDS = 15.0
MAX_OPEN_SECONDS = 120.0
# How long a probe may take before another step may probe instead (its worker may have died).
PROBE_SECONDS = 60.0


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass(frozen=True)
class Admission:
    """Whether a step of the cluster may run now, and if not, until when it waits."""

    allowed: bool
    until: datetime | None = None
    probe: bool = False


ALLOWED = Admission(True)


def circuit_admit(*, cluster_id: int, breaker: CircuitBreaker | None, now: datetime) -> Admission:
    """Decide for one step. ``breaker`` is the row as read with the operation (``None`` when
    the cluster never failed), so a closed breaker costs no query."""
    if breaker is None or breaker.state == CircuitState.CLOSED:
        return ALLOWED
    if breaker.retry_at is not None and breaker.retry_at > now:
        return Admission(False, until=breaker.retry_at)
    # Time for a probe (or the last probe never reported): one step wins it.
    probe_until = now + timedelta(seconds=PROBE_SECONDS)
    won = CircuitBreaker.objects.filter(
        pk=cluster_id, state=breaker.state, retry_at=breaker.retry_at
    ).update(state=CircuitState.HALF_OPEN, retry_at=probe_until, changed_at=now)
    if won:
        log.info("circuit probe", extra={"cluster_id": cluster_id})
        return Admission(True, probe=True)
    return Admission(False, until=now + timedelta(seconds=random.uniform(1.0, 3.0)))


def circuit_record_failure(*, cluster_id: int, error: str, now: datetime) -> None:
    """One more connection failure in a row; opens the breaker at the threshold."""
    threshold = int(_setting("PROXYHUB_CIRCUIT_FAILURES", FAILURES))
    first = _setting("PROXYHUB_CIRCUIT_OPEN_SECONDS", OPEN_SECONDS)
    cap = _setting("PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS", MAX_OPEN_SECONDS)
    with transaction.atomic():
        breaker = _locked(cluster_id)
        breaker.failures += 1
        breaker.last_error = error[:1000]
        reopen = breaker.state == CircuitState.HALF_OPEN
        if reopen or (breaker.state == CircuitState.CLOSED and breaker.failures >= threshold):
            seconds = min(cap, breaker.open_seconds * 2) if reopen else first
            breaker.state = CircuitState.OPEN
            breaker.open_seconds = seconds
            breaker.opened_at = breaker.opened_at if reopen else now
            breaker.retry_at = now + timedelta(seconds=seconds)
            breaker.changed_at = now
            breaker.times_opened += 0 if reopen else 1
            log.warning(
                "circuit open",
                extra={"cluster_id": cluster_id, "seconds": seconds, "error": error},
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
