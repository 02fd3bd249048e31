"""Beat's schedules, created or updated by name (DESIGN.md §6), editable in the admin.

``ensure_schedules`` is idempotent: it is run by a data migration and may be run again (for
example after changing an interval setting) without creating duplicates. Each run expires
after one interval, so a backlog never piles up runs of the same job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

# name -> (task, setting holding the interval, default seconds, queue)
SCHEDULES: dict[str, tuple[str, str, int, str]] = {
    "proxyhub: reconcile": (
        "proxyhub.provisioning.reconcile",
        "PROXYHUB_RECONCILE_INTERVAL_SECONDS",
        60,
        "control",
    ),
    "proxyhub: garbage collection": (
        "proxyhub.provisioning.gc",
        "PROXYHUB_GC_INTERVAL_SECONDS",
        300,
        "control",
    ),
    "proxyhub: journal sweeper": (
        "proxyhub.provisioning.sweep",
        "PROXYHUB_SWEEPER_INTERVAL_SECONDS",
        10,
        "control",
    ),
    # Journal retention (services.retention): hourly is plenty for a limit counted in days.
    "proxyhub: journal pruning": (
        "proxyhub.provisioning.prune_journal",
        "PROXYHUB_JOURNAL_PRUNE_INTERVAL_SECONDS",
        3600,
        "control",
    ),
    # The inventory snapshot (services.inventory): one listing per cluster, so cheap enough to
    # keep a page five minutes fresh.
    "proxyhub: inventory refresh": (
        "proxyhub.provisioning.inventory_refresh",
        "PROXYHUB_INVENTORY_INTERVAL_SECONDS",
        300,
        "control",
    ),
}


Schedule = tuple[str, str, int, str]


def ensure_schedules(
    periodic_task: Any = None,
    interval_schedule: Any = None,
    *,
    schedules: Mapping[str, Schedule] = SCHEDULES,
) -> list[str]:
    """Create or update every schedule of ``schedules`` by name; returns their names.

    The model classes are passed in by data migrations (historical models); at run time they
    default to django_celery_beat's own. Other apps (healthchecks) pass their own table.
    """
    if periodic_task is None or interval_schedule is None:
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        periodic_task, interval_schedule = PeriodicTask, IntervalSchedule
    for name, (task, setting, default, queue) in schedules.items():
        seconds = int(getattr(settings, setting, default))
        every, _ = interval_schedule.objects.get_or_create(every=seconds, period="seconds")
        periodic_task.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": every,
                "queue": queue,
                "expire_seconds": seconds,
                "enabled": True,
            },
        )
    return list(schedules)


# Beat's task names of proxyhub's own jobs all start so (every task has an explicit stable
# name, STYLE.md), and the schedules ensure_schedules writes are all named so; healthchecks'
# schedules follow the same rule without provisioning having to import it.
OWN_TASK_PREFIX = "proxyhub."
OWN_NAME_PREFIX = "proxyhub: "


def is_own_schedule(*, name: str, task: str) -> bool:
    """Whether a Beat schedule is one of proxyhub's own (or runs one of its tasks): only a
    superuser may change what it runs, disable it or delete it (issue 11)."""
    return name.startswith(OWN_NAME_PREFIX) or task.startswith(OWN_TASK_PREFIX)
