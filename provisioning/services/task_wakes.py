"""Which of our Proxmox tasks run on a node, and waking the operations whose task ended (issue 12).

A step that polls its task reads it through the cluster's board (``proxmox.task_board``): when
other operations wait on tasks on the same node, one look at the node's task list answers for
all of them. The board asks ``ClusterTasksInFlight`` which tasks those are, and the driver hands
the ones the look saw ended to ``tasks_ended_wake``: each such operation's step is made due now
and sent (with the token it has), instead of waiting for its own planned look. Its poll then
reads nothing (the board remembers the end, in this process). A step whose look was due within
``WAKE_AHEAD`` anyway is left to it: a second message would cost a delivery and gain little.

The tasks in flight are the open journal rows waiting on a UPID (``StepState.WAITING``) of the
operations holding the cluster's task slots (``services.slots``): a handful of rows (the cap per
node), read by the slot table's and the journal's indexes. A cluster without the cap has no
holders, and every poll reads its own task, as before.

Waking is safe by construction: it changes only the operation's due time, and only while the
operation still waits for the message of its look (same token, no claim, ``waiting``); the
woken step goes through the driver's claim, maintenance, breaker and lease as any other, and
of the two messages with its token, the one that comes second finds the step taken and exits.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from provisioning.models import Operation, OperationStep, TaskSlot
from provisioning.models.choices import OperationState, StepState

from . import dispatch, slots
from .clock import db_now

log = logging.getLogger("proxyhub.operations")

# A step whose own look is due within this many seconds is not woken (module docstring): the
# wake's message costs a delivery, and on a busy worker it queues behind every step already
# due, so it gains only when the planned look is well away (a real cluster's task of seconds
# that ended early, not a simulator's tenth of a second).
WAKE_AHEAD = 0.25
# At most this many other tasks join one look (the cap per node keeps it to a few).
IN_FLIGHT_LIMIT = 64


@dataclass
class StepView:
    """What the running step's driver knows for the board: the slot rows it read before the
    step ran (``slots.slots_look``), for the operation ``operation_id``; and, filled by the
    board's question, the tasks in flight whose own look was then more than ``WAKE_AHEAD``
    away: only those are worth a wake, so a look that saw only near-due tasks end sends no
    wake query at all."""

    operation_id: Any
    seen: slots.Seen
    wakeable: set[str] = field(default_factory=set)


_view: ContextVar[StepView | None] = ContextVar("task_wakes_view", default=None)


@contextmanager
def slot_holders_known(operation_id: Any, seen: slots.Seen) -> Iterator[StepView]:
    """Within the block, ``ClusterTasksInFlight`` knows the slot holders ``seen`` (for the
    step of ``operation_id``): on a node where no other operation holds a slot it asks the
    database nothing."""
    view = StepView(operation_id, seen)
    reset = _view.set(view)
    try:
        yield view
    finally:
        _view.reset(reset)


class ClusterTasksInFlight:
    """``proxmox.task_board.InFlight`` over one cluster's slot holders (module docstring)."""

    def __init__(self, cluster_id: int) -> None:
        self.cluster_id = cluster_id

    def __call__(self, node: str, upid: str) -> list[str]:
        view = _view.get()
        key = slots.node_key(node)
        if view is not None and key in view.seen and not _others_hold(view, key):
            return []
        rows = list(
            _waiting_steps(self.cluster_id)
            .filter(upid__startswith=f"UPID:{node}:")
            .exclude(upid=upid)
            .values_list("upid", "operation__next_step_at")[:IN_FLIGHT_LIMIT]
        )
        if view is not None:
            far = db_now() + timedelta(seconds=WAKE_AHEAD)
            view.wakeable.update(u for u, due in rows if due is not None and due > far)
        return [u for u, _ in rows]


def tasks_ended_wake(*, cluster_id: int, upids: Collection[str], now: datetime) -> int:
    """Make due now, and send, the step of each operation of the cluster waiting on one of
    ``upids`` (tasks a look saw ended) whose own look is not due within ``WAKE_AHEAD``.
    Returns how many were woken; the messages go out on commit."""
    if not upids:
        return 0
    rows = (
        _waiting_steps(cluster_id)
        .filter(
            upid__in=list(upids),
            operation__state=OperationState.WAITING,
            operation__claim_token="",
            operation__next_step_at__gt=now + timedelta(seconds=WAKE_AHEAD),
        )
        .values_list("operation_id", "operation__dispatch_token", "operation__trace_parent")
    )
    woken = 0
    for operation_id, token, trace_parent in list(rows):
        # One row per transaction: two deliveries waking each other's operations never hold
        # one row while waiting for the other's.
        with transaction.atomic():
            if Operation.objects.filter(
                pk=operation_id,
                dispatch_token=token,
                claim_token="",
                state=OperationState.WAITING,
            ).update(next_step_at=now, dispatched_at=now, redispatches=0):
                # The same token: whichever of the two messages comes first runs the step and
                # the other finds it taken. A new token would make the planned look's message
                # stale, and on a busy worker that one may well come before the wake's, which
                # queues behind every step already due.
                dispatch.send_after_commit(str(operation_id), token, 0.0, trace_parent)
                woken += 1
    if woken:
        log.debug("steps woken by a look at their node", extra={"woken": woken})
    return woken


def _others_hold(view: StepView, key: str) -> bool:
    """Whether an operation other than the step's own holds a slot of ``key``."""
    return any(holder not in (None, view.operation_id) for _, _, holder in view.seen[key])


def _waiting_steps(cluster_id: int) -> QuerySet[OperationStep, Any]:
    """The open journal rows waiting on a task, of the operations holding the cluster's slots."""
    holders = TaskSlot.objects.filter(cluster_id=cluster_id, operation__isnull=False).values(
        "operation_id"
    )
    return OperationStep.objects.filter(
        operation_id__in=holders, finished_at__isnull=True, state=StepState.WAITING
    ).exclude(upid="")
