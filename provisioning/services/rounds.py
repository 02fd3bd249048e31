"""How long a reconcile or GC round may run, and how that matches its task and its job lease.

A round stops starting new work at its deadline (``PROXYHUB_ROUND_DEADLINE_SECONDS``), whether
Beat or a command started it; its Celery task's soft and hard time limits come after the
deadline. The job lease that keeps the round single is short (``PROXYHUB_JOB_LEASE_SECONDS``)
and renewed while the round runs (``leases.job_lease``): it is held exactly as long as the
round, and a round killed with its worker or by its hard time limit frees it within one lease
length. ``timing_problems`` is the rule, checked at start-up by the system check
``proxyhub.E002``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

ROUND_DEADLINE_SECONDS = 240.0
JOB_LEASE_SECONDS = 30.0
# A lease shorter than this cannot be renewed every third of its length with room to spare.
MIN_LEASE_SECONDS = 3.0
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
    """Why these round settings could let two rounds run at once, or hold a dead one's job too
    long, or none."""
    timing = timing or round_timing()
    problems = []
    if timing.deadline <= 0:
        problems.append("PROXYHUB_ROUND_DEADLINE_SECONDS must be positive")
    if timing.lease < MIN_LEASE_SECONDS:
        problems.append(
            f"PROXYHUB_JOB_LEASE_SECONDS ({timing.lease:g}) must be at least "
            f"{MIN_LEASE_SECONDS:g} s: it is renewed every third of its length while a round "
            "runs, and a shorter one can lapse between two renewals and let a second round start"
        )
    if timing.lease > timing.deadline:
        problems.append(
            f"PROXYHUB_JOB_LEASE_SECONDS ({timing.lease:g}) must not exceed the round deadline "
            f"(PROXYHUB_ROUND_DEADLINE_SECONDS, {timing.deadline:g} s): a round killed with its "
            "worker would keep its job stopped for longer than a whole round"
        )
    return problems
