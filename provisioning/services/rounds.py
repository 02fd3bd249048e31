"""How long a reconcile or GC round may run, and how that matches its task and its job lease.

A round stops starting new work at its deadline (``PROXYHUB_ROUND_DEADLINE_SECONDS``), whether
Beat or a command started it. Its Celery task's soft and hard time limits come after the
deadline, and the job lease that keeps the round single outlasts the hard limit
(``PROXYHUB_JOB_LEASE_SECONDS``): a lease that expired while its round still ran would let a
second round start beside it. ``timing_problems`` is the rule, checked at start-up by the
system check ``proxyhub.E002``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

ROUND_DEADLINE_SECONDS = 240.0
JOB_LEASE_SECONDS = 360.0
# After the deadline, the soft limit leaves time to finish the proxy at hand; the hard limit
# leaves the soft limit's handler time to log.
SOFT_MARGIN_SECONDS = 30
HARD_MARGIN_SECONDS = 60


@dataclass(frozen=True)
class RoundTiming:
    deadline: float
    soft_time_limit: int
    time_limit: int
    lease: float


def round_timing() -> RoundTiming:
    deadline = float(getattr(settings, "PROXYHUB_ROUND_DEADLINE_SECONDS", ROUND_DEADLINE_SECONDS))
    return RoundTiming(
        deadline=deadline,
        soft_time_limit=int(deadline) + SOFT_MARGIN_SECONDS,
        time_limit=int(deadline) + HARD_MARGIN_SECONDS,
        lease=float(getattr(settings, "PROXYHUB_JOB_LEASE_SECONDS", JOB_LEASE_SECONDS)),
    )


def timing_problems(timing: RoundTiming | None = None) -> list[str]:
    """Why these round settings could let two rounds run at once, or none."""
    timing = timing or round_timing()
    problems = []
    if timing.deadline <= 0:
        problems.append("PROXYHUB_ROUND_DEADLINE_SECONDS must be positive")
    if timing.lease <= timing.time_limit:
        problems.append(
            f"PROXYHUB_JOB_LEASE_SECONDS ({timing.lease:g}) must exceed the round tasks' hard "
            f"time limit ({timing.time_limit} s = PROXYHUB_ROUND_DEADLINE_SECONDS + "
            f"{HARD_MARGIN_SECONDS}), or a second round can start beside a slow first one"
        )
    return problems
