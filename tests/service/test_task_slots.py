"""Admission control (issue 12, services/slots.py): at most the cap of Proxmox tasks in flight per
node, a freed slot wakes the oldest waiter at once, a dead holder's slot comes back, and
placement spreads creates that arrive one at a time. Counts of tasks come from the simulator's
own task records, never from proxyhub's tables. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy, SlotWaiter, TaskSlot
from provisioning.models.choices import OperationState, Phase
from provisioning.services import claims, driver, operations, placement, slots
from provisioning.services.clock import db_now
from provisioning.services.placement import NodeHealthView
from provisioning.services.seeds import SEED_RELEASE_STAGE
from provisioning.services.sweeper import operations_sweep
from pvesim.profiles import get_profile

pytestmark = pytest.mark.django_db

CAP = 3
KEY = "node:pve1"


def _creates(pump: Pump, sim: Sim, count: int, prefix: str = "p", zone: str = "pve1") -> None:
    specs = [proxy_spec(sim, f"{prefix}{i}", zone=zone) for i in range(count)]
    pump.call(operations.proxies_create, specs=specs)


def _ops(count: int) -> list[Operation]:
    return list(Operation.objects.select_related("cluster").order_by("created_at", "pk")[:count])


def _max_in_flight(tasks: list[dict[str, Any]], node: str) -> int:
    """The most tasks submitted to ``node`` and not yet ended at one moment (the simulator's
    timeline: a task queued inside the node counts, it was put on the node all the same)."""
    events: list[tuple[float, int]] = []
    for t in tasks:
        if t["node"] != node:
            continue
        events.append((float(t["submitted"]), 1))
        events.append((float(t["endedAt"]) if t["endedAt"] is not None else float("inf"), -1))
    events.sort(key=lambda e: (e[0], e[1]))
    best = now = 0
    for _, delta in events:
        now += delta
        best = max(best, now)
    return best


@pytest.fixture
def capped(settings: Any) -> None:
    settings.PROXYHUB_NODE_TASK_LIMIT = CAP
    settings.PROXYHUB_STORAGE_TASK_LIMIT = 0


# --- the cap, end to end ----------------------------------------------------------------------


def test_ten_creates_on_one_node_keep_at_most_the_cap_of_tasks_on_it_and_all_finish(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """Ten creates placed on pve1 (whose template lives there too, so every clone, upload,
    resize, start and seed removal runs on it): the simulator's own records show no more than
    three tasks on the node at once, the cap was reached, and every proxy ends Running. The
    simulator's node would take four at once and queue the rest: the cap is proxyhub's."""
    # Tasks slow enough that several overlap however quickly the pump delivers.
    sim.engine.profile = get_profile("fast", 1.0)
    sim.engine.reset()
    assert sim.engine.profile.node_task_limit > CAP
    _creates(pump, sim, 10)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 10
    tasks = sim.engine.control.tasks()
    assert len([t for t in tasks if t["type"] == "qmclone"]) == 10
    # Never above the cap; how close it got depends on how quickly the pump delivers, but
    # steps did wait for a slot, so the cap is what held them back.
    assert 2 <= _max_in_flight(tasks, "pve1") <= CAP
    assert OperationStep.objects.filter(name="slot_wait").exists()
    assert not TaskSlot.objects.exclude(operation__isnull=True).exists()
    assert not SlotWaiter.objects.exists()


def test_a_waiting_step_is_shown_to_the_operator(pump: Pump, sim: Sim, capped: None) -> None:
    _creates(pump, sim, CAP + 1)
    # Each create's lookup, then its clone: the fourth clone finds the node's slots taken.
    for _ in range(4 * (CAP + 1)):
        if SlotWaiter.objects.exists():
            break
        _deliver_one(pump)
    (waiter,) = SlotWaiter.objects.all()
    op = Operation.objects.get(pk=waiter.operation_id)
    assert op.state == OperationState.WAITING
    assert op.last_error.startswith("waiting for a task slot on node pve1 (3 of 3 in use)")
    (step,) = op.steps.filter(name="slot_wait")
    assert (step.state, step.finished_at) == ("waiting", None)
    assert step.message == "waiting for a task slot on node pve1"
    pump.run()
    assert Operation.objects.get(pk=op.pk).state == OperationState.SUCCEEDED
    step.refresh_from_db()
    assert step.state == "succeeded" and step.finished_at is not None
    assert op.steps.filter(name="clone").exists()


def test_the_delivery_that_frees_a_slot_runs_the_waiting_step_itself(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """The step that gave the slot back runs the waiter's step at once, so the node gets its
    next task without a round trip through the queue; and it sends the waiter no message, which
    would only cost a delivery that finds the step taken (issue 12: about one in seven of a
    fleet's deliveries did)."""
    _creates(pump, sim, CAP + 1)
    waiter = _first_waiter(pump)
    # The step before queued the waiter (slots.slots_queue), maybe before the slots' holders
    # submitted their clones: they do now.
    for _ in range(4 * CAP):
        clones = len([t for t in sim.engine.control.tasks() if t["type"] == "qmclone"])
        if clones == CAP:
            break
        _deliver_one(pump)
    assert clones == CAP
    assert SlotWaiter.objects.filter(pk=waiter.pk).exists()
    # Until this waiter is handed its slot (others may wait for other keys meanwhile).
    while SlotWaiter.objects.filter(pk=waiter.pk).exists():
        _deliver_one(pump)
    # In the very delivery that freed the slot, and before the waiter's own message came:
    op = Operation.objects.get(pk=waiter.operation_id)
    assert op.progress["create"]["stage"] == "clone_wait"
    assert len([t for t in sim.engine.control.tasks() if t["type"] == "qmclone"]) == CAP + 1
    # Its next message is the one its clone's wait sent, not a stale wake-up.
    assert [m.token for m in pump.queue if m.operation_id == str(op.pk)] == [op.dispatch_token]
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (CAP + 1)


def test_no_delivery_of_a_fleet_capped_on_one_node_finds_its_step_taken(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every waiter handed a slot is run by the delivery that freed it, with no message of its
    own: no delivery of the fleet is spent on a step another one already ran."""
    taken: list[str] = []
    real = claims.claim_take

    def counted(*, operation_id: str, token: str, now: Any) -> str | None:
        claim = real(operation_id=operation_id, token=token, now=now)
        if claim is None:
            taken.append(operation_id)
        return claim

    monkeypatch.setattr(claims, "claim_take", counted)
    _creates(pump, sim, 2 * CAP)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (2 * CAP)
    assert OperationStep.objects.filter(name="slot_wait").exists()
    assert taken == []


@pytest.mark.parametrize("fault", ["before its claim", "while it runs"])
def test_a_woken_waiter_whose_inline_run_fails_still_runs(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """The waiter's step has no message while the delivery that freed its slot is to run it.
    When that delivery fails first (the database drops out as it claims the step, or while
    the step runs), the waiter's message is sent after all: the create does not sit in
    Creating until the sweeper's overdue re-send."""
    _creates(pump, sim, CAP + 1)
    waiter = _first_waiter(pump)
    real_take, real_attempt = claims.claim_take, driver._attempt
    failed: list[str] = []

    def drops_out() -> None:
        failed.append(fault)
        raise OperationalError("the connection dropped")

    def take(*, operation_id: str, token: str, now: Any) -> str | None:
        if operation_id == str(waiter.operation_id) and not failed and fault == "before its claim":
            drops_out()
        return real_take(operation_id=operation_id, token=token, now=now)

    def attempt(op: Operation) -> Any:
        if str(op.pk) == str(waiter.operation_id) and not failed and fault == "while it runs":
            drops_out()
        return real_attempt(op)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(claims, "claim_take", take)
        patch.setattr(driver, "_attempt", attempt)
        with pytest.raises(OperationalError):
            # Until a holder's task ends and its slot goes to the waiter (a create keeps its
            # slot through its configure, so that takes a few deliveries per holder).
            for _ in range(200):
                _deliver_one(pump)
    assert failed == [fault]
    if fault == "before its claim":
        token = Operation.objects.get(pk=waiter.operation_id).dispatch_token
        assert token in {m.token for m in pump.queue}, "the woken waiter has no message"
    else:
        # Claimed, then failed: its claim runs out and the sweeper sends it, as for any
        # delivery that died mid-step (it holds the slot it was handed meanwhile).
        Operation.objects.filter(pk=waiter.operation_id).update(
            claim_expires_at=db_now() - timedelta(seconds=1)
        )
        pump.call(operations_sweep)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (CAP + 1)
    assert not TaskSlot.objects.exclude(operation=None).exists()


def test_a_waiter_that_takes_a_free_slot_itself_leaves_no_waiter_row_behind(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """A waiting step whose wake-up never came (a slot freed with no hand-off, a lost message)
    is sent again by the sweeper and takes the free slot itself. Its waiter row and its wait in
    the journal end there: a row left behind would later hand it a second slot of the node."""
    _creates(pump, sim, CAP + 1)
    waiter = _first_waiter(pump)
    pump.drop_all()
    # A slot comes free without a hand-off, and the waiter's fallback message is due.
    other = TaskSlot.objects.exclude(operation=None).exclude(operation=waiter.operation_id).first()
    assert other is not None
    TaskSlot.objects.filter(pk=other.pk).update(operation=None, taken_at=None)
    Operation.objects.filter(pk=waiter.operation_id).update(next_step_at=db_now())
    op = Operation.objects.get(pk=waiter.operation_id)
    assert op.state == OperationState.WAITING
    pump.send(str(op.pk), op.dispatch_token)
    _deliver_one(pump)
    op.refresh_from_db()
    assert op.progress["create"]["stage"] == "clone_wait"
    assert not SlotWaiter.objects.filter(operation_id=op.pk).exists()
    assert TaskSlot.objects.filter(operation=op.pk).count() == 1
    wait = OperationStep.objects.get(operation=op, name=slots.WAIT_STEP)
    assert wait.finished_at is not None


def _deliver_one(pump: Pump) -> None:
    pump.deliver_one()


def _first_waiter(pump: Pump) -> SlotWaiter:
    """Deliver steps one at a time until one waits for a slot; that waiter."""
    for _ in range(8 * (CAP + 1)):
        if SlotWaiter.objects.exists():
            break
        _deliver_one(pump)
    (waiter,) = SlotWaiter.objects.all()
    return waiter


# --- a wake-up that meets the waiter's own delivery ----------------------------------------


def _hand_a_slot_to(op: Operation, *, collected: bool = True) -> None:
    """Another worker's step ends and gives back one of the node's slots, which goes to
    ``op`` (the oldest waiter). What that worker collects to run itself is its own, not this
    delivery's: it tries to run ``op``'s step, finds it claimed (by this delivery) and sends
    its message instead (driver.operation_run_step). ``collected=False``: a release that runs
    nothing itself (the sweeper's) sends the message at once."""
    holder = TaskSlot.objects.filter(key=KEY).exclude(operation=None).exclude(operation=op.pk)
    other = Operation.objects.select_related("cluster").get(pk=holder.first().operation_id)
    if not collected:
        with transaction.atomic():
            slots.slots_keep(operation=other, keys=(), now=db_now())
        return
    with slots.collecting_woken() as woken, transaction.atomic():
        slots.slots_keep(operation=other, keys=(), now=db_now())
    for waiter in woken:
        if not waiter.sent:
            taken = claims.claim_take(
                operation_id=waiter.operation_id, token=waiter.token, now=db_now()
            )
            assert taken is None, "the waiter's own delivery holds its claim"
            driver._send_woken(waiter)


def test_a_slot_handed_over_between_the_last_look_and_the_wait_still_runs_the_step(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a create stuck in Creating (an integration run, 19 of 20 Running): the
    fourth clone records itself as a waiter and looks once more (none free); before it gives
    its claim back, another worker frees a slot and hands it over, sending the step at once.
    That message reaches a worker while this delivery still holds the claim, so it finds the
    step taken and exits. Then the waiter gives its claim back. Its step is due, its slot is
    held, and no message is left: nothing but the sweeper's overdue re-send (a minute later,
    if Beat runs at all) would ever run it. The step must still run, with no sweeper."""
    _creates(pump, sim, CAP + 1)
    # The delivery's own wait is under test (a chained step's, a first step's): the step before
    # does not queue it here (``slots.slots_queue``).
    monkeypatch.setattr(slots, "slots_queue", lambda **kwargs: None)
    real_wait = slots.slot_wait
    raced: list[str] = []

    def handed_over_before_the_wait(*, operation: Operation, claim: str, key: str, now: Any):
        if not raced:
            _hand_a_slot_to(operation)
            token = Operation.objects.get(pk=operation.pk).dispatch_token
            raced.append(token)
            # The message's delivery, elsewhere, while this one holds the claim: it exits.
            assert (
                claims.claim_take(operation_id=str(operation.pk), token=token, now=db_now()) is None
            )
        return real_wait(operation=operation, claim=claim, key=key, now=now)

    monkeypatch.setattr(slots, "slot_wait", handed_over_before_the_wait)
    for _ in range(8 * (CAP + 1)):
        if raced:
            break
        _deliver_one(pump)
    assert raced, "no step waited for a slot"
    # The wake-up's message was consumed by the delivery that found the step taken (it went
    # out first; a message sent again carries the same token).
    consumed = min((m for m in pump.queue if m.token == raced[0]), key=lambda m: m.seq)
    pump.queue.remove(consumed)
    heapq.heapify(pump.queue)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (CAP + 1)
    assert not TaskSlot.objects.exclude(operation=None).exists()


def test_a_slot_handed_over_during_the_last_look_is_the_only_one_it_holds(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter records itself, then looks once more. A release hands it a slot just before
    that look, and another slot of the node is free too: taking that one as well would hold
    two of the node's three slots for one task until the create ends."""
    _creates(pump, sim, CAP + 1)
    ops = _ops(CAP + 1)
    now = db_now()
    for op in ops[:CAP]:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
    me = ops[CAP]
    real_take = slots._take_one
    looks: list[int] = []

    def handed_over_first(op: Operation, key: str, when: Any, *seen: Any) -> Any:
        looks.append(1)
        if op.pk == me.pk and len(looks) == 2:
            # Between the waiter row and the last look: one holder hands its slot to this
            # waiter, and another frees one with nobody else waiting.
            _hand_a_slot_to(me, collected=False)
            spare = (
                TaskSlot.objects.filter(key=KEY).exclude(operation=None).exclude(operation=me.pk)
            )
            spare.filter(pk=spare.first().pk).update(operation=None, taken_at=None)
        return real_take(op, key, when, *seen)

    monkeypatch.setattr(slots, "_take_one", handed_over_first)
    assert slots.slots_take(operation=me, need=slots.Need((KEY,)), now=now) is None
    assert len(looks) == 2
    assert TaskSlot.objects.filter(key=KEY, operation=me.pk).count() == 1
    assert TaskSlot.objects.filter(key=KEY, operation=None).count() == 1
    assert not SlotWaiter.objects.exists()


# --- taking: never two winners for the last slot --------------------------------------------


def test_a_taker_whose_view_of_free_slots_went_stale_does_not_take_one(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two takers for the last slot, interleaved at the worst moment: both read it free, the
    other takes it, then this one sends its UPDATE. The row count says no; the cap holds.
    (The same race with two real connections is the PostgreSQL test below.)"""
    _creates(pump, sim, CAP + 1)
    ops = _ops(CAP + 1)
    now = db_now()
    for op in ops[: CAP - 1]:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
    me, other = ops[CAP - 1], ops[CAP]
    read = slots._slot_rows
    raced: list[bool] = []
    racing: list[bool] = []

    def read_then_lose_the_race(*args: Any) -> list[tuple[int, int, Any]]:
        free = read(*args)
        if not racing:
            racing.append(True)
            raced.append(bool(slots._take_one(other, KEY, now)))
        return free

    monkeypatch.setattr(slots, "_slot_rows", read_then_lose_the_race)
    assert raced == [] and slots._take_one(me, KEY, now) is False
    assert raced == [True]
    held = list(TaskSlot.objects.filter(key=KEY).exclude(operation__isnull=True))
    assert len(held) == CAP
    assert {s.operation_id for s in held} == {op.pk for op in ops[: CAP - 1]} | {other.pk}


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="two writers need a server database; the in-memory SQLite test database has one",
)
def test_two_connections_racing_for_the_last_slot_never_both_win(sim: Sim, capped: None) -> None:
    pump = Pump()
    _creates(pump, sim, CAP + 1)
    ops = _ops(CAP + 1)
    now = db_now()
    for op in ops[: CAP - 1]:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
    barrier = threading.Barrier(2)
    won: list[bool] = []
    errors: list[BaseException] = []

    def take(op: Operation) -> None:
        try:
            barrier.wait(5)
            with transaction.atomic():
                won.append(bool(slots._take_one(op, KEY, now)))
                time.sleep(0.3)  # hold the row: the other taker waits on it, then re-checks
        except BaseException as err:
            errors.append(err)
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(op,)) for op in ops[CAP - 1 :]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert sorted(won) == [False, True]
    assert TaskSlot.objects.filter(key=KEY).exclude(operation__isnull=True).count() == CAP


# --- giving back: the oldest waiter is sent at once ------------------------------------------


def _full_node_and_two_waiters(
    pump: Pump, sim: Sim, *, first_stage: str = ""
) -> tuple[list[Operation], Operation, Operation]:
    """CAP creates holding every slot of pve1, then two more waiting for one, the first a
    second longer than the second (at ``first_stage`` when given); their messages dropped."""
    _creates(pump, sim, CAP + 2)
    pump.drop_all()
    ops = _ops(CAP + 2)
    now = db_now()
    holders, first, second = ops[:CAP], ops[CAP], ops[CAP + 1]
    for op in holders:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
    if first_stage:
        Operation.objects.filter(pk=first.pk).update(
            progress=dict(first.progress, stage=first_stage)
        )
        first.refresh_from_db()
    for i, op in enumerate((first, second)):
        assert (
            slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now + timedelta(seconds=i))
            == KEY
        )
    assert SlotWaiter.objects.count() == 2
    return holders, first, second


def _give_back(pump: Pump, holder: Operation) -> None:
    """``holder``'s step ends and gives its slot back, as the journal's transaction does."""
    pump.call(
        lambda: _in_transaction(lambda: slots.slots_keep(operation=holder, keys=(), now=db_now()))
    )


def test_a_freed_slot_goes_to_the_oldest_waiter_and_sends_its_step_at_once(
    pump: Pump, sim: Sim, capped: None
) -> None:
    holders, first, second = _full_node_and_two_waiters(pump, sim)
    _give_back(pump, holders[0])
    # The message is in the queue, due now: no poll, no sweeper.
    assert [(m.operation_id, m.due <= time.monotonic()) for m in pump.queue] == [
        (str(first.pk), True)
    ]
    assert not TaskSlot.objects.filter(operation=holders[0].pk).exists()
    assert TaskSlot.objects.filter(key=KEY, operation=first.pk).count() == 1
    assert list(SlotWaiter.objects.values_list("operation_id", flat=True)) == [second.pk]
    token = Operation.objects.get(pk=first.pk).dispatch_token
    assert pump.queue[0].token == token


def test_a_freed_slot_goes_to_a_waiting_create_before_an_older_seed_release(
    pump: Pump, sim: Sim, capped: None
) -> None:
    # Issue 12's makespan: a seed's removal (after Running, off the operator's path) took a
    # slot of the template's node ahead of creates that had waited less long, and the clones
    # behind it waited a tenth of a second each time. Work someone waits for goes first; the
    # removal runs when no create waits for the node.
    holders, release, create = _full_node_and_two_waiters(pump, sim, first_stage=SEED_RELEASE_STAGE)
    _give_back(pump, holders[0])
    assert [m.operation_id for m in pump.queue] == [str(create.pk)]
    assert TaskSlot.objects.filter(key=KEY, operation=create.pk).count() == 1
    assert list(SlotWaiter.objects.values_list("operation_id", flat=True)) == [release.pk]
    # With no create waiting, the next slot freed goes to the removal.
    pump.drop_all()
    _give_back(pump, holders[1])
    assert [m.operation_id for m in pump.queue] == [str(release.pk)]
    assert not SlotWaiter.objects.exists()


def _in_transaction(fn: Any) -> None:
    with transaction.atomic():
        fn()


# --- a dead holder ---------------------------------------------------------------------------


def test_a_slot_held_by_a_step_whose_worker_died_is_recovered_by_the_sweeper(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """A worker takes the node's slots and dies before it submits (its claim expires, its
    message is gone). The sweeper frees those slots, hands them to the waiters, and every
    create runs to the end."""
    _creates(pump, sim, CAP + 1)
    pump.drop_all()
    ops = _ops(CAP + 1)
    now = db_now()
    for op in ops[:CAP]:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
        # Their step died: the claim ran out, and their record is still at the lookup (no task).
        Operation.objects.filter(pk=op.pk).update(
            claim_token="dead", claim_expires_at=now - timedelta(seconds=1), dispatch_token=""
        )
    assert slots.slots_take(operation=ops[CAP], need=slots.Need((KEY,)), now=now) == KEY
    Operation.objects.filter(pk=ops[CAP].pk).update(dispatch_token="")  # its message is lost
    pump.call(operations_sweep)
    assert (
        not TaskSlot.objects.exclude(operation=ops[CAP].pk).exclude(operation__isnull=True).exists()
    )
    assert TaskSlot.objects.filter(operation=ops[CAP].pk).count() == 1
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (CAP + 1)
    assert not TaskSlot.objects.exclude(operation__isnull=True).exists()


def test_the_sweeper_leaves_the_slot_of_a_task_still_running(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """A step polling a clone holds its slot between deliveries with no claim: that is not a
    leak, and the sweeper must not take it away."""
    _creates(pump, sim, 1)
    (op,) = _ops(1)
    for _ in range(10):
        op.refresh_from_db()
        if (op.progress.get("create") or {}).get("stage") == "clone_wait":
            break
        _deliver_one(pump)
    assert TaskSlot.objects.filter(operation=op.pk, key=KEY).count() == 1
    pump.call(operations_sweep)
    assert TaskSlot.objects.filter(operation=op.pk, key=KEY).count() == 1
    pump.run()
    assert not TaskSlot.objects.exclude(operation__isnull=True).exists()


# --- placement --------------------------------------------------------------------------------


def test_creates_arriving_one_at_a_time_spread_like_a_bulk_create(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """Health says pve1 has far more free memory than pve2. Placing by memory alone sent every
    create of a burst to pve1, each arriving before the others' VMs showed; counting the creates
    placed and still in flight alternates them, as a bulk create does."""
    now = db_now()
    views = {
        "pve1": NodeHealthView(True, "ready", now, mem_free_bytes=64 * 1024**3),
        "pve2": NodeHealthView(True, "ready", now, mem_free_bytes=16 * 1024**3),
    }

    def health(cluster: Any) -> dict[str, NodeHealthView]:
        return views

    placement.register_node_health(health)
    try:
        for i in range(6):
            # One request each, its first step run before the next arrives.
            (op,) = pump.call(
                operations.proxies_create, specs=[proxy_spec(sim, f"one{i}", zone="")]
            )
            while "zone" not in Operation.objects.get(pk=op.pk).progress:
                _deliver_one(pump)
        zones = [
            (op.progress or {}).get("zone") for op in Operation.objects.order_by("created_at", "pk")
        ]
    finally:
        with placement._sources_lock:
            placement._sources.remove(health)
    assert sorted(zones) == ["pve1", "pve1", "pve1", "pve2", "pve2", "pve2"]


# --- the wait's statements (issue 12) ----------------------------------------------------------


def _table_statements(captured: list[dict[str, Any]]) -> list[str]:
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "BEGIN", "COMMIT")
    return [q["sql"] for q in captured if not q["sql"].strip().upper().startswith(skip)]


def test_a_step_that_finds_every_slot_taken_waits_in_a_few_statements(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """Most deliveries of a capped fleet's creates wait for a slot: the wait reads the key's
    rows once per look (free rows and missing rows from one read) and records its waiter with
    one insert-if-missing. Before: 8 (two reads per look; get_or_create read, then inserted
    under a savepoint)."""
    _creates(pump, sim, CAP + 1)
    ops = _ops(CAP + 1)
    now = db_now()
    for op in ops[:CAP]:
        assert slots.slots_take(operation=op, need=slots.Need((KEY,)), now=now) is None
    with CaptureQueriesContext(connection) as ctx:
        assert slots.slots_take(operation=ops[CAP], need=slots.Need((KEY,)), now=now) == KEY
    statements = _table_statements(ctx.captured_queries)
    # The held slots, a look, the waiter's insert and its key's update, the last look.
    assert len(statements) == 5, statements
    waiter = SlotWaiter.objects.get(operation=ops[CAP])
    assert (waiter.key, waiter.since) == (KEY, now)
    # Waiting again keeps its place in the queue (its first "since").
    with CaptureQueriesContext(connection) as ctx:
        assert slots.slots_take(operation=ops[CAP], need=slots.Need((KEY,)), now=db_now()) == KEY
    assert len(_table_statements(ctx.captured_queries)) == 5
    assert SlotWaiter.objects.get(operation=ops[CAP]).since == now


def test_a_create_keeps_its_node_slot_from_its_upload_through_its_configure_to_its_start(
    pump: Pump, sim: Sim, capped: None
) -> None:
    """The configure step between a create's upload and its resize (or start) writes the VM's
    config synchronously, with no task. Giving the node's slot back there sent the create to
    the back of the node's queue for its next task: a second wait, and a delivery that found no
    slot, per create (issue 12's makespan: about one wait in three). Once a create holds a slot
    of its node, it waits again only for its seed's removal after the boot."""
    sim.engine.profile = get_profile("fast", 1.0)
    sim.engine.reset()
    _creates(pump, sim, 10)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 10
    after_wait: set[str] = set()
    for op in _ops(10):
        names = list(op.steps.order_by("seq").values_list("name", flat=True))
        after_wait.update(b for a, b in itertools.pairwise(names) if a == "slot_wait")
    # Steps did wait (the cap held them back), but only for a clone or a seed's removal.
    assert "clone" in after_wait
    assert after_wait <= {"clone", SEED_RELEASE_STAGE}, after_wait


# --- queued by the step before (issue 12) ------------------------------------------------------


def _counting_waits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every delivery that found no slot and waited (``slots.slot_wait``)."""
    waited: list[str] = []
    real = slots.slot_wait

    def counted(**kwargs: Any) -> None:
        waited.append(kwargs["key"])
        real(**kwargs)

    monkeypatch.setattr(slots, "slot_wait", counted)
    return waited


def test_a_step_whose_next_task_finds_no_slot_queues_it_with_no_delivery_of_its_own(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet's creates all look up first, then clone on the template's node: every clone
    past the cap was a delivery that found no slot and waited (issue 12's makespan: 1.5 per
    create). The step before it takes the next step's slot in its own commit, or, with none
    free, records the waiter there: the next step's first delivery is the one that runs it."""
    waited = _counting_waits(monkeypatch)
    _creates(pump, sim, 2 * CAP)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * (2 * CAP)
    # They did wait for the node (the operator saw it in the journal), in FIFO order...
    waits = OperationStep.objects.filter(name="slot_wait")
    assert waits.count() >= CAP
    assert set(waits.values_list("state", flat=True)) == {"succeeded"}
    # ...but no delivery was spent finding no slot.
    assert waited == []
    assert not TaskSlot.objects.exclude(operation__isnull=True).exists()
    assert not SlotWaiter.objects.exists()


def test_a_step_queued_while_a_slot_freed_takes_it_after_its_commit(
    pump: Pump, sim: Sim, capped: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter the step before records becomes visible to releasers only at its commit: a
    slot freed in between, finding no waiter, stays free. So after its commit that step looks
    once more, as a waiting delivery does (``slots_take``), takes the free slot and sends the
    step, rather than leaving it to the sweeper's fallback a minute later."""
    # The step before finds the node full (below), so its next step is queued, not run in the
    # same delivery (driver._persist).
    _creates(pump, sim, 2)
    real = slots._take_one
    missed: list[str] = []

    def full_at_first(operation: Operation, key: str, *args: Any, **kwargs: Any) -> Any:
        # The look in the step's own transaction sees the node full (the release came after).
        if not missed:
            missed.append(key)
            return False
        return real(operation, key, *args, **kwargs)

    monkeypatch.setattr(slots, "_take_one", full_at_first)
    pump.deliver_one()  # a lookup, which leads to the clone on pve1
    assert missed == [KEY]
    (op,) = [o for o in _ops(2) if (o.progress.get("create") or {}).get("stage") == "clone"]
    # The look after the commit took the free slot and sent the step: no waiter left behind.
    assert list(TaskSlot.objects.filter(operation=op).values_list("key", flat=True)) == [KEY]
    assert not SlotWaiter.objects.exists()
    assert [m.token for m in pump.queue if m.operation_id == str(op.pk)] == [op.dispatch_token]
    assert op.next_step_at is not None and op.next_step_at <= db_now()
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 2
