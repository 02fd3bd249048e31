"""Beat's node health schedules, created or updated by name (DESIGN.md §6), editable in the admin.

Like ``provisioning.schedules``: idempotent, run by a data migration, and each run expires
after one interval so a backlog (a stopped worker, a full queue) never piles up rounds.
"""

from __future__ import annotations

from typing import Any

from provisioning.schedules import Schedule
from provisioning.schedules import ensure_schedules as _ensure

CHECK_TASK = "proxyhub.health.check_round"
PRUNE_TASK = "proxyhub.health.prune"
QUEUE = "health"

# name -> (task, setting holding the interval, default seconds, queue)
SCHEDULES: dict[str, Schedule] = {
    "proxyhub: node health checks": (
        CHECK_TASK,
        "PROXYHUB_HEALTH_INTERVAL_SECONDS",
        60,
        QUEUE,
    ),
    "proxyhub: node health pruning": (
        PRUNE_TASK,
        "PROXYHUB_HEALTH_PRUNE_INTERVAL_SECONDS",
        3600,
        QUEUE,
    ),
}


def ensure_schedules(periodic_task: Any = None, interval_schedule: Any = None) -> list[str]:
    """Create or update the health schedules by name (``provisioning.schedules`` does the work)."""
    return _ensure(periodic_task, interval_schedule, schedules=SCHEDULES)
