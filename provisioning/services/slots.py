"""Admission control: at most a cap of Proxmox tasks in flight per node and per storage (issue 12).

A node runs a few tasks at once and queues the rest; what proxyhub submits beyond that only
waits inside Proxmox, where nobody can see or order it. So before a step submits a task it takes
a slot of the task's node (``PROXYHUB_NODE_TASK_LIMIT``, default 3) and, when a storage limit is
set, of the storage the task writes (``PROXYHUB_STORAGE_TASK_LIMIT``, 0: none). It keeps them
while the task runs (the ``*_wait`` stages that poll it) and gives them back in the transaction
that journals the step after the task ended, or when the step fails with nothing in flight.

Slots are rows (``models.TaskSlot``), taken by a conditional UPDATE of one free row and checking
the row count (STYLE.md), which PostgreSQL re-checks on the row it waited for and SQLite's single
writer serialises: two workers never both take the last slot. A step that finds none records
itself as a ``SlotWaiter`` (the operator sees "waiting for a task slot") and gives its claim
back without a message. Whoever frees a slot hands it straight to the oldest waiter of that key
and sends that waiter's step at once, in the same transaction (or, for the first waiter a step's
delivery wakes, runs it in that delivery: ``collecting_woken``): a queued step starts the moment
a slot frees, not at the next poll, and no newcomer overtakes it.

The step before a submission does the same from its own commit when its next step goes through
the broker (``slots_queue``): it takes the slot the next step needs, or records the waiter there,
and looks once more after the commit. A fleet's creates all look up before any clones, so
otherwise every clone past the template node's cap spent a delivery finding no slot.

A worker that dies holding a slot cannot leak it: the sweeper (``slots_recover``) frees every
slot whose holder finished, or whose holder has no live claim and no task to wait for, and hands
free slots to waiters whose wake-up was lost.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Case, IntegerField, Q, Value, When

from provisioning.models import Operation, OperationStep, SlotWaiter, TaskSlot
from provisioning.models.choices import ACTIVE_STATES, OperationKind, OperationState, StepState

from . import dispatch
from .claims import claim_live
from .seeds import SEED_RELEASE_STAGE

log = logging.getLogger("proxyhub.operations")

# A waiter whose wake-up message is lost is sent again by the sweeper once this has passed
# (plus its grace): the wake-up on release is the normal path, this only bounds a lost one.
WAIT_FALLBACK = timedelta(seconds=60)
# The operator's note on a waiting operation starts with this.
WAIT_NOTE = "waiting for a task slot on "

# Stages of each step machine that submit a task, and those that poll one already submitted.
_SUBMIT = {
    "clone",
    "upload",
    "resize",
    "start",
    "stop",
    "destroy",
    "submit",
    "remove",
    "reboot",
    # template builds (issue 14)
    "download",
    "create",
    "convert",
}
_POLL = {
    "download_wait",
    "create_wait",
    "convert_wait",
    "clone_wait",
    "upload_wait",
    "resize_wait",
    "start_wait",
    "stop_wait",
    "destroy_wait",
    "remove_wait",
    "reboot_wait",
}
# Stages that submit no task but sit between two tasks of the same node: a create's configure
# (a synchronous config write between its upload and its resize or start). The slot is kept
# through them, as through a poll; giving it back sent the create to the back of the node's
# queue for its next task, a second wait and a delivery that found no slot per create (issue
# 12's makespan). A record cold at such a stage takes a slot before it writes, as a submission.
_BETWEEN = {"configure"}
_POWER_KINDS = (OperationKind.START, OperationKind.SHUTDOWN, OperationKind.REBOOT)


def node_limit() -> int:
    return max(0, int(getattr(settings, "PROXYHUB_NODE_TASK_LIMIT", 3)))


def storage_limit() -> int:
    return max(0, int(getattr(settings, "PROXYHUB_STORAGE_TASK_LIMIT", 0)))


@dataclass(frozen=True)
class Need:
    """The slots the next step of an operation needs; ``in_flight``: its task was submitted
    already (a poll), so it runs whether or not a slot is free."""

    keys: tuple[str, ...] = ()
    in_flight: bool = False


NONE = Need()


def _record(op_kind: str, progress: dict[str, Any]) -> dict[str, Any] | None:
    """The step machine's record the next step runs from, or None for a stage with no task."""
    if progress.get("stage") == "address":
        return None
    if progress.get("stage") == SEED_RELEASE_STAGE:
        # The seed's removal (an imgdel task) runs on the node the create put the seed on.
        release = dict(progress.get("release") or {})
        return dict(release, node=(progress.get("create") or {}).get("node"))
    if op_kind == OperationKind.DELETE:
        return progress.get("delete")
    if op_kind == OperationKind.REPLACE and progress.get("phase", "delete") == "delete":
        return progress.get("delete")
    if op_kind in _POWER_KINDS:
        return progress.get("power")
    if op_kind == OperationKind.REPAIR:
        return progress.get("repair")
    if op_kind == OperationKind.TEMPLATE_BUILD:
        # Every task of a build runs on the build's node; its record names it only later.
        build = progress.get("build") or {}
        return dict(progress.get("record") or {"stage": "lookup"}, node=build.get("node"))
    return progress.get("create")


