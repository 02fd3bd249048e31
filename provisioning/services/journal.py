"""The journal's step rows: one row per stage of an operation, with its receipt and timings.

A stage polled across many deliveries (a running Proxmox task, a boot) stays one row, updated
until it ends; the UPID a stage submitted is on its row before any wait starts (DESIGN.md §5,
receipts). A step whose mutation may have been applied although its answer was lost is marked
``unknown`` until the next delivery's read-back settles it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from provisioning.models import Operation, OperationStep
from provisioning.models.choices import StepState
from provisioning.proxmox.steps import StepResult

from .runners import Outcome

steps_log = logging.getLogger("proxyhub.operations.steps")


def journal_step(op: Operation, outcome: Outcome, now: datetime) -> None:
    """Record what ``outcome`` says about the stage that ran (and, before it, about the stages
    the step ended on its way: ``Outcome.passed`` and ``StepResult.passed``, each journalled
    the same way, as finished)."""
    last = op.steps.order_by("-seq").first()
    for passed in _passed(outcome):
        name = passed.step.removesuffix("_wait")
        last = _journal(op, last, name, passed, finished=True, now=now)
    name = outcome.phase_name or outcome.result.step.removesuffix("_wait")
    _journal(op, last, name, outcome.result, finished=outcome.finished, now=now)


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
