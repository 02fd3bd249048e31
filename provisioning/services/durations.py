"""The running estimates every wait on Proxmox is planned from (``proxmox.waits``), per cluster.

The provider asks ``ClusterDurations`` when a task should end; the driver hands each finished
wait's timing to ``durations_learn`` once the step is in the journal. Both are advisory: a
missing or lost estimate only makes the next wait start short and grow, so a failure to keep one
is logged and never fails the step that taught it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import F, FloatField, Min
from django.db.models.expressions import RawSQL
from django.utils import timezone

from provisioning.models import WorkDuration
from provisioning.proxmox.steps import TIMING, StepResult
from provisioning.proxmox.waits import ALPHA, OUTLIER_FACTOR, Timing, learn

log = logging.getLogger("proxyhub.operations")


class ClusterDurations:
    """``proxmox.waits.Durations`` over one cluster's rows: one indexed read per planned wait
    (a process-local copy would plan a create on another worker's stale view)."""

    def __init__(self, cluster_id: int) -> None:
        self.cluster_id = cluster_id

    def expected(self, kind: str, scope: str) -> float | None:
        return durations_expected(cluster_id=self.cluster_id, kind=kind, scope=scope)

    def elsewhere(self, kind: str, scope: str) -> float | None:
        return durations_elsewhere(cluster_id=self.cluster_id, kind=kind, scope=scope)


def durations_expected(*, cluster_id: int, kind: str, scope: str) -> float | None:
    """The estimate of ``kind`` on ``scope`` in the cluster, or None when none was learned."""
    try:
        return (
            WorkDuration.objects.filter(cluster_id=cluster_id, kind=kind, scope=scope)
            .values_list("seconds", flat=True)
            .first()
        )
    except DatabaseError:
        log.warning("duration estimate not read", extra={"kind": kind, "scope": scope})
        return None


def durations_elsewhere(*, cluster_id: int, kind: str, scope: str) -> float | None:
    """The shortest estimate of ``kind`` on the cluster's other scopes (``waits.Durations``):
    one more read, made only for a wait whose own scope has none yet."""
    try:
        found: float | None = (
            WorkDuration.objects.filter(cluster_id=cluster_id, kind=kind)
            .exclude(scope=scope)
            .aggregate(seconds=Min("seconds"))["seconds"]
        )
    except DatabaseError:
        log.warning("duration estimate not read", extra={"kind": kind, "scope": scope})
        return None
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