def step_record(op_kind: str, progress: dict[str, Any]) -> dict[str, Any] | None:
    """The record the next step runs from (None: a stage with no task); maintenance reads its
    node to know where the step writes."""
    return _record(op_kind, progress)


def slot_need(
    op_kind: str, progress: dict[str, Any], *, storage: str = "", iso_storage: str = ""
) -> Need:
    """Which slots the step that ``progress`` leads to needs (``storage``: the clone target,
    ``iso_storage``: where seeds go; used only with a storage limit)."""
    record = _record(op_kind, progress)
    if not record:
        return NONE
    stage = str(record.get("stage") or "")
    base = stage.removesuffix("_wait")
    if (
        stage not in _SUBMIT
        and stage not in _POLL
        and stage not in _BETWEEN
        and not (stage == "wait" and "upid" in record)
    ):
        return NONE
    if stage == "wait":
        base = "submit"
    node = record.get("template_node") if base == "clone" else record.get("node")
    if not node:
        return NONE
    keys = [node_key(str(node))]
    if storage_limit():
        written = {"clone": storage, "resize": storage, "upload": iso_storage}.get(base, "")
        if written:
            keys.append(f"storage:{written}")
    in_flight = stage in _POLL or stage == "wait"
    if in_flight and not record.get("upid"):
        return NONE  # nothing was submitted after all (a record moved back): nothing to hold
    return Need(tuple(keys), in_flight)


def need_of(op: Operation, progress: dict[str, Any] | None = None) -> Need:
    cluster = op.cluster
    if cluster is None:
        return NONE
    return slot_need(
        str(op.kind),
        op.progress if progress is None else progress,
        storage=cluster.storage,
        iso_storage=cluster.iso_storage,
    )


def node_key(node: str) -> str:
    """The slot key of a node's tasks."""
    return f"node:{node}"


def _limit(key: str) -> int:
    return node_limit() if key.startswith("node:") else storage_limit()


# --- taking ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """A slot row an operation holds."""

    pk: int
    cluster_id: Any
    key: str
    seq: int


# A key's slot rows as one read saw them: (pk, seq, holding operation or None), by key.
Seen = dict[str, list[tuple[int, int, Any]]]


def slots_held(*, operation: Operation) -> list[Held]:
    """Every slot ``operation`` holds now (one query): a step reads them once, takes what it
    lacks (``slots_take``) and gives back what it no longer needs (``slots_keep``) from them."""
    rows = TaskSlot.objects.filter(operation_id=operation.pk).values_list(
        "pk", "cluster_id", "key", "seq"
    )
    return [Held(*row) for row in rows]


