"""Running an operation one step per delivery (DESIGN.md §6).

Each delivery of the step task calls ``operation_run_step``:

1. **claim** the step (``services.claims``): only the message carrying the current
   ``dispatch_token``, for an unfinished operation whose step is due and that no other delivery
   runs, gets it; a duplicate or stale message exits, an early one is sent again for later;
2. **wait for maintenance** when the step would write to a cluster or node whose maintenance
   switch is on (``services.maintenance``): no attempt is counted and the pause does not age it;
3. **give up** at once when the operation is older than its kind's ceiling (``services.policy``);
4. **defer** without running when the cluster's circuit breaker is open (``services.circuit``)
   or another operation still holds the proxy (``services.leases``): a deferral holds no worker
   slot and costs no attempt;
5. run **one** step (``services.runners``) with no transaction or row lock held, renewing the
   claim while it runs; a transient failure is run again in the same delivery (the stage reads
   back what Proxmox holds first, so nothing is sent twice blindly) before it counts;
6. **journal** the step (its UPID before any wait), the progress record and the proxy's observed
   state in one transaction under the proxy's row lock, release the claim, and send the next
   message after commit, with a countdown while Proxmox works. No worker slot waits on Proxmox.
   The countdown is the provider's: the task's expected end, then a short growing interval
   (``proxmox.waits``); a step whose wait ended teaches the estimate (``services.durations``).

Every failure ends or heals: a permanent failure ends the operation; a power action on a VM
that no longer exists ends at once and leaves the proxy to be re-created; a transient failure
waits a short, capped, jittered backoff, and the operation ends ``failed`` with its last error
once it reaches its ceiling of attempts or age.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.core.exceptions import ObjectDoesNotExist
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F

from provisioning.models import CircuitBreaker, Operation, OperationStep, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredState,
    ErrorClass,
    OperationState,
    Phase,
)
from provisioning.proxmox.errors import ClassifiedError, PermanentError, TransientError, classify
from provisioning.proxmox.identity import IdentityMismatch
from provisioning.proxmox.steps import ENDED_ELSEWHERE, StepResult
from provisioning.proxmox.waits import BOOT

from . import (
    circuit,
    claims,
    dispatch,
    durations,
    leases,
    maintenance,
    policy,
    prepared_statements,
    slots,
    task_wakes,
    template_builds,
    tracing,
)
from .clock import db_now
from .compiled_read import CompiledRead
from .journal import journal_head_keep, journal_head_take, journal_step
from .providers import provider_for
from .runners import IN_PLACE_KINDS, Outcome, address_budget, run_step

log = logging.getLogger("proxyhub.operations")

# How long a step waits for a proxy another operation still holds before it looks again.
LEASE_WAIT_SECONDS = 2.0
# The pause before a contended step is run again in the same delivery: long enough for a lock
# that timed out to clear, short enough that it costs a fraction of a second. Other faults are
# tried again without a pause.
IN_PLACE_PAUSE_SECONDS = 0.1
# At most this many steps of one operation run in one delivery, for at most this long, when each
# next step is due at once (``operation_run_step``). A chain ends sooner in practice: at the
# step's next wait on Proxmox (a look, then steps due at once, then one submission).
CHAIN_STEPS = 8
CHAIN_SECONDS = 5.0

# How a step reads its operation, with what every step looks at. Compiled once per process
# (services.compiled_read): building and compiling it took longer than running it.
_OPERATION_READ = CompiledRead(
    maintenance.with_switches_flag(
        Operation.objects.select_related("proxy", "cluster", "cluster__circuit")
    )
)


def operation_run_step(*, operation_id: str, token: str, trace_parent: str = "") -> None:
    """Run a step of the operation; see the module docstring. ``trace_parent`` is the trace
    context the message carried (services.tracing); the operation's row has it too.

    When the step gave a task slot back to a waiting step (services.slots), that step runs
    next, here: the slot's node gets its next task now rather than after the waiter's message
    has waited its turn in the queue behind every other step. It has no message then (one would
    only cost a delivery that finds the step taken: issue 12, one in seven of a capped fleet's
    deliveries); it is sent when this delivery cannot claim the step, or fails before it has.
    One such step per delivery: what that one frees waits for its message.

    A step whose next step is due at once runs that next step here too instead of sending it
    through the broker, up to ``CHAIN_STEPS`` steps and ``CHAIN_SECONDS``: a create no longer
    pays a broker round trip between a task's end and the next submission. It does so even
    while other operations' steps are due: their turn comes after this chain, which ends at its
    next wait on Proxmox. Yielding at every step kept the queue's order but cost the one worker
    of issue 12's makespan a delivery per transition (a publish, a claim, the operation's read):
    1.80-2.00 times the floor chaining against 2.08-2.16 yielding, interleaved runs. (An early
    attempt that chained regardless made it worse, 5.72 to 8.52, on the control loop from
    before task slots and the task board; measured again on today's, chaining wins.) A step
    that freed a slot for a waiting step yields: the waiter runs next and the chain's next step
    goes through the broker (``_run_one``)."""
    with prepared_statements.steps_prepared():
        _run_delivery(operation_id=operation_id, token=token, trace_parent=trace_parent)


def _run_delivery(*, operation_id: str, token: str, trace_parent: str) -> None:
    """``operation_run_step``'s steps: the first, its chain and the waiter it woke."""
    started = time.monotonic()
    # The chained step's token, committed with no message, until this delivery claims it.
    unsent: list[str] = []
    # The woken waiter this delivery is to run, with no message, until it claims its step.
    waiting: list[slots.Woken] = []
    try:
        for run in range(CHAIN_STEPS):
            may_chain = run + 1 < CHAIN_STEPS and time.monotonic() - started < CHAIN_SECONDS
            unsent.clear()
            with slots.collecting_woken() as woken:
                try:
                    chained = _run_one(
                        operation_id=operation_id,
                        token=token,
                        trace_parent=trace_parent,
                        may_chain=may_chain,
                        unsent=unsent,
                    )
                finally:
                    waiting[:] = [w for w in woken if not w.sent]
            for waiter in list(waiting):
                _run_one(
                    operation_id=waiter.operation_id,
                    token=waiter.token,
                    trace_parent=waiter.trace_parent,
                    on_unclaimed=partial(_send_woken, waiter),
                    on_claimed=waiting.clear,
                )
                waiting.clear()
            if chained is None:
                return
            token = chained
    except BaseException:
        # A failure between the chained step's commit and its claim (the database or the
        # process going away) must not leave it due with no message: only the sweeper's
        # overdue re-send would find it. If it was claimed after all, the message is stale
        # and its delivery exits (claims.claim_take). The same for a woken waiter not yet
        # claimed (once claimed, a failure leaves its claim to expire, as for any step).
        for pending in unsent:
            dispatch.send_after_commit(operation_id, pending, 0.0, trace_parent)
        for waiter in waiting:
            _send_woken(waiter)
        raise


def _send_woken(waiter: slots.Woken) -> None:
    """Send the step of a woken waiter this delivery did not claim (a stale token's message
    is harmless: its delivery exits)."""
    dispatch.send_after_commit(waiter.operation_id, waiter.token, 0.0, waiter.trace_parent)


def _run_one(
    *,
    operation_id: str,
    token: str,
    trace_parent: str,
    may_chain: bool = False,
    unsent: list[str] | None = None,
    on_unclaimed: Callable[[], None] | None = None,
    on_claimed: Callable[[], None] | None = None,
) -> str | None:
    """Run one step; returns the token of the operation's next step when this delivery is to
    run it too (no message was sent for it), else None. That token is also put in ``unsent``
    as soon as it is committed, for the caller to send should anything fail before it runs.
    ``on_unclaimed``/``on_claimed``: called when the claim was refused / taken."""
    now = db_now()
    claim = claims.claim_take(operation_id=operation_id, token=token, now=now)
    if claim is None:
        if on_unclaimed is not None:
            on_unclaimed()
        return None
    if on_claimed is not None:
        on_claimed()
    # The journal's last row, when this process journalled the step that sent this token.
    head = journal_head_take(operation_id, token)
    op = _OPERATION_READ.get(operation_id)
    if op.started_at is None:
        Operation.objects.filter(pk=op.pk).update(started_at=now, state=OperationState.RUNNING)
        op.started_at = now
    blocking = maintenance.operation_blocking(op)
    if blocking is not None:
        # Not failed, not counted, not aged (policy.age_of); the slots it kept for this step go
        # to whoever waits for them, since it submits nothing until the switch is off.
        updates = maintenance.pause_updates(op, blocking, now)
        _defer(op, claim, now, maintenance.recheck_seconds(), updates=updates, release_slots=True)
        return None
    maintenance.operation_unpause(operation=op, now=now)
    ceiling = policy.ceiling_for(op.kind)
    if policy.age_of(op, now) > ceiling.age:
        why = f"it is older than {_span(ceiling.age)}"
        _persist(op, claim, _gave_up(op, why), now, 0.0, head=head)
        return None
    breaker = _breaker(op)
    admission = circuit.ALLOWED
    if op.cluster is not None:
        admission = circuit.circuit_admit(
            cluster=op.cluster,
            breaker=breaker,
            now=now,
            others_running=lambda: _another_step_running(op, now),
        )
        if admission.probe:
            breaker = None  # the probe found the cluster answering and closed the breaker
    if not admission.allowed:
        wait = max(0.0, ((admission.until or now) - now).total_seconds())
        _defer(op, claim, now, wait, note=admission.note)
        return None
    if not leases.proxy_lease_take(operation=op):
        _defer(op, claim, now, LEASE_WAIT_SECONDS * random.uniform(0.75, 1.25))
        return None
    need = slots.need_of(op)
    held: list[slots.Held] | None = None
    seen: slots.Seen = {}
    if need.keys:
        # A step about to submit a task first takes a slot of its node (services.slots).
        held, seen = slots.slots_look(operation=op, keys=need.keys)
        waiting_for = slots.slots_take(operation=op, need=need, now=now, held=held, seen=seen)
        if waiting_for is not None:
            slots.slot_wait(operation=op, claim=claim, key=waiting_for, now=now)
            return None
    started = time.monotonic()
    with (
        claims.claim_renewed(operation_id=str(op.pk), claim=claim),
        tracing.step_span(op, trace_parent) as span,
        task_wakes.slot_holders_known(op.pk, seen) as view,
    ):
        outcome = _attempt(op)
        span.ended(outcome)
    seconds = time.monotonic() - started
    ended = db_now()
    chained = _persist(
        op, claim, outcome, ended, seconds, held=held, may_chain=may_chain, head=head
    )
    if chained is not None and unsent is not None:
        unsent.append(chained)
    _record_reachability(op, outcome, breaker, seconds, ended)
    _learn_duration(op, outcome)
    woken = _wake_ended_elsewhere(op, outcome, ended, view.wakeable)
    if woken and chained is not None and unsent is not None:
        # The woken steps are due now, as the chained one is, and they were waiting for the
        # slot this step freed: the chain takes its turn behind them through the broker.
        dispatch.send_after_commit(str(op.pk), chained, 0.0, op.trace_parent)
        unsent.remove(chained)
        return None
    return chained


# --- one attempt, retried in place -------------------------------------------------------------


def _attempt(op: Operation) -> Outcome:
    """Run the step; a transient failure runs it again at once from the same record, up to
    ``PROXYHUB_STEP_RETRIES_IN_PLACE`` times. An unreachable cluster is not retried here
    (each try may cost a timeout; the breaker and the backoff deal with it), except after a
    mutation whose answer was lost, which is settled by the read-back right away."""
    progress = dict(op.progress)
    retries = policy.retries_in_place()
    for attempt in range(retries + 1):
        outcome = _run_guarded(op, progress)
        error = outcome.result.error if outcome.result.status == "error" else None
        if error is None or error.kind != "transient" or attempt == retries:
            return outcome
        if error.unreachable and not error.reply_lost:
            return outcome
        log.info(
            "step retried in place",
            extra={"operation": str(op.pk), "step": outcome.result.step, "error": str(error)},
        )
        progress = dict(outcome.progress)
        if _contended(error):
            # Only contention is helped by waiting a moment; a lost reply is read back at
            # once, and a dropped connection or a 5xx is simply tried again.
            time.sleep(IN_PLACE_PAUSE_SECONDS * (attempt + 1) * random.uniform(0.5, 1.5))
    return outcome  # pragma: no cover - the loop always returns


def _contended(error: ClassifiedError) -> bool:
    """Proxmox said it is busy: a lock it could not take in time, or a worker it waited for."""
    text = error.message
    return "got timeout" in text or "got no worker upid" in text or "VM is locked" in text


def _run_guarded(op: Operation, progress: dict[str, Any]) -> Outcome:
    """The runner's outcome; a failure outside the provider becomes an error outcome."""
    stage = str(progress.get("stage", "step"))
    try:
        return run_step(op, progress, db_now())
    except (OperationalError, InterfaceError):
        raise  # the database, not the step: the task leaves the claim to expire
    except ClassifiedError as err:  # an expected failure outside the provider (placement, ...)
        log.info("step failed", extra={"operation": str(op.pk), "error": str(err)})
        return _error_outcome(progress, stage, err)
    except SoftTimeLimitExceeded:
        # The task's time limit, raised inside a request that got no answer (with
        # requestTimeoutSeconds 0 nothing else bounds it): the cluster's slowness, not a bug.
        log.warning("step stopped by its time limit", extra={"operation": str(op.pk)})
        slow = TransientError(
            f"step {stage} ran past its task time limit waiting for Proxmox",
            remediation="check that the cluster answers; a requestTimeoutSeconds above 0 "
            "ends such a request sooner",
            op=str(op.kind),
            # Not tried again in place (the hard limit follows), and counted by the breaker.
            unreachable=True,
        )
        return _error_outcome(progress, stage, slow)
    except Exception as err:  # a bug: it will not heal by itself, so it ends the operation
        log.exception("step failed unexpectedly", extra={"operation": str(op.pk)})
        error = PermanentError(
            f"unexpected failure in step {stage}: {type(err).__name__}",
            remediation="this is a proxyhub bug (the worker log has the traceback); "
            "retry the operation once it is fixed",
            op=str(op.kind),
        )
        return _error_outcome(progress, stage, error)


def _error_outcome(progress: dict[str, Any], stage: str, error: ClassifiedError) -> Outcome:
    """A step that ended in ``error`` without moving its record on."""
    return Outcome(StepResult("error", dict(progress), stage, error=error), dict(progress))


def _gave_up(op: Operation, why: str) -> Outcome:
    stage = str(op.progress.get("stage", "step"))
    detail = f"; last error: {op.last_error}" if op.last_error else ""
    error = PermanentError(
        f"gave up after {op.attempts} failed attempt(s): {why}{detail}",
        remediation="fix the cause, then retry the proxy (Provision or retry)",
        op=str(op.kind),
    )
    return _error_outcome(dict(op.progress), stage, error)


# --- deferral and the circuit breaker -------------------------------------------------------


def _breaker(op: Operation) -> CircuitBreaker | None:
    """The cluster's breaker as read with the operation (no row: it never failed)."""
    if op.cluster is None:
        return None
    try:
        return op.cluster.circuit
    except ObjectDoesNotExist:
        return None


def _another_step_running(op: Operation, now: datetime) -> bool:
    """Whether another delivery runs a step of the operation's cluster right now."""
    return (
        Operation.objects.filter(cluster=op.cluster, claim_expires_at__gte=now)
        .exclude(claim_token="")
        .exclude(pk=op.pk)
        .exists()
    )


def _defer(
    op: Operation,
    claim: str,
    now: datetime,
    delay: float,
    note: str = "",
    *,
    updates: dict[str, Any] | None = None,
    release_slots: bool = False,
) -> None:
    """Give the claim back and look again after ``delay``: nothing ran, nothing counts.
    ``updates``: more for the row (a maintenance pause's state and note); ``release_slots``:
    give back the task slots it kept, for a wait that may be long."""
    token = secrets.token_hex(8)
    row: dict[str, Any] = {
        "claim_token": "",
        "claim_expires_at": None,
        "dispatch_token": token,
        "dispatched_at": now,
        "next_step_at": now + timedelta(seconds=delay),
        "redispatches": 0,
    }
    if note:
        row["last_error"] = note
    row.update(updates or {})
    with transaction.atomic():
        if Operation.objects.filter(pk=op.pk, claim_token=claim).update(**row):
            if release_slots:
                slots.slots_keep(operation=op, keys=(), now=now)
            dispatch.send_after_commit(str(op.pk), token, delay, op.trace_parent)


def _record_reachability(
    op: Operation,
    outcome: Outcome,
    breaker: CircuitBreaker | None,
    seconds: float,
    now: datetime,
) -> None:
    """``now``: when the step's answer came back (the journal's time of the step)."""
    if op.cluster_id is None:
        return
    error = outcome.result.error if outcome.result.status == "error" else None
    if error is not None and error.unreachable:
        circuit.circuit_record_failure(
            cluster_id=op.cluster_id, error=str(error), now=now, seconds=seconds
        )
    elif error is None:
        circuit.circuit_record_success(cluster_id=op.cluster_id, breaker=breaker, now=now)


def _learn_duration(op: Operation, outcome: Outcome) -> None:
    """Keep what a finished wait saw, once the step is in the journal (after its commit: the
    estimate row's lock is never held with the proxy's)."""
    timing = durations.timing_of(outcome.result)
    if timing is None or op.cluster is None:
        return
    if timing.kind == BOOT:
        ceiling = address_budget()
    else:
        ceiling = provider_for(op.cluster).budgets.for_task(timing.kind)
    durations.durations_learn(cluster_id=op.cluster.pk, timing=timing, ceiling=ceiling)


def _wake_ended_elsewhere(
    op: Operation, outcome: Outcome, now: datetime, wakeable: set[str]
) -> int:
    """Wake the operations whose tasks this step's look saw end (``services.task_wakes``),
    after the step's commit (never under its proxy's lock); how many were woken. Only tasks
    whose own look was well away when the board asked (``wakeable``) are looked for."""
    ended = [upid for upid in outcome.result.details.get(ENDED_ELSEWHERE, ()) if upid in wakeable]
    if not ended or op.cluster_id is None:
        return 0
    return task_wakes.tasks_ended_wake(cluster_id=op.cluster_id, upids=ended, now=now)


# --- the journal -------------------------------------------------------------------------


def _persist(
    op: Operation,
    claim: str,
    outcome: Outcome,
    now: datetime,
    seconds: float,
    *,
    held: list[slots.Held] | None = None,
    may_chain: bool = False,
    head: OperationStep | None = None,
) -> str | None:
    """Journal the step and apply what it changed, in one transaction under the proxy's row
    lock; ``held``: the slots the step found held (``slots.slots_take``), None to read them;
    ``head``: the journal's last row as this process kept it (``journal_head_take``).
    Returns the next step's token when the caller runs it itself (``may_chain``, and the next
    step is due at once: ``operation_run_step``); then no message is sent for it."""
    result = outcome.result
    token = ""
    delay = 0.0
    chain = False
    with transaction.atomic():
        if op.proxy_id is not None:
            # Lock order: the proxy row first, then its operations, as the intent services
            # do (proxy_request_delete and friends); the other order deadlocks on PostgreSQL.
            list(Proxy.objects.select_for_update().filter(pk=op.proxy_id).values_list("pk"))
        last_row = journal_step(op, outcome, now, head=head)
        updates: dict[str, Any] = {
            "progress": outcome.progress,
            "claim_token": "",
            "claim_expires_at": None,
        }
        proxy_updates = dict(outcome.proxy)
        if result.status == "error":
            error = result.error or classify(str(op.kind), RuntimeError("unknown failure"))
            updates.update(last_error=str(error), error_class=_error_class(error))
            if not _on_error(op, error, now, updates, proxy_updates):
                delay = policy.backoff(updates["attempts"])
        elif outcome.finished:
            updates.update(
                state=OperationState.SUCCEEDED,
                finished_at=now,
                next_step_at=None,
                attempts=0,
                last_error="",
                error_class="",
            )
        else:
            delay = result.delay if result.status == "wait" else 0.0
            updates.update(
                attempts=0,
                state=OperationState.WAITING if result.status == "wait" else OperationState.RUNNING,
            )
        finished = updates["state"] in (OperationState.SUCCEEDED, OperationState.FAILED)
        if not finished:
            token = secrets.token_hex(8)
            updates.update(
                next_step_at=now + timedelta(seconds=delay),
                dispatch_token=token,
                dispatched_at=now,
                redispatches=0,
            )
        # Applied only while the claim is still ours and the operation unfinished: the row
        # count says whether it was superseded while the step ran (decided under the proxy's
        # lock, on the operation's row itself).
        if not Operation.objects.filter(
            pk=op.pk, claim_token=claim, state__in=ACTIVE_STATES
        ).update(**updates):
            # Superseded: keep the receipt journalled above, apply nothing else.
            slots.slots_keep(operation=op, keys=(), now=now, held=held)
            Operation.objects.filter(pk=op.pk, claim_token=claim).update(
                claim_token="", claim_expires_at=None
            )
            return None
        # Slots it no longer needs go to the oldest waiters, whose steps are sent on commit.
        kept = slots.slots_keep(
            operation=op,
            keys=() if finished else _slots_to_keep(op, outcome),
            now=now,
            held=held,
        )
        if outcome.template is not None and updates["state"] == OperationState.SUCCEEDED:
            # Issue 14: the catalogue records the template in the commit that ends its build.
            op.progress = outcome.progress
            template_builds.template_register(op=op, details=outcome.template)
        if op.proxy_id and proxy_updates:
            proxy_updates["observed_at"] = now
            Proxy.objects.filter(pk=op.proxy_id).update(**proxy_updates)
        if finished and op.proxy_id is not None:
            leases.proxy_lease_release(operation=op)
            Proxy.objects.filter(pk=op.proxy_id).update(generation=F("generation") + 1)
            if outcome.delete_proxy and updates["state"] == OperationState.SUCCEEDED:
                Proxy.objects.filter(pk=op.proxy_id, desired_state=DesiredState.DELETED).delete()
        queued = None
        if token and delay == 0.0 and result.status != "error":
            # The next step takes its slots here; one that would only find its node full waits
            # from here, with no delivery of its own (services.slots.slots_queue), and is not
            # run in this delivery either: the release that frees a slot runs it.
            queued = slots.slots_queue(
                operation=op, progress=outcome.progress, token=token, now=now, held=kept
            )
        # Cleanup the runner says can wait (Outcome.next_can_wait) is neither chained nor sent
        # ahead of work under way; once it began, its steps are work under way like any other.
        chain = (
            bool(token)
            and may_chain
            and delay == 0.0
            and queued is None
            and not outcome.next_can_wait
        )
        if token and queued is None:
            # The next step starts from the row just written (journal.py). Not for a step
            # queued for a slot: its wait is journalled when the slot is handed over. Kept
            # before the commit, so a chained step finds it: only a delivery that claims the
            # token takes it, and the token is there to claim only once this commits.
            journal_head_keep(str(op.pk), token, last_row)
    if chain:
        return token
    if queued is not None:
        slots.slots_queue_look(operation=op, key=queued, token=token, now=now)
    elif token:
        priority = (
            dispatch.PRIORITY_CAN_WAIT if outcome.next_can_wait else dispatch.PRIORITY_UNDER_WAY
        )
        dispatch.send_after_commit(str(op.pk), token, delay, op.trace_parent, priority)
    elif finished:
        state = str(updates["state"])
        transaction.on_commit(lambda: tracing.operation_span_end(op, state, now))
    return None


def _slots_to_keep(op: Operation, outcome: Outcome) -> tuple[str, ...]:
    """The task slots the operation keeps after this step: those its next step needs, unless
    it failed with no task in flight (a backoff holds no slot); none once it ends."""
    need = slots.need_of(op, outcome.progress)
    error = outcome.result.error if outcome.result.status == "error" else None
    if error is None or need.in_flight or error.reply_lost:
        return need.keys
    return ()


def _on_error(
    op: Operation,
    error: ClassifiedError,
    now: datetime,
    updates: dict[str, Any],
    proxy_updates: dict[str, Any],
) -> bool:
    """Fill ``updates`` for a failed step: end the operation (returns True), or count the
    attempt (returns False; the caller then waits out the backoff)."""
    power = op.kind in IN_PLACE_KINDS

    def end(message: str) -> None:
        updates.update(
            state=OperationState.FAILED, finished_at=now, next_step_at=None, last_error=message
        )
        if not op.proxy_id:
            return
        proxy_updates.update(last_error=message, last_error_class=_error_class(error))
        if not power or isinstance(error, IdentityMismatch):
            # A create, replace or delete that cannot go on latches the proxy Failed until an
            # operator retries; a refused power action leaves the VM as it was. A VM that is
            # not the one recorded (seed 001) latches it whatever the action: reconcile then
            # leaves it alone until an operator decides.
            proxy_updates["phase"] = Phase.FAILED

    if error.kind == "not_found" and power:
        # Seed 001 and issue 10: a power action on a VM that no longer exists cannot heal. It
        # ends now, and the proxy is marked as having no VM, so reconcile re-creates it when
        # it should exist, like any proxy whose VM is missing. desired_power stays as asked.
        end(
            f"the VM no longer exists ({error.message}); the proxy is re-created when it should run"
        )
        if op.proxy_id:
            proxy_updates.update(
                provider_id="",
                vmid=None,
                ip=None,
                node="",
                phase=Phase.PENDING,
                last_error_class=ErrorClass.NOT_FOUND,
                smbios_uuid="",
                vmgenid="",
            )
        return True
    if error.kind == "permanent":
        end(str(error))
        return True
    attempts = op.attempts + 1
    updates.update(attempts=attempts, faults=F("faults") + 1)
    ceiling = policy.ceiling_for(op.kind)
    age = policy.age_of(op, now)
    if attempts >= ceiling.attempts or age > ceiling.age:
        end(
            f"gave up after {attempts} failed attempt(s) over {_span(age)}: {error}. "
            "Fix the cause, then retry the proxy (Provision or retry)"
        )
        return True
    # A mutation whose answer was lost is unknown until the next step's read-back settles it.
    updates["state"] = OperationState.UNKNOWN if error.reply_lost else OperationState.RUNNING
    if op.proxy_id:
        proxy_updates.update(last_error=str(error), last_error_class=_error_class(error))
    return False


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _error_class(error: ClassifiedError) -> str:
    if isinstance(error, IdentityMismatch):
        return ErrorClass.IDENTITY
    return {
        "permanent": ErrorClass.PERMANENT,
        "not_found": ErrorClass.NOT_FOUND,
    }.get(error.kind, ErrorClass.TRANSIENT)
