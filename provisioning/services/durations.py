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

from django.db import DatabaseError
from django.db.models import Min
from django.utils import timezone

from provisioning.models import WorkDuration
from provisioning.proxmox.steps import TIMING, StepResult
from provisioning.proxmox.waits import Estimate, Timing, learn

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

    Two statements in autocommit, no lock: this runs in the step's delivery, on the create's
    path. A concurrent step that moved the row between the read and the write wins and this
    sample is dropped (the write is conditional on the sample count it read): an estimate needs
    most samples, not every one."""
    key = {"cluster_id": cluster_id, "kind": timing.kind, "scope": timing.scope}
    try:
        row = WorkDuration.objects.filter(**key).values_list("pk", "seconds", "samples").first()
        if row is None:
            first = learn(None, timing, ceiling=ceiling)
            WorkDuration.objects.bulk_create(
                [WorkDuration(**key, seconds=first.seconds, samples=first.samples)],
                ignore_conflicts=True,
            )
            return
        pk, seconds, samples = row
        estimate = learn(Estimate(seconds, samples), timing, ceiling=ceiling)
        WorkDuration.objects.filter(pk=pk, samples=samples).update(
            seconds=estimate.seconds, samples=estimate.samples, updated_at=timezone.now()
        )
    except DatabaseError:
        log.warning(
            "duration estimate not kept", extra={"kind": timing.kind, "scope": timing.scope}
        )


def timing_of(result: StepResult) -> Timing | None:
    """The finished wait a step's result reports, if any."""
    found: Mapping[str, Any] | None = result.details.get(TIMING)
    return Timing.from_dict(found) if found else None