def slots_look(*, operation: Operation, keys: tuple[str, ...]) -> tuple[list[Held], Seen]:
    """``slots_held`` and the rows of ``keys`` in the operation's cluster, from one query (issue
    12: a step about to submit read its own slots, then the key's): the held slots, and the
    key's rows for ``slots_take``'s first look at them (its look after recording a waiter
    reads them again)."""
    rows = TaskSlot.objects.filter(
        Q(operation_id=operation.pk) | Q(cluster_id=operation.cluster_id, key__in=keys)
    ).values_list("pk", "cluster_id", "key", "seq", "operation_id")
    held: list[Held] = []
    seen: Seen = {key: [] for key in keys}
    for pk, cluster_id, key, seq, holder in rows:
        if holder == operation.pk:
            held.append(Held(pk, cluster_id, key, seq))
        if cluster_id == operation.cluster_id and key in seen:
            seen[key].append((pk, seq, holder))
    return held, seen


def _take_one(
    op: Operation, key: str, now: datetime, seen: list[tuple[int, int, Any]] | None = None
) -> Held | bool:
    """Take a free slot of ``key`` for ``op``: the slot taken, True when the key has no limit
    (0), False when none is free.

    One read of the key's rows tells both which look free and whether any are missing (issue
    12: a key with every slot taken was read twice, once for free rows and once for all)."""
    limit = _limit(key)
    if limit == 0:
        return True
    for attempt in range(2):
        if attempt == 0 and seen is not None:
            rows = [row for row in seen if row[1] < limit]
        else:
            rows = _slot_rows(op.cluster_id, key, limit)
        for pk, seq, holder in rows:
            # The row count decides: PostgreSQL re-checks "still free" on the row it waited
            # for, SQLite runs one writer at a time.
            if holder is None and (
                TaskSlot.objects.filter(pk=pk, operation__isnull=True).update(
                    operation_id=op.pk, taken_at=now
                )
            ):
                return Held(pk, op.cluster_id, key, seq)
        if attempt == 0 and not _create_missing(op.cluster_id, key, limit, rows):
            return False
    return False


def _slot_rows(cluster_id: Any, key: str, limit: int) -> list[tuple[int, int, Any]]:
    """The key's slots (pk, seq, holder) as they were just now (another taker may take one
    meanwhile)."""
    return list(
        TaskSlot.objects.filter(cluster_id=cluster_id, key=key, seq__lt=limit).values_list(
            "pk", "seq", "operation_id"
        )
    )


def _ensure_rows(cluster_id: Any, key: str, limit: int) -> bool:
    """Create the key's missing slot rows; True when any were missing."""
    return _create_missing(cluster_id, key, limit, _slot_rows(cluster_id, key, limit))


def _create_missing(
    cluster_id: Any, key: str, limit: int, rows: list[tuple[int, int, Any]]
) -> bool:
    """Create the key's slot rows missing from ``rows``; True when any were missing."""
    have = {seq for _, seq, _ in rows}
    missing = [s for s in range(limit) if s not in have]
    if missing:
        TaskSlot.objects.bulk_create(
            [TaskSlot(cluster_id=cluster_id, key=key, seq=s) for s in missing],
            ignore_conflicts=True,
        )
    return bool(missing)


