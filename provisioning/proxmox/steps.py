"""The resumable step machine shared by create and delete.

A long Proxmox operation (seed 000 entries 10 and 11) is cut into steps. Each call to a step
function performs at most one Proxmox mutation or one task poll (plus the reads it needs to
decide) and returns a ``StepResult``: what happened, the new progress record, and what comes
next. The caller persists ``progress`` (a small JSON-serialisable dict) before anything else, so
a fresh process given only that record continues where the last one stopped.

Receipts (seed 001): a step that submits a Proxmox task returns its UPID at once, with the next
step polling it; a record holding a UPID is only ever polled, never submitted again.

Every wait on a task is planned from what that kind of task took on that node before
(``waits``): the machine's ``Durations`` say when the task should end, ``StepMachine.step``
sets the wait's delay from it, and a poll that finds the task ended says in its details
(``TIMING``) what the wait learned, for the caller to keep.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from .api import Api
from .budgets import Budgets
from .config import ProxmoxConfig
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import (
    ApiError,
    ClassifiedError,
    PermanentError,
    ProxmoxError,
    ReplyLost,
    TaskFailed,
    TransientError,
    classify,
)
from .task_board import Look, Seen, TaskBoard, read_seen
from .tasks import parse_upid
from .waits import Durations, NoDurations, Timing, next_wait, seen_at

Status = Literal["continue", "wait", "done", "error"]
Progress = dict[str, Any]
Req = TypeVar("Req")
# What a stage may raise besides a classified error: Proxmox's and the deadline's failures.
FAILURES = (ProxmoxError, Cancelled, DeadlineExceeded)
# The key of ``StepResult.details`` that carries a finished task's ``waits.Timing`` (a dict).
TIMING = "timing"
# The key of ``StepResult.details`` naming the other tasks a poll's look found ended (UPIDs).
ENDED_ELSEWHERE = "ended_elsewhere"

# The record's key for its ticket, and the key a stage reads to know the record is warm.
TICKET = "ticket"
WARM = "warm"
# How many unconsumed tickets a machine remembers (one per operation in flight in this process;
# an operation whose next step runs in another process leaves one behind, so the oldest go).
TICKETS_KEPT = 4096


class Tickets:
    """What this process knows about the records its machine returned (issue 12).

    A record returned by a step that ended without error gets a fresh ticket, remembered here.
    A step given a record whose ticket is remembered takes the ticket (once): the record is
    *warm*, meaning this very process wrote it and no step has run from it since, so nothing of
    ours reached Proxmox after it. Its stage may then skip the reads that only guard against an
    unrecorded mutation of our own (a worker that died after submitting, before its record was
    saved): the node's task list before a submission, a status the previous step just saw.

    Everything else is *cold*: a record from another process, from before a restart, an error
    record, or a record run a second time (its ticket was taken by the first run, so a step that
    crashed, or whose result could not be saved, is always followed by the read-backs). Memory
    dies with the process, which is exactly when a step may have been cut off mid-mutation."""

    def __init__(self, kept: int = TICKETS_KEPT) -> None:
        self._kept = kept
        self._held: OrderedDict[str, None] = OrderedDict()
        self._guard = threading.Lock()

    def issue(self) -> str:
        ticket = secrets.token_hex(8)
        with self._guard:
            self._held[ticket] = None
            while len(self._held) > self._kept:
                self._held.popitem(last=False)
        return ticket

    def take(self, ticket: object) -> bool:
        if not isinstance(ticket, str):
            return False
        with self._guard:
            return self._held.pop(ticket, False) is None


def warm(progress: Progress) -> bool:
    """Whether the stage runs from a record this process just wrote (``Tickets``)."""
    return bool(progress.get(WARM))


@dataclass
class StepResult:
    """What one step did and what comes next.

    * ``continue``: call again at once with ``progress``;
    * ``wait``: call again after ``delay`` seconds (a Proxmox task or a boot is in progress);
    * ``done``: finished; ``provider_id`` holds the VM's id for a create;
    * ``error``: ``error`` says why; ``progress`` is the record to resume from (a transient
      error is retried from it, a permanent one waits for an operator).

    ``step`` names the step that ran (for the journal), ``upid`` the task it submitted or
    polled, ``submitted`` whether it sent a mutation to Proxmox. ``met``: a later stage whose
    check this step's read met as well (a start's wait that saw the VM run is the running
    check too): the step is journalled as that stage, and no step of its own runs for it.
    ``vm_gone``: the VM the record, or the proxy's recorded identity, described no longer
    exists, so what was recorded of it (its identity, seed 001) describes nothing; the record
    starts over without it, and the caller forgets it too. ``passed``: the stages this step
    ran and ended before the one it reports (``StepMachine.follows``), oldest first, for the
    journal to record each.
    """

    status: Status
    progress: Progress
    step: str
    delay: float = 0.0
    upid: str | None = None
    submitted: bool = False
    message: str = ""
    provider_id: str | None = None
    error: ClassifiedError | None = None
    details: dict[str, Any] = field(default_factory=dict)
    met: str = ""
    vm_gone: bool = False
    passed: list[StepResult] = field(default_factory=list)


def advance(progress: Progress, stage: str, **changes: Any) -> Progress:
    """A copy of ``progress`` moved to ``stage``: the task handle and wait timer are cleared."""
    out = dict(progress)
    out.update(stage=stage, upid=None, since=None)
    out.pop("seen_running", None)
    out.pop("look_at", None)
    out.update(changes)
    return out


def poll_task(
    api: Api,
    progress: Progress,
    *,
    step: str,
    op: str,
    budget: float,
    poll_interval: float,
    next_stage: str,
    clock: Callable[[], float] = time.time,
    deadline: Deadline | None = None,
    on_failure: Callable[[TaskFailed], StepResult] | None = None,
    board: TaskBoard | None = None,
    look: Look | None = None,
) -> StepResult:
    """Read the recorded task once: still running means wait; ended means move on.

    With a ``board`` the read is the board's (``task_board``): one look at the node's task list
    when other tasks of ours run there, or what an earlier such look saw; the other tasks it
    found ended are named in the result's details (``ENDED_ELSEWHERE``) for the caller to wake.
    ``look``: the board's look the caller already made (a start's wait asks it first), read
    nothing more.

    The wait's start is kept in the record (``since``, wall clock, so it survives a move to
    another worker), and so is how long after it the task was last seen running
    (``seen_running``): an ended task's result carries both as a ``waits.Timing`` in its
    details. When the budget runs out the error is transient and names the UPID; the task keeps
    running on Proxmox and the retry polls the same UPID (seed 000 entry 18).
    """
    upid = progress["upid"]
    if look is None and board is not None:
        look = board.look(api, upid, clock=clock, deadline=deadline)
    elif look is None:
        look = Look(read_seen(api, upid, clock=clock, deadline=deadline))
    result = _polled(look.seen, progress, step, op, budget, poll_interval, next_stage, on_failure)
    if look.ended:
        result.details[ENDED_ELSEWHERE] = list(look.ended)
    return result


def _polled(
    seen: Seen,
    progress: Progress,
    step: str,
    op: str,
    budget: float,
    poll_interval: float,
    next_stage: str,
    on_failure: Callable[[TaskFailed], StepResult] | None,
) -> StepResult:
    """What the poll of ``progress``'s task makes of ``seen`` (``poll_task``'s arguments)."""
    upid = progress["upid"]
    outcome, sent, now = seen.outcome, seen.sent, seen.landed
    if outcome.state == "running":
        since = progress.get("since") or sent
        still = seen_at(
            planned=progress.get("look_at"), sent=sent - since, landed=now - since, running=True
        )
        waiting = dict(progress, since=since, seen_running=still)
        if now - since > budget:
            return StepResult(
                "error",
                waiting,
                step,
                upid=upid,
                error=TransientError(
                    f"Proxmox task {upid} still running after {int(budget)} s",
                    remediation="it keeps running on Proxmox; the next attempt polls it again",
                    op=op,
                ),
            )
        return StepResult("wait", waiting, step, delay=poll_interval, upid=upid)
    if outcome.state == "failed":
        failure = TaskFailed(upid, outcome.exitstatus)
        if on_failure is not None:
            return on_failure(failure)
        return StepResult("error", progress, step, upid=upid, error=classify(op, failure))
    message = outcome.exitstatus if outcome.state == "warnings" else ""
    result = StepResult("continue", advance(progress, next_stage), step, upid=upid, message=message)
    return with_timing(result, upid, progress, sent, now)


def with_timing(
    result: StepResult, upid: str, progress: Progress, sent: float, now: float
) -> StepResult:
    """``result`` with what the wait for ``upid`` learned in its details (``TIMING``), when
    the look sent at ``sent`` (answered at ``now``) found the task's work over."""
    timing = _timing(upid, progress, sent, now)
    if timing is not None:
        result.details[TIMING] = timing.as_dict()
    return result


