"""The journal's step rows: one row per stage of an operation, with its receipt and timings.

A stage polled across many deliveries (a running Proxmox task, a boot) stays one row, updated
until it ends; the UPID a stage submitted is on its row before any wait starts (DESIGN.md §5,
receipts). A step whose mutation may have been applied although its answer was lost is marked
``unknown`` until the next delivery's read-back settles it.

Each step starts from the operation's last row. A process that journalled a step keeps that row
for the step's next delivery (``journal_head_keep``), keyed by the token the step committed, and
the delivery that claims with that token takes it once (``journal_head_take``), as a machine's
record is taken once (``proxmox.steps.Tickets``). Only the claim's holder writes an operation's
rows, so nothing can have come after the kept row: any other step of the operation has its own
token. Reading the row was 6.5 % of a step delivery in issue 12's makespan (py-spy of the one
worker). A delivery without a kept row (another process journalled the step before, or the step
waits for a task slot, whose wait is journalled outside the step) reads it as before.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from datetime import datetime

from provisioning.models import Operation, OperationStep
from provisioning.models.choices import StepState
from provisioning.proxmox.steps import StepResult

from .runners import Outcome

steps_log = logging.getLogger("proxyhub.operations.steps")

# How many kept rows a process holds: one per operation between two of its steps. A fleet with
# more in flight in one process reads the oldest ones' rows again.
HEADS_KEPT = 1024


class _Heads:
    """The last row of each operation this process journalled, by the token of its next step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: OrderedDict[tuple[str, str], OperationStep] = OrderedDict()

    def keep(self, operation_id: str, token: str, row: OperationStep) -> None:
        with self._lock:
            self._rows[(operation_id, token)] = row
            while len(self._rows) > HEADS_KEPT:
                self._rows.popitem(last=False)

    def take(self, operation_id: str, token: str) -> OperationStep | None:
        with self._lock:
            return self._rows.pop((operation_id, token), None)


_heads = _Heads()
# The columns a kept row copies, in the order ``Model.from_db`` takes them.
_STEP_COLUMNS = [field.attname for field in OperationStep._meta.concrete_fields]


def journal_head_keep(operation_id: str, token: str, row: OperationStep) -> None:
    """Keep ``row``, the operation's last, for the delivery that claims ``token``: written in
    the transaction that writes the token, so it is there whenever the token can be claimed. A
    copy of its columns is kept, not the row object, which holds the operation it was
    journalled for."""
    # Model.from_db: a saved row, as a query would have returned it.
    values = [getattr(row, name) for name in _STEP_COLUMNS]
    kept = OperationStep.from_db(row._state.db, _STEP_COLUMNS, values)
    _heads.keep(operation_id, token, kept)


def journal_head_take(operation_id: str, token: str) -> OperationStep | None:
    """The row kept for the step that ``token`` names, once; None when this process kept none
    (module docstring)."""
    return _heads.take(operation_id, token)


def journal_step(
    op: Operation, outcome: Outcome, now: datetime, *, head: OperationStep | None = None
) -> OperationStep:
    """Record what ``outcome`` says about the stage that ran (and, before it, about the stages
    the step ended on its way: ``Outcome.passed`` and ``StepResult.passed``, each journalled
    the same way, as finished). ``head``: the operation's last row as kept for this step
    (``journal_head_take``), read when not given. Returns the operation's last row."""
    last = head if head is not None else op.steps.order_by("-seq").first()
    for passed in _passed(outcome):
        name = passed.step.removesuffix("_wait")
        last = _journal(op, last, name, passed, finished=True, now=now)
    name = outcome.phase_name or outcome.result.step.removesuffix("_wait")
    return _journal(op, last, name, outcome.result, finished=outcome.finished, now=now)


def _passed(outcome: Outcome) -> list[StepResult]:
    """The stages the step ended before the one it journals, oldest first."""
    out: list[StepResult] = []
    if outcome.passed is not None:
        out.extend(outcome.passed.passed)
        out.append(outcome.passed)
    out.extend(outcome.result.passed)
    return out


def _journal(
    op: Operation,
    last: OperationStep | None,
    name: str,
    result: StepResult,
    *,
    finished: bool,
    now: datetime,
) -> OperationStep:
    """Write ``result`` onto stage ``name``'s row (``finished``: the operation ended with it);
    the row, saved."""
    open_row = _row_named(op, last, name, now)
    if result.upid:
        open_row.upid = result.upid
    if result.message:
        open_row.message = result.message
    if result.status == "error":
        error = result.error
        open_row.message = str(error) if error else "failed"
        if error is not None and error.kind == "permanent":
            open_row.state, open_row.finished_at = StepState.FAILED, now
        elif error is not None and error.reply_lost:
            open_row.state = StepState.UNKNOWN
        else:
            open_row.state = StepState.RETRYING
    elif result.status == "wait":
        open_row.state = StepState.WAITING
    elif result.status == "done" or finished:
        open_row.state, open_row.finished_at = StepState.SUCCEEDED, now
    else:
        open_row.state = StepState.RUNNING
    open_row.save()
    if open_row.finished_at is not None:
        _record_phase(op, open_row)
    return open_row


def _row_named(
    op: Operation, last: OperationStep | None, name: str, now: datetime
) -> OperationStep:
    """The open row of stage ``name`` (unsaved when new); an open row of another stage, which
    this step follows, is closed first (as succeeded unless it already failed)."""
    open_row = last if last is not None and last.finished_at is None else None
    if open_row is not None and open_row.name != name:
        open_row.finished_at = now
        if open_row.state in (
            StepState.RUNNING,
            StepState.WAITING,
            StepState.RETRYING,
            StepState.UNKNOWN,
        ):
            open_row.state = StepState.SUCCEEDED
        open_row.save(update_fields=["finished_at", "state"])
        _record_phase(op, open_row)
        open_row = None
    if open_row is None:
        open_row = OperationStep(
            operation=op, seq=(last.seq + 1) if last else 1, name=name, started_at=now
        )
    return open_row


def journal_close(op: Operation, now: datetime, *, state: str, message: str) -> None:
    """End the operation's open row, if any (an operation that ended without running a step:
    it gave up at its ceiling)."""
    row = op.steps.filter(finished_at__isnull=True).order_by("-seq").first()
    if row is None:
        return
    row.state, row.finished_at, row.message = state, now, message
    row.save(update_fields=["state", "finished_at", "message"])


def _record_phase(op: Operation, row: OperationStep) -> None:
    """One DEBUG line per finished stage. The project turns these lines into the step-duration
    histogram (``proxyhub.metrics.StepMetricsHandler`` on this logger, in settings), so the
    services need not import the project package above them."""
    if row.duration is not None:
        steps_log.debug(
            "operation step finished",
            extra={"kind": str(op.kind), "step": row.name, "duration": row.duration},
        )