def slots_take(
    *,
    operation: Operation,
    need: Need,
    now: datetime,
    held: list[Held] | None = None,
    seen: Seen | None = None,
) -> str | None:
    """Hold every slot ``need`` names; returns None when held, else the key it waits for.
    ``held``: the operation's slots as ``slots_held`` read them, extended with those taken here
    (read when not given); ``seen``: the needed keys' rows as ``slots_look`` read them with
    ``held``, for the first look at each (read when not given).

    A waiting operation is recorded as a waiter in a transaction of its own before it looks one
    last time: whoever frees a slot after that look sees the waiter and hands it the slot, and
    whoever freed one before it left it free for that look. No wake-up falls between the two.
    """
    if held is None:
        held = slots_held(operation=operation)
    waited = False
    for key in need.keys:
        if any(h.key == key for h in held):
            continue
        with transaction.atomic():
            taken = _take_one(operation, key, now, (seen or {}).get(key))
        if taken:
            if isinstance(taken, Held):
                held.append(taken)
            continue
        if need.in_flight:
            continue  # the task runs anyway: poll it, and count it once a slot frees
        waited = True
        with transaction.atomic():
            _record_waiter(operation, key, now)
        with transaction.atomic():
            taken = _take_one(operation, key, now)
            if taken:
                taken = _unless_handed_one(operation, key, taken, now)
        if not taken:
            return key
        if isinstance(taken, Held):
            held.append(taken)
    if waited or (not need.in_flight and operation.state == OperationState.WAITING):
        # Only an operation that waited has a waiter row or an open wait in its journal:
        # ``slot_wait`` left it ``waiting`` (a release that hands it the slot deletes the row
        # and leaves the state). A poll never records a waiter, and a step that ran since
        # closed both; the journal closes a wait row left open by any other path when it
        # records the next step.
        SlotWaiter.objects.filter(operation_id=operation.pk).delete()
        _journal_wait_close(operation, now)
    return None


def _record_waiter(operation: Operation, key: str, now: datetime) -> None:
    """The operation's waiter row for ``key``, if missing (a row already there keeps its place
    in the queue: get_or_create's read, savepoint and insert in one statement, issue 12)."""
    cluster_id: Any = operation.cluster_id  # a step with a slot key has a cluster
    SlotWaiter.objects.bulk_create(
        [SlotWaiter(operation_id=operation.pk, cluster_id=cluster_id, key=key, since=now)],
        ignore_conflicts=True,
    )
    SlotWaiter.objects.filter(operation_id=operation.pk).exclude(key=key).update(key=key, since=now)


def _unless_handed_one(op: Operation, key: str, taken: Held | bool, now: datetime) -> Held | bool:
    """After the last look took a slot: remove the waiter row, unless a release got to it
    first (deleting the row is how a release claims its waiter, ``_hand_off``). Then that
    release handed a slot over too (on PostgreSQL the delete waits for its commit), and the
    one taken here goes back: one task holds one slot of its node."""
    if SlotWaiter.objects.filter(operation_id=op.pk, key=key).delete()[0]:
        return taken
    mine = TaskSlot.objects.filter(operation_id=op.pk, key=key)
    if isinstance(taken, Held):
        mine = mine.exclude(pk=taken.pk)
    handed = mine.values_list("pk", "cluster_id", "key", "seq").first()
    if handed is None:
        return taken  # the release found the waiter no longer active, or the key unlimited
    if isinstance(taken, Held):
        _release(taken.pk, taken.cluster_id, taken.key, taken.seq, op.pk, now)
    return Held(*handed)


def slot_wait(*, operation: Operation, claim: str, key: str, now: datetime) -> None:
    """Give the claim back while the operation waits for a slot of ``key``: no message is
    sent (the release that frees a slot sends one); the sweeper sends it after the fallback.

    A release may hand it the slot after its last look and before this: the wake-up's message
    then met this delivery's claim and was dropped (``claims.claim_take``), so the step's
    message is sent again here once the claim is back."""
    waiting = _waiting(operation, key, now)
    with transaction.atomic():
        _journal_wait_open(operation, key, now)
        # Not when a release already woke it (a new dispatch token): that message runs it.
        waits = Operation.objects.filter(
            pk=operation.pk, claim_token=claim, dispatch_token=""
        ).update(
            claim_token="",
            claim_expires_at=None,
            dispatch_token=secrets.token_hex(8),
            dispatched_at=now,
            redispatches=0,
            **waiting,
        )
        if not waits and Operation.objects.filter(pk=operation.pk, claim_token=claim).update(
            claim_token="", claim_expires_at=None
        ):
            _send_again_once_free(operation.pk)
    log.info("step waits for a task slot", extra={"operation": str(operation.pk), "key": key})


