"""The running estimates every wait on Proxmox is planned from (``proxmox.waits``), per cluster.

The provider asks ``ClusterDurations`` when a task should end; the driver hands each finished
wait's timing to ``durations_learn`` once the step is in the journal. Both are advisory: a
missing or lost estimate only makes the next wait start short and grow, so a failure to keep one
is logged and never fails the step that taught it.

A process reads a cluster's estimates in one statement and keeps them ``ESTIMATES_TTL`` seconds
(``_Estimates``); what it learns itself goes into its copy at once, the way ``durations_learn``
moves the row. Reading the row for every planned wait was one statement in most step
deliveries, 3.9 % of the one worker's time in issue 12's makespan (py-spy); a cluster has a few
rows per node and image, so reading them all once a second costs less than one of those reads.
A step took 10.6 ms instead of 11.0 (median of four pumps of 120 creates on PostgreSQL each).
Another worker's samples reach this process's plans within the TTL: an estimate moves a few
percent a sample, so a plan a second behind is the same plan.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import F, FloatField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from provisioning.models import WorkDuration
from provisioning.proxmox.steps import TIMING, StepResult
from provisioning.proxmox.waits import ALPHA, OUTLIER_FACTOR, Estimate, Timing, learn

log = logging.getLogger("proxyhub.operations")

# How long a process plans from the estimates it read before reading them again (module
# docstring).
ESTIMATES_TTL = 1.0

Key = tuple[str, str]


class _Estimates:
    """This process's copy of each cluster's estimates, by (kind, scope), and when it was read.
    Guarded by a lock: a worker's HTTP and heartbeat threads never plan, but nothing here should
    depend on that."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # what the copies' age is measured on (tests give their own)
        self._lock = threading.Lock()
        self._clusters: dict[int, tuple[float, dict[Key, Estimate]]] = {}

    def of(self, cluster_id: int) -> dict[Key, Estimate] | None:
        """The cluster's estimates, read again when the copy is older than ``ESTIMATES_TTL``;
        None when they cannot be read (the caller plans as if nothing were known)."""
        now = self.clock()
        with self._lock:
            kept = self._clusters.get(cluster_id)
        if kept is not None and now - kept[0] < ESTIMATES_TTL:
            return kept[1]
        try:
            rows = WorkDuration.objects.filter(cluster_id=cluster_id).values_list(
                "kind", "scope", "seconds", "samples"
            )
            read = {
                (kind, scope): Estimate(seconds, samples) for kind, scope, seconds, samples in rows
            }
        except DatabaseError:
            return None
        with self._lock:
            self._clusters[cluster_id] = (now, read)
        return read

    def learnt(self, cluster_id: int, timing: Timing, ceiling: float | None) -> None:
        """Move this process's copy as ``durations_learn`` moved the row (``waits.learn``, the
        same arithmetic), so the next plan here uses what this wait taught."""
        key = (timing.kind, timing.scope)
        with self._lock:
            kept = self._clusters.get(cluster_id)
            if kept is not None:
                # A new dict, not the read one changed: a caller may be iterating that one.
                moved = dict(kept[1])
                moved[key] = learn(moved.get(key), timing, ceiling=ceiling)
                self._clusters[cluster_id] = (kept[0], moved)

    def forget(self) -> None:
        with self._lock:
            self._clusters.clear()


_estimates = _Estimates()


def forget_estimates() -> None:
    """Drop this process's copies: the next plan reads the rows (tests that write rows)."""
    _estimates.forget()


class ClusterDurations:
    """``proxmox.waits.Durations`` over one cluster's rows, as this process last read them
    (module docstring)."""

    def __init__(self, cluster_id: int) -> None:
        self.cluster_id = cluster_id

    def expected(self, kind: str, scope: str) -> float | None:
        return durations_expected(cluster_id=self.cluster_id, kind=kind, scope=scope)

    def elsewhere(self, kind: str, scope: str) -> float | None:
        return durations_elsewhere(cluster_id=self.cluster_id, kind=kind, scope=scope)


def durations_expected(*, cluster_id: int, kind: str, scope: str) -> float | None:
    """The estimate of ``kind`` on ``scope`` in the cluster, or None when none was learned."""
    found = _read(cluster_id, kind, scope).get((kind, scope))
    return found.seconds if found is not None else None