def _timing(upid: str, progress: Progress, sent: float, now: float) -> Timing | None:
    """What the wait for ``upid``, whose look sent at ``sent`` found it ended at ``now``, tells
    about its task type on its node; None for a record without a wait start (written before
    waits were timed)."""
    since = progress.get("since")
    if not since:
        return None
    try:
        parsed = parse_upid(upid)
    except ValueError:
        return None
    return Timing(
        kind=parsed.type,
        scope=parsed.node,
        seen_running=float(progress.get("seen_running") or 0.0),
        seen_done=seen_at(
            planned=progress.get("look_at"),
            sent=sent - float(since),
            landed=now - float(since),
            running=False,
        ),
    )


def task_wait(
    result: StepResult,
    *,
    durations: Durations,
    budgets: Budgets,
    now: float,
) -> float:
    """The delay of a ``wait`` on ``result.upid``: until the task's expected end, then a short
    interval doubling up to the poll interval (``waits.next_wait``). The look's plan goes into
    the record (``look_at``) for the poll to learn from."""
    assert result.upid is not None
    try:
        parsed = parse_upid(result.upid)
    except ValueError:
        return budgets.poll_interval
    since = result.progress.get("since")
    elapsed = max(0.0, now - float(since)) if since else 0.0
    # A node where no task of this type ran yet plans from the other nodes' estimate
    # (``waits.Durations.elsewhere``), not from nothing: its first look would come 50 ms after
    # the submission and find any real task still going (issue 12).
    expected = durations.expected(parsed.type, parsed.node)
    if expected is None:
        expected = durations.elsewhere(parsed.type, parsed.node)
    delay = next_wait(
        expected=expected,
        elapsed=elapsed,
        cap=budgets.poll_interval,
        limit=budgets.for_task(parsed.type),
    )
    if since:
        result.progress["look_at"] = elapsed + delay
    return delay