def _waiting(operation: Operation, key: str, now: datetime) -> dict[str, Any]:
    """The operation's fields while it waits for a slot of ``key``: waiting, its message left
    to the release that hands it one (or to the sweeper after the fallback), and what the
    operator reads."""
    held = TaskSlot.objects.filter(cluster=operation.cluster, key=key).exclude(
        operation__isnull=True
    )
    return {
        "next_step_at": now + WAIT_FALLBACK,
        "state": OperationState.WAITING,
        "last_error": f"{WAIT_NOTE}{key.replace(':', ' ', 1)} "
        f"({held.count()} of {_limit(key)} in use)",
    }


def _send_again_once_free(operation_id: Any) -> None:
    """Send the step a wake-up gave a token to while this delivery held its claim."""
    row = (
        Operation.objects.filter(pk=operation_id, state__in=ACTIVE_STATES)
        .exclude(dispatch_token="")
        .values_list("dispatch_token", "trace_parent")
        .first()
    )
    if row is not None:
        log.info(
            "slot handed over while the step gave up its claim: sent again",
            extra={"operation": str(operation_id)},
        )
        dispatch.send_after_commit(str(operation_id), row[0], 0.0, row[1])


# --- the journal: a wait is a step the operator sees --------------------------------------------

WAIT_STEP = "slot_wait"


def _journal_wait_open(operation: Operation, key: str, now: datetime) -> None:
    """Show the wait as a step of its own, ``waiting``, from when it began (the step before
    it, which ended by leading here, is closed as the journal closes any finished stage)."""
    last = OperationStep.objects.filter(operation_id=operation.pk).order_by("-seq").first()
    if last is not None and last.finished_at is None:
        if last.name == WAIT_STEP:
            return
        OperationStep.objects.filter(pk=last.pk).update(
            finished_at=now,
            state=StepState.SUCCEEDED if last.state in _OPEN_STATES else last.state,
        )
    OperationStep.objects.create(
        operation_id=operation.pk,
        seq=(last.seq + 1) if last else 1,
        name=WAIT_STEP,
        state=StepState.WAITING,
        message=f"{WAIT_NOTE}{key.replace(':', ' ', 1)}",
        started_at=now,
    )


def _journal_wait_close(operation: Operation, now: datetime) -> None:
    OperationStep.objects.filter(
        operation_id=operation.pk, name=WAIT_STEP, finished_at__isnull=True
    ).update(finished_at=now, state=StepState.SUCCEEDED)


_OPEN_STATES = (StepState.RUNNING, StepState.WAITING, StepState.RETRYING, StepState.UNKNOWN)


# --- giving back -------------------------------------------------------------------------------


def slots_keep(
    *,
    operation: Operation,
    keys: tuple[str, ...],
    now: datetime,
    held: list[Held] | None = None,
) -> list[Held]:
    """Give back every slot ``operation`` holds except ``keys``, each to the oldest waiter of
    its key; returns the slots it keeps. Call inside the transaction that journals the step.
    ``held``: what the step's ``slots_take`` found held (read here when not given). It stays
    exact while the step runs: only the holder gives its slots back, a release hands slots
    only to waiters, and the sweeper frees only slots whose holder has no live claim (a
    release of a slot no longer ours changes no row)."""
    if held is None:
        held = slots_held(operation=operation)
    for slot in held:
        if slot.key not in keys:
            _release(slot.pk, slot.cluster_id, slot.key, slot.seq, operation.pk, now)
    return [slot for slot in held if slot.key in keys]


# --- queued by the step before (issue 12) -------------------------------------------------------


