"""Steps that follow each other at once run in one delivery (services/driver.py, issue 12): a
create no longer pays a broker round trip between a task's end and its next submission, and a
chain ends at its next wait on Proxmox, so every other due step waits for at most one chain.
Counts come from the pump (the messages sent) and the simulator's ledger."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationKind, Phase
from provisioning.services import driver, operations, runners, slots

pytestmark = pytest.mark.django_db


def test_a_create_alone_runs_the_steps_that_follow_at_once_in_the_same_delivery(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Placement, clone; a poll that finds a task ended and the next submission; configure and
    resize: each pair runs in one delivery. Only waits on Proxmox go through the broker."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    delivered = pump.run()
    proxy = Proxy.objects.get(name="p0")
    assert proxy.phase == Phase.RUNNING and proxy.ip
    steps = OperationStep.objects.filter(operation__proxy=proxy).count()
    # Every task stage is journalled as before, with its receipt.
    names = list(
        OperationStep.objects.filter(operation__proxy=proxy)
        .order_by("seq")
        .values_list("name", "upid")
    )
    assert all(upid for name, upid in names if name in ("clone", "upload", "resize", "start"))
    # Without chaining every step and every poll is a delivery: at least one per journal row.
    assert delivered < steps, (delivered, names)
    # The first delivery placed the proxy and submitted its clone.
    clones = [e for e in sim.engine.ledger.mutations() if str(e.key).endswith("/clone")]
    assert len(clones) == 1


def test_a_chain_runs_ahead_of_other_due_steps_until_its_next_wait(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Two creates queued at once: the first one's delivery places it and submits its clone,
    though the second one's placement is due too. Sending the clone through the broker behind
    it kept that order but cost the one worker a delivery per transition (a publish, a claim,
    the operation's read): issue 12's makespan measured 1.80-2.00 chaining against 2.08-2.16
    not (benchmarks/README.md). A chain still ends at its next wait on Proxmox, so another step
    waits for at most one look, the steps due at once after it and one submission."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(
        operations.proxies_create,
        specs=[proxy_spec(sim, "a"), proxy_spec(sim, "b")],
    )
    first, second = pump.queue[0].operation_id, pump.queue[1].operation_id
    pump.deliver_one()
    op = Operation.objects.get(pk=first)
    clones = [e for e in sim.engine.ledger.mutations() if str(e.key).endswith("/clone")]
    assert len(clones) == 1, "the first create's clone was not submitted in its delivery"
    assert (op.progress.get("create") or {}).get("stage") == "clone_wait"
    # It waits for its clone through the broker (a countdown); the second is still queued.
    assert op.next_step_at is not None and op.next_step_at > op.created_at
    assert [m.operation_id for m in pump.queue] == [second, first]
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 2


@pytest.mark.parametrize("where", ["learning the duration", "running a woken waiter"])
def test_a_database_error_after_a_chained_step_committed_still_leaves_its_message(
    pump: Pump, sim: Sim, settings: Any, where: str
) -> None:
    """A chained step's token is committed with no message: this delivery is to run it next.
    When the delivery fails before it does (the database drops out while it learns the task's
    duration, or while it runs the step of a waiter a freed slot woke), that step must still
    have its message; with none, only the sweeper's overdue re-send (if Beat runs) would run
    it: the create would sit in Creating."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    chained: list[str] = []
    real_persist, real_run_one = driver._persist, driver._run_one

    def persist(*args: Any, **more: Any) -> str | None:
        token = real_persist(*args, **more)
        if token and not chained:
            chained.append(token)
            if where == "learning the duration":
                monkeypatch.setattr(driver, "_learn_duration", _drops_out)
            else:  # the step gave a slot to a waiter, which this delivery runs next
                # Woken by this delivery, which is to run it: no message went out for it.
                woken.append(slots.Woken(waiter_id, "its-token", "", sent=False))
        return token

    def run_one(**kw: Any) -> str | None:
        if kw["operation_id"] == waiter_id:
            _drops_out()
        return real_run_one(**kw)

    def _drops_out(*args: Any) -> None:
        raise OperationalError("the connection dropped")

    woken: list[slots.Woken] = []
    waiter_id = str(uuid.uuid4())  # no such operation: its message's delivery exits

    @contextmanager
    def collecting() -> Iterator[list[slots.Woken]]:
        woken.clear()
        yield woken

    # Its own patch, undone before the pump runs the rest (the pump's patch stays).
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(driver, "_persist", persist)
        monkeypatch.setattr(driver, "_run_one", run_one)
        monkeypatch.setattr(slots, "collecting_woken", collecting)
        with pytest.raises(OperationalError):
            for _ in range(10):
                pump.deliver_one()
    assert Operation.objects.get(proxy__name="p0").dispatch_token == chained[0]
    assert chained[0] in {m.token for m in pump.queue}, "the chained step has no message"
    if where == "running a woken waiter":
        assert "its-token" in {m.token for m in pump.queue}, "the woken waiter has no message"
    pump.run()
    assert Proxy.objects.get(name="p0").phase == Phase.RUNNING


