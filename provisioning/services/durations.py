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

from django.db import DatabaseError, IntegrityError, transaction

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


def durations_learn(*, cluster_id: int, timing: Timing, ceiling: float | None = None) -> None:
    """Move the estimate of ``timing``'s work by what that wait saw (``waits.learn``), under the
    row's lock so concurrent steps on one node each count."""
    try:
        with transaction.atomic():
            row = (
                WorkDuration.objects.select_for_update()
                .filter(cluster_id=cluster_id, kind=timing.kind, scope=timing.scope)
                .first()
            )
            current = Estimate(row.seconds, row.samples) if row is not None else None
            estimate = learn(current, timing, ceiling=ceiling)
            if row is not None:
                row.seconds, row.samples = estimate.seconds, estimate.samples
                row.save(update_fields=["seconds", "samples", "updated_at"])
                return
            try:
                with transaction.atomic():
                    WorkDuration.objects.create(
                        cluster_id=cluster_id,
                        kind=timing.kind,
                        scope=timing.scope,
                        seconds=estimate.seconds,
                        samples=estimate.samples,
                    )
            except IntegrityError:
                # Another step created the row first: its first sample stands; this one is
                # dropped rather than waited for (an estimate, not a count).
                return
    except DatabaseError:
        log.warning(
            "duration estimate not kept", extra={"kind": timing.kind, "scope": timing.scope}
        )


def timing_of(result: StepResult) -> Timing | None:
    """The finished wait a step's result reports, if any."""
    found: Mapping[str, Any] | None = result.details.get(TIMING)
    return Timing.from_dict(found) if found else None
