"""The per-cluster circuit breaker (``models.CircuitBreaker``): cluster isolation.

Without it, every step of an unreachable cluster holds a worker slot for a connect or request
timeout (10 to 30 s) per attempt, and one dead cluster starves every other cluster's creates.
With it, the breaker opens after ``PROXYHUB_CIRCUIT_FAILURES`` connection failures in a row, or
at once after one that held the worker for ``COSTLY_FAILURE_SECONDS`` (2 s) or more (a request that
timed out: a host that accepts connections and never answers costs a whole request timeout
per try). While it is open that cluster's steps are deferred to the breaker's ``retry_at``
without running: a delivery costs milliseconds and holds nothing.

At ``retry_at`` one delivery (a conditional UPDATE elects it) probes the cluster with one cheap
request bounded by ``PROXYHUB_CIRCUIT_PROBE_SECONDS``, not with a real step that could hold the
worker for a full request timeout; the delivery itself waits only
``PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS`` for the answer (``services.circuit_probe``). If Proxmox
answers, the breaker closes and the step runs; if not, the breaker opens again for twice as
long, up to ``PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS``.
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.db import IntegrityError, OperationalError, connections, transaction

from provisioning.models import CircuitBreaker, CircuitState, Cluster
from provisioning.proxmox.errors import classify

from . import policy
from .circuit_probe import PROBE_FAILURES, ProbeResult, ProbeRun
from .clock import db_now
from .providers import provider_for

log = logging.getLogger("proxyhub.circuit")

FAILURES = 5
OPEN_SECONDS = 15.0
MAX_OPEN_SECONDS = 120.0
# The probe's own bound: one request, answered in milliseconds by a live pveproxy.
PROBE_SECONDS = 3.0
# How long the probing delivery waits for that answer before its step is deferred and the
# probe's own thread records the verdict (services.circuit_probe).
PROBE_WAIT_SECONDS = 0.5
# A failure that held the worker this long opens the breaker at once: a refusal or a reset comes
# back in milliseconds, so a failure this slow was a timeout, which costs a worker every time.
COSTLY_FAILURE_SECONDS = 2.0
# A cluster that answered within this many seconds runs its steps side by side; the moment of
# its last answer is written at most every WARM_REFRESH_SECONDS.
WARM_SECONDS = 30.0
WARM_REFRESH_SECONDS = 10.0
# A verdict written from the probe's thread that meets a busy database is tried again this many
# times, pausing 0.05 s, 0.1 s, 0.2 s ... (about 1.5 s in all) before it is given up and logged.
VERDICT_WRITE_ATTEMPTS = 6
VERDICT_WRITE_PAUSE_SECONDS = 0.05
# Beyond the probe's bound and its verdict's write retries: the thread's scheduling and the writes
# themselves. Past that, the probe's worker is taken for dead (``_probe_lost_after``).
PROBE_LOST_GRACE_SECONDS = 1.0


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass(frozen=True)
class Admission:
    """Whether a step of the cluster may run now, and if not, until when it waits (jitter
    included) and what its journal says meanwhile (``note``; empty: nothing to say)."""

    allowed: bool
    until: datetime | None = None
    # A probe answered in this call and closed the breaker (the caller's copy is stale).
    probe: bool = False
    # Decided by the probe of a cold cluster, not by an open breaker (reconcile counts it apart).
    cold: bool = False
    note: str = ""


ALLOWED = Admission(True)


def circuit_admit(
    *,
    cluster: Cluster,
    breaker: CircuitBreaker | None,
    now: datetime,
    others_running: Callable[[], bool] = lambda: False,
) -> Admission:
    """Decide for one step (or reconcile's listing) of ``cluster``. ``breaker`` is the row as
    read with the operation (``None`` when the cluster never failed), so a closed breaker of a
    warm cluster costs no query.

    A cluster that has not answered lately (``circuit_cold``) may have gone silent, and a
    silent host holds a worker for a whole request timeout per request: it runs one step at a
    time (``others_running`` says whether another of its steps runs now) and that step goes
    only after a probe answered (``_probe``)."""
    if breaker is None or breaker.state == CircuitState.CLOSED:
        if not circuit_cold(cluster=cluster, breaker=breaker, now=now):
            return ALLOWED
        if others_running():
            return Admission(False, until=now + timedelta(seconds=random.uniform(0.5, 1.0)))
        return _probe(cluster, cold=True)
    unreachable = f"deferred: cluster {cluster.name} is unreachable; {breaker.last_error}"
    if breaker.retry_at is not None and breaker.retry_at > now:
        if breaker.state == CircuitState.HALF_OPEN:
            # Another delivery is probing: its verdict comes within the probe's bound, not at
            # the time after which a lost probe is given up.
            until = min(breaker.retry_at, now + _probe_wait())
            return Admission(False, until=_jittered(until), note=unreachable)
        return Admission(False, until=_jittered(breaker.retry_at), note=unreachable)
    # Time for a probe (or the last probe never reported): one delivery wins it.
    won = CircuitBreaker.objects.filter(
        pk=cluster.pk, state=breaker.state, retry_at=breaker.retry_at
    ).update(
        state=CircuitState.HALF_OPEN,
        retry_at=now + _probe_lost_after(),
        changed_at=now,
    )
    if not won:
        return Admission(False, until=_jittered(now + _probe_wait()), note=unreachable)
    return _probe(cluster)


def _jittered(until: datetime) -> datetime:
    """Up to a second later, so the deferred steps of a cluster do not all come back at once."""
    return until + timedelta(seconds=random.uniform(0.0, 1.0))


def _probe_lost_after() -> timedelta:
    """How long a half-open breaker waits for its probe's verdict before another delivery may
    probe: as long as a probe can take to report (its bound, the verdict's write retries and a
    grace), no longer. A worker killed mid-probe leaves nobody to write the verdict, and every
    step of the cluster waits meanwhile; a minute here once held a delete that long after the
    cluster answered again. A verdict that comes later all the same is still a true
    observation: the last one written wins."""
    retries = sum(VERDICT_WRITE_PAUSE_SECONDS * 2**n for n in range(VERDICT_WRITE_ATTEMPTS - 1))
    bound = _setting("PROXYHUB_CIRCUIT_PROBE_SECONDS", PROBE_SECONDS)
    return timedelta(seconds=bound + retries + PROBE_LOST_GRACE_SECONDS)


def _probe_wait() -> timedelta:
    """How long a step waits for another delivery's probe: its bound and a little jitter."""
    seconds = _setting("PROXYHUB_CIRCUIT_PROBE_SECONDS", PROBE_SECONDS)
    return timedelta(seconds=seconds + random.uniform(0.2, 1.0))


def _probe(cluster: Cluster, *, cold: bool = False) -> Admission:
    """One cheap, short request: does the cluster answer at all? The step runs in this delivery
    when the answer comes within the wait; otherwise the probe's thread records the verdict and
    the step comes back once the bound has passed.

    For a ``cold`` cluster the probe waits ``PROXYHUB_CIRCUIT_PROBE_SECONDS`` at most instead of
    a step's first request waiting out the whole request timeout (30 s by default); no answer
    in the whole bound opens the breaker at once, and a refusal counts as one failure in a row,
    as a step's would."""
    bound = _setting("PROXYHUB_CIRCUIT_PROBE_SECONDS", PROBE_SECONDS)
    # A wait as long as the bound waits for the verdict whatever it is (a second's grace for
    # the thread to hand it back).
    wait = min(bound + 1.0, _setting("PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS", PROBE_WAIT_SECONDS))
    run = ProbeRun(provider_for(cluster).api, bound, label=cluster.name).start()
    result = run.result(wait)
    if result is None:
        if cold:
            _mark_probing(cluster.pk)  # the cluster's other steps wait for this verdict
        result = run.hand_off(partial(_record_on_probe_thread, cluster.pk, cluster.name, bound))
        if result is None:
            log.info("circuit probe goes on without the worker", extra={"cluster": cluster.name})
            until = db_now() + timedelta(seconds=bound + random.uniform(0.2, 1.0))
            return Admission(
                False,
                until=_jittered(until),
                cold=cold,
                note=f"deferred: cluster {cluster.name} is being probed",
            )
    if result.error is not None and not isinstance(result.error, PROBE_FAILURES):
        raise result.error
    admission = _verdict(cluster.pk, cluster.name, bound, result)
    return replace(admission, cold=cold)


def _verdict(cluster_id: int, name: str, bound: float, result: ProbeResult) -> Admission:
    """Record what the probe found; whether the step may run."""
    error = _record(cluster_id, name, bound, result)
    if error is None:
        return Admission(True, probe=True)
    note = f"deferred: cluster {name} is unreachable; {error}"
    breaker = CircuitBreaker.objects.get(pk=cluster_id)
    if breaker.state == CircuitState.CLOSED:
        # Refused, the breaker not yet open: back off as a failed step would.
        return Admission(
            False, until=db_now() + timedelta(seconds=policy.backoff(breaker.failures)), note=note
        )
    return Admission(False, until=_jittered(breaker.retry_at or db_now()), note=note)


def _record(cluster_id: int, name: str, bound: float, result: ProbeResult) -> Exception | None:
    """Write the probe's verdict to the breaker; the classified error when it failed. Each
    write is one transaction (or an idempotent update), so a try that raised wrote nothing."""
    if result.error is None:
        log.info("circuit probe answered", extra={"cluster": name})
        breaker = CircuitBreaker.objects.filter(pk=cluster_id).first()
        circuit_record_success(cluster_id=cluster_id, breaker=breaker, now=db_now())
        return None
    error = classify("probe", result.error)
    log.info("circuit probe failed", extra={"cluster": name, "error": str(error)})
    circuit_record_failure(
        cluster_id=cluster_id,
        error=str(error),
        now=db_now(),
        seconds=result.seconds,
        # No answer within the probe's whole bound: the host is silent, and every step
        # sent to it would cost a request timeout, however short the bound was set.
        costly=result.seconds >= bound * 0.9,
    )
    return error


def _record_on_probe_thread(cluster_id: int, name: str, bound: float, result: ProbeResult) -> None:
    """The verdict of a probe the delivery did not wait for, written from the probe's thread
    (with a database connection of its own, closed after).

    Nobody else will write it (the breaker stays half open until ``_probe_lost_after``), so a
    write that meets a busy database is tried again, a few times: SQLite refuses a write at once
    while another connection reads the table in shared-cache mode, and a PostgreSQL connection
    can drop. Each try wrote nothing when it raised (``_record``)."""
    if result.error is not None and not isinstance(result.error, PROBE_FAILURES):
        # A bug, not the cluster: the breaker stays half open until _probe_lost_after has
        # passed and another delivery probes again.
        log.error("circuit probe broke", exc_info=result.error, extra={"cluster": name})
        return
    try:
        for attempt in range(VERDICT_WRITE_ATTEMPTS):
            try:
                _record(cluster_id, name, bound, result)
                return
            except OperationalError:
                if attempt + 1 == VERDICT_WRITE_ATTEMPTS:
                    raise
                connections.close_all()
                time.sleep(VERDICT_WRITE_PAUSE_SECONDS * 2**attempt)
    except Exception:
        log.exception("circuit probe verdict not recorded", extra={"cluster": name})
    finally:
        connections.close_all()


def _mark_probing(cluster_id: int) -> None:
    """A cold cluster's probe outlived the delivery's wait: half open, so the cluster's other
    steps wait for its verdict rather than send probes of their own."""
    now = db_now()
    _ensure_row(cluster_id)
    CircuitBreaker.objects.filter(pk=cluster_id, state=CircuitState.CLOSED).update(
        state=CircuitState.HALF_OPEN,
        retry_at=now + _probe_lost_after(),
        changed_at=now,
    )


def circuit_record_failure(
    *, cluster_id: int, error: str, now: datetime, seconds: float = 0.0, costly: bool = False
) -> None:
    """One more connection failure in a row (one that held the worker ``seconds``); opens the
    breaker at the threshold, or at once when the failure was costly (held the worker
    ``COSTLY_FAILURE_SECONDS`` or more, or ran out a probe's whole bound)."""
    threshold = int(_setting("PROXYHUB_CIRCUIT_FAILURES", FAILURES))
    first = _setting("PROXYHUB_CIRCUIT_OPEN_SECONDS", OPEN_SECONDS)
    cap = _setting("PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS", MAX_OPEN_SECONDS)
    with transaction.atomic():
        breaker = _locked(cluster_id)
        breaker.failures += 1
        breaker.last_error = error[:1000]
        reopen = breaker.state == CircuitState.HALF_OPEN
        costly = costly or seconds >= COSTLY_FAILURE_SECONDS
        if reopen or (
            breaker.state == CircuitState.CLOSED and (breaker.failures >= threshold or costly)
        ):
            # Doubled after each failed probe; a cold cluster's first probe (half open without
            # ever having been open) opens for the first interval.
            interval = min(cap, max(first, breaker.open_seconds * 2)) if reopen else first
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
    """Proxmox answered: the failures in a row end, an open or probing breaker closes, and the
    cluster is warm (written at most every ``WARM_REFRESH_SECONDS``, not on every step)."""
    fresh = (
        breaker is not None
        and breaker.last_success_at is not None
        and now - breaker.last_success_at < timedelta(seconds=WARM_REFRESH_SECONDS)
    )
    reopened = breaker is not None and breaker.state != CircuitState.CLOSED
    if fresh and not reopened and breaker is not None and breaker.failures == 0:
        return
    if breaker is None:
        _ensure_row(cluster_id)
    updates: dict[str, object] = {
        "state": CircuitState.CLOSED,
        "failures": 0,
        "retry_at": None,
        "open_seconds": 0.0,
        "last_success_at": now,
    }
    if reopened:
        updates["changed_at"] = now
    CircuitBreaker.objects.filter(pk=cluster_id).update(**updates)
    if reopened:
        log.info("circuit closed", extra={"cluster_id": cluster_id})


def circuit_cold(*, cluster: Cluster, breaker: CircuitBreaker | None, now: datetime) -> bool:
    """Whether the cluster has not answered lately (or ever): then its steps run one at a
    time, so a host that has just gone silent holds one worker for a request timeout, not all
    of them. Once it answers, it is warm and its steps run side by side again."""
    if breaker is None or breaker.last_success_at is None:
        return True
    return now - breaker.last_success_at > timedelta(seconds=WARM_SECONDS)


def _locked(cluster_id: int) -> CircuitBreaker:
    _ensure_row(cluster_id)
    return CircuitBreaker.objects.select_for_update().get(pk=cluster_id)


def _ensure_row(cluster_id: int) -> None:
    """The cluster's breaker row exists (a cluster that never failed has none)."""
    try:
        with transaction.atomic():
            CircuitBreaker.objects.get_or_create(pk=cluster_id)
    except IntegrityError:
        pass  # created concurrently