def _passed_by_stage(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Each journalled step of the run, as (the stage it reports, the stages it passed on its
    way: ``StepMachine.follows``)."""
    seen: list[tuple[str, list[str]]] = []
    journal = driver.journal_step

    def journalled(op: Any, outcome: Any, now: Any, **kwargs: Any) -> Any:
        seen.append((outcome.result.step, [p.step for p in outcome.result.passed]))
        return journal(op, outcome, now, **kwargs)

    monkeypatch.setattr(driver, "journal_step", journalled)
    return seen


def test_a_step_goes_on_to_the_stages_that_need_no_other_slot(
    pump: Pump, sim: Sim, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upload's poll writes the config and submits the resize, and the resize's poll
    submits the start, in the step that saw the task end; every stage keeps its journal row."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    seen = _passed_by_stage(monkeypatch)
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    pump.run()
    proxy = Proxy.objects.get(name="p0")
    assert proxy.phase == Phase.RUNNING and proxy.ip
    passed = dict(seen)
    assert "configure" not in passed and passed["resize"] == ["upload_wait", "configure"]
    assert passed["start"] == ["resize_wait"], seen
    # Each stage passed kept its row, in order (test_operations checks the create's whole list).
    merged = ("upload", "configure", "resize", "start")
    rows = OperationStep.objects.filter(operation__proxy=proxy).order_by("seq")
    assert [name for name in rows.values_list("name", flat=True) if name in merged] == [*merged]
    assert all(
        OperationStep.objects.get(operation__proxy=proxy, name=name).upid
        for name in ("clone", "upload", "resize", "start")
    )


def test_a_step_goes_on_only_on_the_slots_it_holds(sim: Sim, settings: Any) -> None:
    """``runners.may_follow``: the next stage may run in the step only when it needs no slot
    the step lacks. With a storage cap, a resize writes to the disks' storage, whose slot the
    upload's poll does not hold (it holds the seeds' storage's): it is a step of its own and
    takes that slot first. A stage on another node never follows."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    settings.PROXYHUB_STORAGE_TASK_LIMIT = 2
    cluster = sim.cluster
    cluster.storage = "vmdisks"  # in memory only: the clone target whose slots are capped
    op = Operation(kind=OperationKind.CREATE, cluster=cluster)
    op.cluster_switched = False  # type: ignore[attr-defined]  # the driver's read annotates it
    polled = {"create": {"stage": "upload_wait", "node": "pve1", "upid": "UPID:pve1:1"}}
    may = runners.may_follow(op, polled)
    assert may is not None
    assert may({"stage": "configure", "node": "pve1"})
    assert not may({"stage": "resize", "node": "pve1"})
    assert not may({"stage": "start", "node": "pve2"})
    settings.PROXYHUB_STORAGE_TASK_LIMIT = 0
    may = runners.may_follow(op, polled)
    assert may is not None and may({"stage": "resize", "node": "pve1"})
    # A record that holds nothing (nothing submitted yet) goes on to nothing.
    assert runners.may_follow(op, {"create": {"stage": "lookup"}}) is None


def test_no_step_goes_on_while_a_maintenance_switch_is_on_in_the_cluster(
    pump: Pump, sim: Sim, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage that writes is held by a switch on its node, and a step is checked only for its
    own stage: with any switch on in the cluster (here another node's), every stage is a step
    of its own, checked on its own."""
    from provisioning.services.maintenance import maintenance_start

    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    maintenance_start(cluster=sim.cluster, node="pve2", reason="disk swap", user=None)
    seen = _passed_by_stage(monkeypatch)
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    pump.run()
    assert Proxy.objects.get(name="p0").phase == Phase.RUNNING
    assert [stage for stage, _ in seen].count("configure") == 1, seen
    assert all(not passed for _, passed in seen), seen