def slots_queue(
    *,
    operation: Operation,
    progress: dict[str, Any],
    token: str,
    now: datetime,
    held: list[Held],
) -> str | None:
    """In the transaction that journals a step whose next step (``progress``) is due now and
    goes through the broker with ``token``: take the slots that next step will need, or, where
    none is free, record it as that key's waiter now, as its own delivery would (``slots_take``
    then ``slot_wait``), but without that delivery. A fleet's creates all look up before any
    clones, so every clone past the template node's cap was a delivery that found no slot
    (issue 12's makespan: 1.5 per create); now a clone's first delivery is the one that runs
    it. ``held``: the slots the operation keeps (``slots_keep``).

    Returns the key it waits for: then no message is to be sent, and ``slots_queue_look``
    must run after the commit. None: the step is sent as usual (it holds what it needs, or
    needs none, or polls a task that runs anyway)."""
    need = need_of(operation, progress)
    if not need.keys or need.in_flight:
        return None
    have = {slot.key for slot in held}
    for key in need.keys:
        if key in have or _take_one(operation, key, now):
            continue
        _record_waiter(operation, key, now)
        _journal_wait_open(operation, key, now)
        Operation.objects.filter(pk=operation.pk, dispatch_token=token).update(
            **_waiting(operation, key, now)
        )
        log.info(
            "step queued for a task slot by the step before",
            extra={"operation": str(operation.pk), "key": key},
        )
        return key
    return None


def slots_queue_look(*, operation: Operation, key: str, token: str, now: datetime) -> None:
    """After the commit of ``slots_queue``'s waiter: look once more, as ``slots_take`` does
    after recording one. Until that commit no release could see the waiter, so a slot freed
    meanwhile stayed free: take it and send the step now, not at the fallback a minute later.
    A release that did see the waiter handed it a slot and sent it; the one taken here then
    goes back (one task holds one slot of its node: ``_unless_handed_one``)."""
    with transaction.atomic():
        taken = _take_one(operation, key, now)
        if not taken or _unless_handed_one(operation, key, taken, now) is not taken:
            return
        _journal_wait_close(operation, now)
        if Operation.objects.filter(
            pk=operation.pk, dispatch_token=token, claim_token="", state__in=ACTIVE_STATES
        ).update(next_step_at=now, state=OperationState.RUNNING, last_error=""):
            dispatch.send_after_commit(str(operation.pk), token, 0.0, operation.trace_parent)
        elif isinstance(taken, Held):
            # Superseded since its commit (its new step holds what it needs): not this slot.
            _release(taken.pk, taken.cluster_id, key, taken.seq, operation.pk, now)


def _release(pk: int, cluster_id: Any, key: str, seq: int, holder: Any, now: datetime) -> None:
    if not TaskSlot.objects.filter(pk=pk, operation_id=holder).update(
        operation=None, taken_at=None
    ):
        return
    if seq < _limit(key) or _limit(key) == 0:
        _hand_off(pk, cluster_id, key, now)


# A create's seed removal runs after the proxy is Running, and nobody waits for it: it takes a
# slot only when no other step waits for one. In issue 12's makespan the template's node spent
# 13 % of its task time on them, ahead of clones of creates that had queued a moment later.
_AFTER_THE_REST = Case(
    When(operation__progress__stage=SEED_RELEASE_STAGE, then=Value(1)),
    default=Value(0),
    output_field=IntegerField(),
)


def _hand_off(pk: int, cluster_id: Any, key: str, now: datetime) -> bool:
    """Give the free slot ``pk`` to the oldest waiter of ``key`` and send its step now; a
    waiting seed removal only when no other step waits (``_AFTER_THE_REST``)."""
    waiters = (
        SlotWaiter.objects.filter(cluster_id=cluster_id, key=key)
        .annotate(after_the_rest=_AFTER_THE_REST)
        .order_by("after_the_rest", "since", "pk")
    )
    for waiter_id, state in waiters.values_list("operation_id", "operation__state")[:50]:
        # Deleting the row is the waiter's claim: one releaser wins it.
        if not SlotWaiter.objects.filter(operation_id=waiter_id, key=key).delete()[0]:
            continue
        if state not in ACTIVE_STATES:
            continue
        TaskSlot.objects.filter(pk=pk, operation__isnull=True).update(
            operation_id=waiter_id, taken_at=now
        )
        _wake(waiter_id, now)
        return True
    return False


