"""Beat's node health schedules, created or updated by name (DESIGN.md §6), editable in the admin.

Like ``provisioning.schedules``: idempotent, run by a data migration, and each run expires
after one interval so a backlog (a stopped worker, a full queue) never piles up rounds.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

CHECK_TASK = "proxyhub.health.check_round"
PRUNE_TASK = "proxyhub.health.prune"

# name -> (task, setting holding the interval, default seconds)
SCHEDULES: dict[str, tuple[str, str, int]] = {
    "proxyhub: node health checks": (CHECK_TASK, "PROXYHUB_HEALTH_INTERVAL_SECONDS", 60),
    "proxyhub: node health pruning": (
        PRUNE_TASK,
        "PROXYHUB_HEALTH_PRUNE_INTERVAL_SECONDS",
        3600,
    ),
}
QUEUE = "health"


def ensure_schedules(periodic_task: Any = None, interval_schedule: Any = None) -> list[str]:
    """Create or update the health schedules by name; returns their names.

    The model classes are passed in by the data migration (historical models); at run time
    they default to django_celery_beat's own.
    """
    if periodic_task is None or interval_schedule is None:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        periodic_task, interval_schedule = PeriodicTask, IntervalSchedule
    for name, (task, setting, default) in SCHEDULES.items():
        seconds = int(getattr(settings, setting, default))
        every, _ = interval_schedule.objects.get_or_create(every=seconds, period="seconds")
        periodic_task.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": every,
                "queue": QUEUE,
                "expire_seconds": seconds,
                "enabled": True,
            },
        )
    return list(SCHEDULES)
