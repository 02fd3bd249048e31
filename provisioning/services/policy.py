"""How long and how often the control loop tries: retries, backoffs, ceilings and claims.

Every number here is a setting (``PROXYHUB_*``, listed with its default and reason in
``docs/operator-guide.md``, "Retries and ceilings"), read when it is needed so tests and a
restarted worker pick up a change.

* **Retry where the fault happened** (issue 16). A GET meeting a transient fault is sent again
  by the seam itself (``ReadRetry``). A step that still fails transiently is run again in the
  same delivery ``PROXYHUB_STEP_RETRIES_IN_PLACE`` times: every stage reads back what Proxmox
  holds before it sends anything (a recorded UPID is polled, a clone is looked for at its VMID,
  a task already running is adopted), so running it again never repeats a mutation blindly.
* **Backoff sized to the fault.** Only then does the step wait: ``base * 2**(n-1)``, jittered,
  capped at ``PROXYHUB_STEP_MAX_BACKOFF_SECONDS`` (20 s). A storm of one-request hiccups costs
  seconds, not the minutes an uncapped doubling reached; a cluster that keeps refusing
  connections is the circuit breaker's (``services.circuit``), not each operation's.
* **Ceilings.** An operation whose step failed ``PROXYHUB_MAX_ATTEMPTS`` deliveries in a row,
  or that is older than its kind's ``PROXYHUB_MAX_AGE_*_SECONDS``, ends ``failed`` with the last
  error: a failure that cannot heal ends and says why instead of retrying for ever. Time the
  operation spent paused by maintenance (issue 14) is not counted: its age is ``age_of``.
* **Claims.** A delivery running a step holds a claim of ``PROXYHUB_STEP_CLAIM_SECONDS`` that it
  renews while it runs, so a worker killed mid-step frees its step within that time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings

from provisioning.models.choices import OperationKind

if TYPE_CHECKING:
    from provisioning.models import Operation

# Defaults, each the value when its setting is absent.
STEP_RETRIES_IN_PLACE = 2
BASE_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 20.0
MAX_ATTEMPTS = 20
CLAIM_SECONDS = 20.0
# Create: clone (600 s budget) + boot to address (900 s budget) with room for retries.
# Power: a start follows the boot to its address (900 s) too. Delete: stop, destroy, seeds.
MAX_AGE_SECONDS = {
    OperationKind.CREATE: 3600,
    OperationKind.REPLACE: 5400,
    OperationKind.DELETE: 3600,
    OperationKind.START: 1800,
    OperationKind.SHUTDOWN: 1800,
    OperationKind.REBOOT: 1800,
    # A repair may reboot and then follows the boot to its address, as a start does.
    OperationKind.REPAIR: 1800,
    # Download (budgeted like a clone, 600 s), create with import, resize, conversion.
    OperationKind.TEMPLATE_BUILD: 3600,
}
_AGE_SETTING = {
    OperationKind.CREATE: "PROXYHUB_MAX_AGE_CREATE_SECONDS",
    OperationKind.REPLACE: "PROXYHUB_MAX_AGE_REPLACE_SECONDS",
    OperationKind.DELETE: "PROXYHUB_MAX_AGE_DELETE_SECONDS",
    OperationKind.START: "PROXYHUB_MAX_AGE_POWER_SECONDS",
    OperationKind.SHUTDOWN: "PROXYHUB_MAX_AGE_POWER_SECONDS",
    OperationKind.REBOOT: "PROXYHUB_MAX_AGE_POWER_SECONDS",
    OperationKind.REPAIR: "PROXYHUB_MAX_AGE_REPAIR_SECONDS",
    OperationKind.TEMPLATE_BUILD: "PROXYHUB_MAX_AGE_TEMPLATE_BUILD_SECONDS",
}


def _number(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass(frozen=True)
class Ceiling:
    """When an operation of one kind stops trying."""

    attempts: int
    age: timedelta


def ceiling_for(kind: str) -> Ceiling:
    op_kind = OperationKind(kind)
    return Ceiling(
        attempts=int(_number("PROXYHUB_MAX_ATTEMPTS", MAX_ATTEMPTS)),
        age=timedelta(seconds=_number(_AGE_SETTING[op_kind], MAX_AGE_SECONDS[op_kind])),
    )


def age_of(op: Operation, now: datetime) -> timedelta:
    """How long the operation has been trying: since it was created, less the time maintenance
    held it (ended pauses in ``paused_seconds``, and the one still on since ``paused_since``).
    An operator who pauses a node for an hour does not make its operations give up."""
    paused = float(op.paused_seconds or 0.0)
    if op.paused_since is not None:
        paused += max(0.0, (now - op.paused_since).total_seconds())
    return now - op.created_at - timedelta(seconds=paused)


def retries_in_place() -> int:
    return max(0, int(_number("PROXYHUB_STEP_RETRIES_IN_PLACE", STEP_RETRIES_IN_PLACE)))


def backoff(attempts: int) -> float:
    """Seconds to wait after the ``attempts``-th failed delivery in a row: 1, 2, 4 ... capped,
    each drawn from the upper half of its value so workers do not retry in step."""
    cap = _number("PROXYHUB_STEP_MAX_BACKOFF_SECONDS", MAX_BACKOFF_SECONDS)
    base = _number("PROXYHUB_STEP_BASE_BACKOFF_SECONDS", BASE_BACKOFF_SECONDS)
    value = min(cap, base * 2.0 ** max(0, min(attempts, 32) - 1))
    return value * random.uniform(0.5, 1.0)  # jitter, not a secret


def claim_seconds() -> float:
    return max(1.0, _number("PROXYHUB_STEP_CLAIM_SECONDS", CLAIM_SECONDS))