def fail(progress: Progress, step: str, err: BaseException, *, op: str) -> StepResult:
    """An ``error`` result for ``err``, classified for ``op``."""
    return StepResult("error", progress, step, error=classify(op, err))


def permanent(progress: Progress, step: str, message: str, remediation: str, op: str) -> StepResult:
    return StepResult(
        "error",
        progress,
        step,
        error=PermanentError(message, remediation=remediation, op=op),
    )


# How many of a VM's tasks of one type a submission looks at: the node lists them newest first.
KNOWN_TASKS = 10


def vm_tasks(
    api: Api,
    node: str,
    vmid: int | None,
    task_type: str,
    *,
    deadline: Deadline | None = None,
    task_id: str | None = None,
) -> list[dict[str, Any]]:
    """The VM's latest ``task_type`` tasks on ``node``, newest first, running or ended (a
    running task has no ``endtime``, pve-reference §4.3). ``task_id``: a task whose id is not
    a VMID (a ``download``'s escaped file name, §4.5), looked for among the node's tasks of
    that type."""
    wanted = str(vmid) if task_id is None else task_id
    return [
        task
        for task in api.node_tasks(
            node,
            vmid=vmid if task_id is None else None,
            typefilter=task_type,
            source="all",
            limit=KNOWN_TASKS,
            deadline=deadline,
        )
        if task.get("type") == task_type and str(task.get("id")) == wanted and task.get("upid")
    ]


