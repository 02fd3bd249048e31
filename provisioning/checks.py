"""System checks of the control loop's settings: ``manage.py check``, ``migrate`` and the
worker's start refuse a configuration under which two rounds could run at once, or a dead
round could hold its job for longer than a round."""

from __future__ import annotations

from typing import Any

from django.core import checks

from provisioning.services.rounds import timing_problems


@checks.register("proxyhub")
def round_timing_check(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    return [
        checks.Error(
            problem,
            hint="Set PROXYHUB_JOB_LEASE_SECONDS between 3 s and PROXYHUB_ROUND_DEADLINE_SECONDS "
            "(30 s by default).",
            id="proxyhub.E002",
        )
        for problem in timing_problems()
    ]
