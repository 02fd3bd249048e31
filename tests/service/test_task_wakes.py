"""Batched observation per node (issue 12, ``proxmox.task_board``, ``services.task_wakes``).

One look at a node's task list answers for every task of ours running there: the operations
whose clones it saw end are woken at once, before their own planned looks, and their polls read
nothing. Counted by the simulator's ledger and timed by the journal. Run on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy, WorkDuration
from provisioning.models.choices import OperationState, Phase
from provisioning.services import operations, task_wakes
from provisioning.services.clock import db_now

pytestmark = pytest.mark.django_db

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
TASK_LIST = "GET /nodes/{node}/tasks"
TASK_STATUS = "GET /nodes/{node}/tasks/{upid}/status"
# Each clone's first look is planned this long after its submission (a learned estimate).
EXPECTED_CLONE = 1.5
# The second and third clones are submitted this long after the one before.
GAP = 0.6


@pytest.fixture
def capped(settings: Any) -> None:
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    settings.PROXYHUB_STORAGE_TASK_LIMIT = 0


def _three_clones_a_gap_apart(pump: Pump, sim: Sim) -> list[Operation]:
    """Three creates on pve1 whose clones (quick on the simulator) are planned to be looked at
    ``EXPECTED_CLONE`` after their submissions, which come ``GAP`` apart: the first look comes
    when all three have long ended, and the others' own looks are still 0.6 and 1.2 s away."""
    WorkDuration.objects.create(
        cluster=sim.cluster, kind="qmclone", scope="pve1", seconds=EXPECTED_CLONE, samples=5
    )
    sim.before(CLONE, lambda call: None)
    sim.before(CLONE, lambda call: time.sleep(GAP))
    sim.before(CLONE, lambda call: time.sleep(GAP))
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, f"w{i}") for i in range(3)])
    return list(Operation.objects.order_by("created_at", "pk"))


def _clone_steps() -> dict[str, OperationStep]:
    return {
        str(step.upid): step
        for step in OperationStep.objects.filter(name="clone").select_related("operation")
    }


def test_the_first_look_at_the_node_wakes_the_creates_whose_clones_it_saw_end(
    pump: Pump, sim: Sim, capped: None
) -> None:
    _three_clones_a_gap_apart(pump, sim)
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 3

    steps = _clone_steps()
    assert len(steps) == 3
    ledger = sim.engine.ledger
    # Not one clone was read on its own: one look at the node's list answered for all three.
    status_reads = [e for e in ledger.calls("GET", TASK_STATUS) if e.path_params["upid"] in steps]
    assert status_reads == []
    first, *woken = sorted(steps.values(), key=lambda s: s.started_at)
    looks = [
        e
        for e in ledger.calls("GET", TASK_LIST)
        if e.params.get("source") == "all" and e.params.get("since")
    ]
    assert looks, "no look at the node's task list"
    for step in woken:
        # Each was noticed at the first clone's look, before its own planned look
        # (EXPECTED_CLONE after its submission, and the wait's margin).
        waited = (step.finished_at - step.started_at).total_seconds()
        assert waited < EXPECTED_CLONE, (step.operation.proxy_name, waited)
    assert (first.finished_at - first.started_at).total_seconds() >= EXPECTED_CLONE


def test_only_an_operation_still_waiting_for_its_look_is_woken(
    pump: Pump, sim: Sim, capped: None
) -> None:
    ops = _three_clones_a_gap_apart(pump, sim)
    # Deliver until all three wait on their clones, then let the clones end.
    for _ in range(200):
        if len(_clone_steps()) == 3 and all(s.state == "waiting" for s in _clone_steps().values()):
            break
        pump.deliver_one()
    steps = _clone_steps()
    assert len(steps) == 3 and all(s.state == "waiting" for s in steps.values())
    sim.settle(0.2)
    by_op = {str(s.operation_id): upid for upid, s in steps.items()}
    claimed, soon, waiting = ops
    now = db_now()
    # One runs its step right now (another delivery holds its claim), one's own look is due
    # within WAKE_AHEAD anyway, and one waits for a look a while away.
    Operation.objects.filter(pk=claimed.pk).update(
        claim_token="held", claim_expires_at=now + timedelta(seconds=30)
    )
    Operation.objects.filter(pk=soon.pk).update(
        next_step_at=now + timedelta(seconds=task_wakes.WAKE_AHEAD / 2)
    )
    Operation.objects.filter(pk=waiting.pk).update(next_step_at=now + timedelta(seconds=5))
    before = {op.pk: Operation.objects.get(pk=op.pk) for op in ops}

    woken = pump.call(
        task_wakes.tasks_ended_wake, cluster_id=sim.cluster.pk, upids=list(by_op.values()), now=now
    )

    assert woken == 1
    after = {op.pk: Operation.objects.get(pk=op.pk) for op in ops}
    for op in (claimed, soon):
        assert after[op.pk].dispatch_token == before[op.pk].dispatch_token
        assert after[op.pk].next_step_at == before[op.pk].next_step_at
    assert after[waiting.pk].next_step_at == now
    assert after[waiting.pk].state == OperationState.WAITING
    assert after[waiting.pk].progress == before[waiting.pk].progress  # nothing else changes
    # Sent now with the token it had: its planned look's message, with the same token, still
    # runs the step should it come first, and whichever comes second finds it taken.
    token = before[waiting.pk].dispatch_token
    assert after[waiting.pk].dispatch_token == token
    mine = [m for m in pump.queue if m.operation_id == str(waiting.pk) and m.token == token]
    sent = sorted(m.due for m in mine)
    assert len(sent) == 2 and sent[0] <= time.monotonic()
    # A task the node still runs, or that is no operation's, wakes nothing.
    assert task_wakes.tasks_ended_wake(cluster_id=sim.cluster.pk, upids=["UPID:x"], now=now) == 0


def test_the_tasks_in_flight_are_the_waiting_slot_holders_on_that_node(
    pump: Pump, sim: Sim, capped: None
) -> None:
    _three_clones_a_gap_apart(pump, sim)
    for _ in range(200):
        if len(_clone_steps()) == 3 and all(s.state == "waiting" for s in _clone_steps().values()):
            break
        pump.deliver_one()
    upids = sorted(_clone_steps())
    in_flight = task_wakes.ClusterTasksInFlight(sim.cluster.pk)
    assert sorted(in_flight("pve1", upids[0])) == upids[1:]
    assert in_flight("pve2", upids[0]) == []
    pump.run()
    # Once they moved on, none of them is in flight any more.
    assert in_flight("pve1", "UPID:none") == []
