"""Celery tasks: thin doors onto services. They take ids, never model instances (STYLE.md)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError

from provisioning.services import driver, sweeper
from provisioning.services import gc as gc_service
from provisioning.services import reconcile as reconcile_service
from provisioning.services.leases import LeaseHeld

STEP_TASK = "proxyhub.provisioning.step"

log = logging.getLogger("proxyhub.operations")


@shared_task(
    name=STEP_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=120,
    time_limit=180,
)
def run_step(operation_id: str, token: str) -> None:
    """One step of one operation (services.driver); duplicates exit as no-ops.

    A database that goes away mid-step (a restart, a failover) is not this step's failure:
    the claim it took expires and the sweeper sends the step again, so it is logged as a
    warning rather than raised as a task error.
    """
    try:
        driver.operation_run_step(operation_id=operation_id, token=token)
    except (OperationalError, InterfaceError) as err:
        log.warning(
            "database unavailable during a step; the sweeper sends it again",
            extra={"operation": operation_id, "error": type(err).__name__},
        )


def send_step(operation_id: str, token: str, countdown: float = 0.0) -> None:
    """Send the message for an operation's next step (call it after commit)."""
    run_step.apply_async(
        kwargs={"operation_id": operation_id, "token": token},
        countdown=max(0.0, countdown),
    )


@shared_task(
    name="proxyhub.provisioning.sweep",
    ignore_result=True,
    soft_time_limit=60,
    time_limit=90,
    expires=60,
)
def sweep() -> int:
    """Re-send step messages that were lost (services.sweeper)."""
    return sweeper.operations_sweep()


@shared_task(
    name="proxyhub.provisioning.reconcile",
    ignore_result=True,
    soft_time_limit=240,
    time_limit=300,
)
def reconcile() -> dict[str, int]:
    """One reconcile round over every cluster; a round already running elsewhere wins."""
    try:
        return dict(reconcile_service.reconcile_round())
    except LeaseHeld:
        return {"lease_held": 1}


@shared_task(
    name="proxyhub.provisioning.gc",
    ignore_result=True,
    soft_time_limit=240,
    time_limit=300,
)
def gc() -> int:
    """Collect orphaned VMs and seed ISOs of this installation (services.gc)."""
    try:
        return len(gc_service.gc_run())
    except LeaseHeld:
        return 0