def submit_once(
    api: Api,
    progress: Progress,
    *,
    step: str,
    next_stage: str,
    node: str,
    vmid: int,
    task_type: str,
    submit: Callable[[], str],
    message: str,
    poll_interval: float,
    op: str,
    clock: Callable[[], float] = time.time,
    deadline: Deadline | None = None,
    warm: bool = False,
    task_id: str | None = None,
) -> StepResult:
    """Submit a VM task, unless it is already there: then adopt its UPID as the receipt.
    (``task_id``: the task's id when it is not ``vmid``, see ``vm_tasks``.)

    Two ways it can be there (seed 001: reading a receipt never repeats the mutation):

    * a submission of ours whose reply was lost: the record then holds the tasks the node
      listed just before it (``known_tasks``), and a task of that type that is not among them
      is ours, running or already ended;
    * a worker died after submitting, before its record was saved: the task is still running.

    Either way the result carries the UPID and the next stage polls it. A ``warm`` record
    (``Tickets``) without ``known_tasks`` rules out both: nothing of ours was sent since it was
    written, so the node's task list is not read (issue 12: no redundant reads).
    """
    known = progress.get("known_tasks")
    tasks = (
        []
        if warm and known is None
        else vm_tasks(api, node, vmid, task_type, deadline=deadline, task_id=task_id)
    )
    upid: str | None = None
    if known is not None:
        fresh = [t for t in tasks if t["upid"] not in known]
        if fresh:
            upid = str(fresh[0]["upid"])
            message = f"found {task_type} task {upid} of the submission whose reply was lost"
    if upid is None:
        running = [t for t in tasks if t.get("status") == "RUNNING" or "endtime" not in t]
        if running:
            upid = str(running[0]["upid"])
            message = f"found running {task_type} task {upid}; waiting for it instead"
    submitted = upid is None
    if upid is None:
        try:
            upid = submit()
        except ReplyLost as err:
            # Maybe applied: the next run compares the node's tasks with these.
            sent = dict(progress, known_tasks=[str(t["upid"]) for t in tasks])
            return fail(sent, step, err, op=op)
    return StepResult(
        "wait",
        advance(progress, next_stage, upid=upid, since=clock(), known_tasks=None),
        step,
        delay=poll_interval,
        upid=upid,
        submitted=submitted,
        message=message,
    )