def _wake(operation_id: Any, now: datetime) -> None:
    token = secrets.token_hex(8)
    op = Operation.objects.filter(pk=operation_id).values("trace_parent", "last_error").first()
    if op is None:
        return
    updates: dict[str, Any] = {
        "dispatch_token": token,
        "dispatched_at": now,
        "next_step_at": now,
        "redispatches": 0,
    }
    if str(op["last_error"]).startswith(WAIT_NOTE):
        updates["last_error"] = ""
    if Operation.objects.filter(pk=operation_id, state__in=ACTIVE_STATES).update(**updates):
        woken = _woken.get()
        # The first waiter a collecting delivery wakes is run by that delivery (driver), which
        # sends its message only if it cannot: a message sent now would only be delivered
        # after that run, to find the step taken (issue 12). Every other waiter is sent now.
        runs_here = woken is not None and all(w.sent for w in woken)
        if not runs_here:
            dispatch.send_after_commit(str(operation_id), token, 0.0, op["trace_parent"])
        if woken is not None:
            woken.append(Woken(str(operation_id), token, str(op["trace_parent"]), not runs_here))


@dataclass(frozen=True)
class Woken:
    """A waiter handed a slot: its step's token; ``sent``: whether its message went out (False
    for the one the collecting delivery is to run itself, ``collecting_woken``)."""

    operation_id: str
    token: str
    trace_parent: str
    sent: bool = True


# Filled while a delivery collects the waiters its step woke (``collecting_woken``).
_woken: ContextVar[list[Woken] | None] = ContextVar("proxyhub_slots_woken", default=None)


@contextmanager
def collecting_woken() -> Iterator[list[Woken]]:
    """Within the block, every waiter handed a slot is appended to the list it yields, so the
    delivery that freed the slot can run that step itself (``driver``) instead of leaving it
    a queue's round trip behind every other message. The first one gets no message: whoever
    collects must run it, or send it (``dispatch.send_after_commit``) when it cannot."""
    found: list[Woken] = []
    reset = _woken.set(found)
    try:
        yield found
    finally:
        _woken.reset(reset)


# --- the sweeper ---------------------------------------------------------------------------------


def slots_recover(*, now: datetime) -> int:
    """Free the slots a lost worker left behind and wake waiters a lost message stranded;
    returns how many slots were freed or handed on."""
    freed = 0
    held = TaskSlot.objects.exclude(operation__isnull=True).select_related("operation")
    for slot in list(held[:1000]):
        op = slot.operation
        assert op is not None
        if claim_live(op.claim_token, op.claim_expires_at, now):
            continue  # a delivery runs its step: it decides what it keeps
        if op.state in ACTIVE_STATES and slot.key in need_of(op).keys:
            continue  # its task runs, or its step is about to submit one
        with transaction.atomic():
            _release(slot.pk, slot.cluster_id, slot.key, slot.seq, op.pk, now)
        freed += 1
    SlotWaiter.objects.exclude(operation__state__in=ACTIVE_STATES).delete()
    # A free slot with someone waiting for it: a wake-up was lost (or a limit was raised).
    for cluster_id, key in set(SlotWaiter.objects.values_list("cluster_id", "key")):
        limit = _limit(key)
        if limit:
            _ensure_rows(cluster_id, key, limit)
        free = TaskSlot.objects.filter(
            Q(cluster_id=cluster_id, key=key, operation__isnull=True)
            & (Q(seq__lt=limit) if limit else Q())
        ).values_list("pk", flat=True)
        for pk in list(free):
            with transaction.atomic():
                if not _hand_off(pk, cluster_id, key, now):
                    break
            freed += 1
    if freed:
        log.info("task slots recovered", extra={"count": freed})
    return freed


def slots_in_use(*, cluster_id: Any) -> dict[str, int]:
    """Held slots per key (for the operator and the benchmark)."""
    out: dict[str, int] = {}
    for key in TaskSlot.objects.filter(cluster_id=cluster_id, operation__isnull=False).values_list(
        "key", flat=True
    ):
        out[key] = out.get(key, 0) + 1
    return out
