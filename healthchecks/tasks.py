"""Celery tasks for node health: thin doors onto ``healthchecks.services`` (STYLE.md).

Both run on the ``health`` queue, so bulk provisioning never starves the checks: the setting
``CELERY_TASK_ROUTES`` routes ``proxyhub.health.*`` there (Celery deprecates a ``queue`` task
attribute in favour of routes), and the Beat schedules name the queue too. A round is bounded
by the per-cluster deadline, and its Beat runs expire after one interval, so runs never pile
up behind a stopped worker.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from . import services
from .schedules import CHECK_TASK, PRUNE_TASK

_INTERVAL = int(getattr(settings, "PROXYHUB_HEALTH_INTERVAL_SECONDS", 60))


@shared_task(
    name=CHECK_TASK,
    ignore_result=True,
    expires=_INTERVAL,
    soft_time_limit=120,
    time_limit=150,
)
def check_round() -> dict[str, int]:
    """One health round over every cluster; returns how many nodes were ready and checked."""
    rows = services.check_round()
    return {"checked": len(rows), "ready": sum(row.ready for row in rows)}


@shared_task(name=PRUNE_TASK, ignore_result=True, soft_time_limit=240, time_limit=300)
def prune() -> int:
    """Delete node health history older than PROXYHUB_HEALTH_RETENTION_DAYS."""
    return services.prune_history()