def durations_elsewhere(*, cluster_id: int, kind: str, scope: str) -> float | None:
    """The shortest estimate of ``kind`` on the cluster's other scopes (``waits.Durations``),
    the prior of a wait whose own scope has none yet."""
    others = [
        estimate.seconds
        for (k, s), estimate in _read(cluster_id, kind, scope).items()
        if k == kind and s != scope
    ]
    return min(others, default=None)


def _read(cluster_id: int, kind: str, scope: str) -> Mapping[Key, Estimate]:
    found = _estimates.of(cluster_id)
    if found is None:
        log.warning("duration estimate not read", extra={"kind": kind, "scope": scope})
        return {}
    return found


def durations_learn(*, cluster_id: int, timing: Timing, ceiling: float | None = None) -> None:
    """Move the estimate of ``timing``'s work by what that wait saw (``waits.learn``).

    One statement in autocommit, no lock, on the create's path (issue 12: it was a read then a
    conditional write): the row is moved by ``waits.learn``'s arithmetic written as SQL
    (``_learned``), so a concurrent step's sample is applied after this one instead of
    dropping it. A row not there yet is made from this sample (a concurrent first sample
    wins and this one is dropped: an estimate needs most samples, not every one)."""
    key = {"cluster_id": cluster_id, "kind": timing.kind, "scope": timing.scope}
    try:
        moved = WorkDuration.objects.filter(**key).update(
            seconds=_learned(timing.sample(), ceiling, bound_only=timing.bound_only),
            samples=F("samples") + 1,
            updated_at=timezone.now(),
        )
        if not moved:
            first = learn(None, timing, ceiling=ceiling)
            WorkDuration.objects.bulk_create(
                [WorkDuration(**key, seconds=first.seconds, samples=first.samples)],
                ignore_conflicts=True,
            )
    except DatabaseError:
        log.warning(
            "duration estimate not kept", extra={"kind": timing.kind, "scope": timing.scope}
        )
        return
    _estimates.learnt(cluster_id, timing, ceiling)


def _learned(sample: float, ceiling: float | None, *, bound_only: bool = False) -> RawSQL:
    """``waits.learn(Estimate(seconds, samples), ...)``'s seconds over the row's own columns, in
    the same order of operations: the sample no more than the estimate when it is only a bound
    (``bound_only``), clamped to [seconds / OUTLIER_FACTOR, seconds * OUTLIER_FACTOR] when the
    estimate is above 0, weighted by max(ALPHA, 1 / (samples + 1)), capped by ``ceiling``, never
    below 0.

    Written as one SQL expression rather than a tree of Django expressions: Django copies and
    resolves every node of a tree on each ``update()``, and this one's twenty nodes were 8 % of
    a step's time on PostgreSQL (py-spy over a pump of 30 creates; issue 12, a delivery's cost
    is the makespan's bound). The functions are the ones Django's ``Greatest``/``Least`` and
    ``Cast`` compile to on each database."""
    vendor = connection.vendor
    most, least = ("MAX", "MIN") if vendor == "sqlite" else ("GREATEST", "LEAST")
    real = "REAL" if vendor == "sqlite" else "double precision"
    taken = f"CAST(%s AS {real})"
    if bound_only:
        taken = f"{least}({taken}, seconds)"
    clamped = (
        f"CASE WHEN seconds > 0 THEN {least}({most}({taken}, seconds / %s), seconds * %s) "
        f"ELSE {taken} END"
    )
    weight = f"{most}(CAST(%s AS {real}), 1.0 / CAST(samples + 1 AS {real}))"
    seconds = f"(seconds + {weight} * (({clamped}) - seconds))"
    # In the order of their placeholders: the weight's, then the clamp's (the sample twice).
    params = [ALPHA, sample, OUTLIER_FACTOR, OUTLIER_FACTOR, sample]
    if ceiling is not None:
        seconds = f"{least}({seconds}, CAST(%s AS {real}))"
        params.append(float(ceiling))
    # The text is this function's constants only; every value is a bound parameter.
    return RawSQL(f"{most}({seconds}, 0.0)", params, output_field=FloatField())  # noqa: S611


def timing_of(result: StepResult) -> Timing | None:
    """The finished wait a step's result reports, if any."""
    found: Mapping[str, Any] | None = result.details.get(TIMING)
    return Timing.from_dict(found) if found else None