class StepMachine(Generic[Req]):
    """What every step machine shares: dispatch of the record's stage to the method
    ``_<stage>``, failure classification, and the two ways a stage touches a task (submit
    once, poll). Subclasses set ``op`` and ``first_stage`` and may override the hooks."""

    op = ""
    first_stage = ""
    # Stages that may run in the step whose stage before them went on at once (``continue``),
    # when the caller allows it (``step``'s ``may_follow``): a stage of its own would cost a
    # whole delivery for a synchronous write or a submission on a node slot already held.
    follows: frozenset[str] = frozenset()

    def __init__(
        self,
        api: Api,
        config: ProxmoxConfig,
        budgets: Budgets,
        *,
        clock: Callable[[], float] = time.time,
        durations: Durations | None = None,
        board: TaskBoard | None = None,
    ) -> None:
        """``board``: where polls read their tasks (``task_board``); None reads each alone."""
        self.api = api
        self.config = config
        self.budgets = budgets
        self.clock = clock
        self.tickets = Tickets()
        self.durations: Durations = durations or NoDurations()
        self.board = board

    def step(
        self,
        req: Req,
        progress: Progress,
        *,
        deadline: Deadline | None = None,
        may_follow: Callable[[Progress], bool] | None = None,
    ) -> StepResult:
        """Run the record's stage once. The record the result carries is warm for this machine's
        next step only when the step ended without error (``Tickets``).

        A stage that went on at once to a stage of ``follows`` is followed by it in this step
        when ``may_follow`` says so for the record that stage starts from (the services decide:
        a node slot already held, no maintenance switch to consult). The earlier stages go in
        the result's ``passed``, and what their results said for the estimates and the wakes
        (their details) goes along. A stage that forgot the VM (``vm_gone``) is never followed:
        what it forgot is committed before anything else runs."""
        is_warm = self.tickets.take(progress.get(TICKET))
        result = self._run(req, _warmed(progress, is_warm), deadline)
        passed: list[StepResult] = []
        while (
            may_follow is not None
            and len(passed) < len(self.follows)
            and result.status == "continue"
            and not result.vm_gone
            and result.progress.get("stage") in self.follows
            and may_follow(result.progress)
        ):
            passed.append(result)
            following = self._run(req, result.progress, deadline)
            following.details = {**result.details, **following.details}
            result = following
        if passed:
            result.passed = passed
        result.progress = {k: v for k, v in result.progress.items() if k not in (TICKET, WARM)}
        if result.status in ("continue", "wait"):
            result.progress[TICKET] = self.tickets.issue()
        return result

    def _run(self, req: Req, progress: Progress, deadline: Deadline | None) -> StepResult:
        stage = progress.get("stage", self.first_stage)
        handler = getattr(self, f"_{stage}", None)
        if handler is None:
            return permanent(
                progress,
                stage,
                f"unknown {self.op} stage {stage!r} in the progress record",
                "the record was written by another proxyhub version; retry the operation",
                self.op,
            )
        try:
            result: StepResult = handler(req, progress, deadline)
            # The journal names the stage that ran, whoever built the result (or the later
            # stage it met as well).
            result.step = result.met or stage
            if result.status == "wait" and result.upid:
                # Every task wait, whichever stage built it, is planned from the task's
                # expected duration (module docstring).
                result.delay = task_wait(
                    result, durations=self.durations, budgets=self.budgets, now=self.clock()
                )
        except PermanentError as err:
            self.on_refused(req, err)
            return StepResult("error", progress, stage, error=err)
        except ApiError as err:
            return self.on_api_error(progress, stage, err)
        except FAILURES as err:
            return fail(progress, stage, err, op=self.op)
        if result.status == "done":
            self.on_done(req, progress, result)
        return result

    # --- hooks --------------------------------------------------------------------------

    def on_refused(self, req: Req, err: PermanentError) -> None:
        """A stage raised a permanent error (logged by subclasses that want it)."""

    def on_api_error(self, progress: Progress, stage: str, err: ApiError) -> StepResult:
        return fail(progress, stage, err, op=self.op)

    def on_done(self, req: Req, progress: Progress, result: StepResult) -> None:
        """The machine finished (subclasses log their one outcome line here)."""

    # --- tasks ----------------------------------------------------------------------------

    def poll(
        self,
        progress: Progress,
        step: str,
        budget: float,
        next_stage: str,
        deadline: Deadline | None,
        on_failure: Callable[[TaskFailed], StepResult] | None = None,
        look: Look | None = None,
    ) -> StepResult:
        return poll_task(
            self.api,
            progress,
            step=step,
            op=self.op,
            budget=budget,
            poll_interval=self.budgets.poll_interval,
            next_stage=next_stage,
            clock=self.clock,
            deadline=deadline,
            on_failure=on_failure,
            board=self.board,
            look=look,
        )

    def submit_task(
        self,
        progress: Progress,
        step: str,
        next_stage: str,
        task_type: str,
        submit: Callable[[], str],
        message: str,
        deadline: Deadline | None,
    ) -> StepResult:
        """``submit_once`` for the VM the record names."""
        return submit_once(
            self.api,
            progress,
            step=step,
            next_stage=next_stage,
            node=str(progress["node"]),
            vmid=int(progress["vmid"]),
            task_type=task_type,
            submit=submit,
            message=message,
            poll_interval=self.budgets.poll_interval,
            op=self.op,
            clock=self.clock,
            deadline=deadline,
            warm=warm(progress),
        )


def _warmed(progress: Progress, is_warm: bool) -> Progress:
    out = {k: v for k, v in progress.items() if k not in (TICKET, WARM)}
    if is_warm:
        out[WARM] = True
    return out
