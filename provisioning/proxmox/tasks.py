"""Proxmox tasks: UPIDs, one status read, a bounded wait, and the log tail (seed 000 entry 10).

Proxyhub never holds a worker while Proxmox is busy (DESIGN.md §6): callers read a task's
status once with ``read_task`` and re-enqueue themselves while it runs. ``wait_task`` is the
blocking form for tools and tests, bounded by a budget from ``budgets.Budgets``; when the
budget runs out the task keeps running on Proxmox and the error is transient (entry 18).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Literal

from .api import Api
from .deadline import Deadline, effective
from .errors import TaskFailed, TransientError

log = logging.getLogger("proxyhub.proxmox.tasks")

# pve-reference §4.1 (pve-common ``UPID.pm``): note the trailing colon; hex in either case.
_UPID = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
    r":(?P<pid>[0-9a-fA-F]{8}):(?P<pstart>[0-9a-fA-F]{8,9}):(?P<starttime>[0-9a-fA-F]{8})"
    r":(?P<type>[^:\s/]+):(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)
# pve-reference §4.2: ``OK`` and ``WARNINGS: n`` are success (``UPID.pm`` ``status_is_error``).
_WARNINGS = re.compile(r"WARNINGS: \d+")

TaskState = Literal["running", "ok", "warnings", "failed"]


@dataclass(frozen=True)
class Upid:
    """A parsed UPID. ``id`` may be empty (``imgcopy``); for ``qmclone`` it is the source VMID."""

    text: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str

    def __str__(self) -> str:
        return self.text


def parse_upid(text: str) -> Upid:
    """Parse ``UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`` (or ``ValueError``)."""
    found = _UPID.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        shown = text if isinstance(text, str) and len(text) <= 200 else f"{str(text)[:200]}..."
        raise ValueError(
            f"not a Proxmox UPID: {shown!r} (expected "
            "UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>: with hex numbers "
            "and a trailing colon)"
        )
    return Upid(
        text=text,
        node=found["node"],
        pid=int(found["pid"], 16),
        pstart=int(found["pstart"], 16),
        starttime=int(found["starttime"], 16),
        type=found["type"],
        id=found["id"],
        user=found["user"],
    )


@dataclass(frozen=True)
class TaskOutcome:
    """One reading of a task. ``exitstatus`` is Proxmox's text once stopped, else empty."""

    state: TaskState
    exitstatus: str
    upid: str

    @property
    def finished(self) -> bool:
        return self.state != "running"

    @property
    def succeeded(self) -> bool:
        """``OK`` or ``WARNINGS: n``: Proxmox counts both as a finished task (entry 10)."""
        return self.state in ("ok", "warnings")


def outcome_of(upid: str, status: dict[str, object]) -> TaskOutcome:
    """The outcome a task-status answer describes (pve-reference §4.2).

    Only ``stopped`` ends a task; any other ``status`` is still running, so an unexpected
    value never passes for success. A stopped task without ``exitstatus`` is a failure with
    Proxmox's own wording for it.
    """
    if str(status.get("status", "")).lower() != "stopped":
        return TaskOutcome("running", "", upid)
    exitstatus = str(status.get("exitstatus") or "unexpected status")
    if exitstatus == "OK":
        return TaskOutcome("ok", exitstatus, upid)
    if _WARNINGS.fullmatch(exitstatus):
        return TaskOutcome("warnings", exitstatus, upid)
    return TaskOutcome("failed", exitstatus, upid)


def listed_outcome(upid: str, entry: dict[str, object]) -> TaskOutcome:
    """The outcome an entry of a node's task list describes (pve-reference §4.4): a running
    task is listed with ``status: RUNNING`` and no ``endtime``; an ended one with its exit
    status as ``status``. Anything short of an end time with a status is still running."""
    status = str(entry.get("status") or "")
    if "endtime" not in entry or not status or status.upper() == "RUNNING":
        return TaskOutcome("running", "", upid)
    return outcome_of(upid, {"status": "stopped", "exitstatus": status})


def read_task(api: Api, upid: str, *, deadline: Deadline | None = None) -> TaskOutcome:
    """Read a task's status once, from the node named in its UPID (pve-reference §4.2).

    A task that ended with warnings is logged at INFO and reported as ``warnings`` (success);
    a failed one is logged at INFO with its exit status and reported as ``failed``. Raises
    ``ValueError`` for a malformed UPID and the seam's errors for the request itself.
    """
    parsed = parse_upid(upid)
    return logged(outcome_of(upid, api.task_status(parsed.node, upid, deadline=deadline)))


def logged(outcome: TaskOutcome) -> TaskOutcome:
    """``outcome``, logged at INFO when its task ended with warnings or failed."""
    if outcome.state in ("warnings", "failed"):
        text = "finished with warnings" if outcome.state == "warnings" else "failed"
        log.info(
            f"proxmox task {text}",
            extra={
                "upid": outcome.upid,
                "node": parse_upid(outcome.upid).node,
                "exitstatus": outcome.exitstatus,
            },
        )
    return outcome


def wait_task(
    api: Api,
    upid: str,
    *,
    budget: float,
    poll_interval: float = 1.0,
    deadline: Deadline | None = None,
    op: str = "",
) -> TaskOutcome:
    """Poll a task until it ends; blocking, so only for tools, tests and short waits.

    Success (``OK`` or ``WARNINGS: n``) returns the outcome; failure raises ``TaskFailed`` with
    Proxmox's exit status. When ``budget`` seconds pass first, ``TransientError`` names the
    UPID: the task keeps running on Proxmox and the next attempt reads its result (seed 000
    entry 18). Sleeps on the deadline, so a cancel ends the wait at once.
    """
    dl = effective(deadline)
    give_up = time.monotonic() + budget
    while True:
        outcome = read_task(api, upid, deadline=dl)
        if outcome.state == "failed":
            raise TaskFailed(upid, outcome.exitstatus)
        if outcome.finished:
            return outcome
        left = give_up - time.monotonic()
        if left <= 0:
            raise TransientError(
                f"Proxmox task {upid} still running after {budget:g} s",
                remediation="it keeps running on Proxmox; the next attempt reads its result",
                op=op,
            )
        dl.sleep(min(poll_interval, left))


def task_log_tail(
    api: Api, upid: str, lines: int = 20, *, deadline: Deadline | None = None
) -> list[str]:
    """The last ``lines`` lines of a task's log, for diagnostics (pve-reference §4.3).

    The whole log is read (``limit=0``) because the seam returns no line count; task logs are
    short. A running task's empty log reads as Proxmox's ``no content`` pseudo line.
    """
    if lines <= 0:
        return []
    parsed = parse_upid(upid)
    entries = api.task_log(parsed.node, upid, start=0, limit=0, deadline=deadline)
    ordered = sorted(entries, key=lambda e: int(e.get("n", 0)))
    return [str(e.get("t", "")) for e in ordered[-lines:]]
