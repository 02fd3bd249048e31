"""Celery tasks: thin doors onto services. They take ids, never model instances (STYLE.md).

Nothing below imports this module: services send steps by the registered names kept in
``services.dispatch``, which these tasks declare. Step messages go to the ``provisioning``
queue; sweep, reconcile and GC to the small ``control`` queue (settings route them), so a
backlog of steps cannot starve the jobs that keep the loop alive.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.db import InterfaceError, OperationalError

from provisioning.services import driver, retention, sweeper
from provisioning.services import gc as gc_service
from provisioning.services import inventory as inventory_service
from provisioning.services import reconcile as reconcile_service
from provisioning.services.dispatch import (
    GC_TASK,
    INVENTORY_TASK,
    PRUNE_JOURNAL_TASK,
    RECONCILE_TASK,
    STEP_TASK,
    SWEEP_TASK,
    TRACE_HEADER,
)
from provisioning.services.leases import LeaseHeld
from provisioning.services.rounds import round_timing

log = logging.getLogger("proxyhub.operations")

_ROUNDS = round_timing()


@shared_task(
    bind=True,
    name=STEP_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=120,
    time_limit=180,
)
def run_step(self: Task, operation_id: str, token: str) -> None:
    """One step of one operation (services.driver); duplicates exit as no-ops.

    A database that goes away mid-step (a restart, a failover) is not this step's failure:
    the claim it took expires and the sweeper sends the step again, so it is logged as a
    warning rather than raised as a task error.
    """
    # The operation's trace context, as dispatch.send_step put it in the message's headers.
    # (Celery puts a custom header on the request itself; older clients nest them in headers.)
    headers = self.request.get("headers") or {}
    trace_parent = str(self.request.get(TRACE_HEADER) or headers.get(TRACE_HEADER) or "")
    try:
        driver.operation_run_step(operation_id=operation_id, token=token, trace_parent=trace_parent)
    except (OperationalError, InterfaceError) as err:
        log.warning(
            "database unavailable during a step; the sweeper sends it again",
            extra={"operation": operation_id, "error": type(err).__name__},
        )


@shared_task(
    name=SWEEP_TASK,
    ignore_result=True,
    soft_time_limit=60,
    time_limit=90,
    expires=60,
)
def sweep() -> int:
    """Send again step messages that were lost (services.sweeper)."""
    return sweeper.operations_sweep()


@shared_task(
    name=RECONCILE_TASK,
    ignore_result=True,
    soft_time_limit=_ROUNDS.soft_time_limit,
    time_limit=_ROUNDS.time_limit,
)
def reconcile() -> dict[str, int]:
    """One reconcile round over every cluster; a round already running elsewhere wins."""
    try:
        return dict(reconcile_service.reconcile_round())
    except LeaseHeld:
        return {"lease_held": 1}


@shared_task(
    name=GC_TASK,
    ignore_result=True,
    soft_time_limit=_ROUNDS.soft_time_limit,
    time_limit=_ROUNDS.time_limit,
)
def gc() -> int:
    """Collect orphaned VMs and seed ISOs of this installation (services.gc)."""
    try:
        return len(gc_service.gc_run())
    except (LeaseHeld, gc_service.GcRefused):
        return 0


@shared_task(
    name=PRUNE_JOURNAL_TASK,
    ignore_result=True,
    soft_time_limit=300,
    time_limit=360,
)
def prune_journal() -> int:
    """Delete finished operations past PROXYHUB_JOURNAL_RETENTION_DAYS (services.retention)."""
    return retention.journal_prune()


@shared_task(
    name=INVENTORY_TASK,
    ignore_result=True,
    soft_time_limit=_ROUNDS.soft_time_limit,
    time_limit=_ROUNDS.time_limit,
)
def inventory_refresh() -> int:
    """Refresh every cluster's inventory snapshot (services.inventory); returns how many
    clusters failed (their previous snapshot stays, with the error recorded)."""
    return sum(bool(o.error) for o in inventory_service.inventory_refresh_all())
