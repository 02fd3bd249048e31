"""Recovery in seconds (issue 10, break 4): short claims renewed while a step runs, a sweeper
that sends again with the same token and never multiplies a backlog, early deliveries re-queued.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from pump import Pump, Sim

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationState, Phase
from provisioning.schedules import SCHEDULES
from provisioning.services import claims, dispatch, operations
from provisioning.services.clock import db_now
from provisioning.services.operations import ProxySpec
from provisioning.services.sweeper import operations_sweep

pytestmark = pytest.mark.django_db

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"


def _queued_create(pump: Pump, sim: Sim, name: str = "alpha") -> Operation:
    spec = ProxySpec(
        name=name, cluster=sim.cluster, machine_type="small", image="debian-13", zone="pve1"
    )
    return pump.call(operations.proxy_create, spec=spec)


def test_a_delivery_killed_mid_step_frees_its_step_when_its_claim_expires(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_STEP_CLAIM_SECONDS = 1
    op = _queued_create(pump, sim)
    message = pump.queue.pop(0)
    # The worker takes the step and dies: its claim stays, its message is gone.
    assert claims.claim_take(operation_id=message.operation_id, token=message.token, now=db_now())
    assert pump.call(operations_sweep) == 0  # the claim is still live
    time.sleep(1.1)
    assert pump.call(operations_sweep) == 1  # expired: a new token, a new message
    assert pump.queue[0].token != message.token
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert Proxy.objects.get().phase == Phase.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_step_that_runs_long_keeps_renewing_its_claim(sim: Sim, settings: Any) -> None:
    settings.PROXYHUB_STEP_CLAIM_SECONDS = 1
    op = Operation.objects.create(kind="create", proxy_name="x", cluster=sim.cluster)
    claim = claims.claim_take(operation_id=str(op.pk), token=op.dispatch_token, now=db_now())
    assert claim is not None
    with claims.claim_renewed(operation_id=str(op.pk), claim=claim):
        time.sleep(2.5)  # two and a half claims long
        op.refresh_from_db()
        assert op.claim_expires_at is not None and op.claim_expires_at > db_now()
        assert operations_sweep() == 0
    op.refresh_from_db()
    assert op.claim_token == claim


def test_an_overdue_step_is_sent_again_with_the_same_token(pump: Pump, sim: Sim) -> None:
    """Under a backlog the first message is only late, not lost: sending the same token again
    lets whichever copy arrives first run the step, and the other do nothing."""
    op = _queued_create(pump, sim)
    token = pump.queue[0].token
    Operation.objects.filter(pk=op.pk).update(
        next_step_at=db_now() - timedelta(minutes=1), dispatched_at=db_now() - timedelta(minutes=1)
    )
    assert pump.call(operations_sweep) == 1
    assert [m.token for m in pump.queue] == [token, token]
    # The first step went as new work, which waits behind work under way; the copy goes first
    # (dispatch.PRIORITY_*): a step that could wait has waited long enough.
    assert [m.priority for m in pump.sent] == [
        dispatch.PRIORITY_CAN_WAIT,
        dispatch.PRIORITY_UNDER_WAY,
    ]
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert sim.engine.ledger.count("POST", CLONE) == 1


def test_a_backlog_costs_a_few_messages_not_one_per_sweep(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Twenty sweeps over a step stuck in a queue for 1.2 s send it again a handful of times:
    each re-send of one message waits twice as long as the one before."""
    settings.PROXYHUB_SWEEPER_GRACE_SECONDS = 0.05
    op = _queued_create(pump, sim)
    Operation.objects.filter(pk=op.pk).update(next_step_at=db_now() - timedelta(seconds=1))
    sent = 0
    for _ in range(20):
        sent += pump.call(operations_sweep)
        time.sleep(0.06)
    assert 2 <= sent <= 6, sent
    assert {m.token for m in pump.queue} == {op.dispatch_token}


def test_an_early_delivery_is_requeued_with_the_time_that_remains(pump: Pump, sim: Sim) -> None:
    """A countdown measured on a host whose clock runs ahead arrives early: it is not dropped."""
    op = _queued_create(pump, sim)
    message = pump.queue.pop(0)
    due = db_now() + timedelta(seconds=5)
    Operation.objects.filter(pk=op.pk).update(next_step_at=due)
    assert claims.claim_take(operation_id=str(op.pk), token=message.token, now=db_now()) is None
    (again,) = pump.queue
    assert again.token == message.token
    assert 4.0 < again.due - time.monotonic() <= 5.0
    op.refresh_from_db()
    assert op.dispatch_token == message.token and op.claim_token == ""


def test_the_loop_keeping_jobs_run_on_their_own_queue() -> None:
    routes = django_settings.CELERY_TASK_ROUTES
    for task in ("proxyhub.provisioning.sweep", "proxyhub.provisioning.reconcile"):
        assert routes[task] == {"queue": "control"}
    assert {queue for _, _, _, queue in SCHEDULES.values()} == {"control"}
    assert "control" in {q.name for q in django_settings.CELERY_TASK_QUEUES}


def test_the_default_timings_recover_a_killed_step_within_thirty_seconds() -> None:
    """A killed step waits for its claim to expire, then for the next sweep. The defaults keep
    that under the issue's 30 s goal (the integration tier measures it with real workers)."""
    claim = django_settings.PROXYHUB_STEP_CLAIM_SECONDS
    sweep = django_settings.PROXYHUB_SWEEPER_INTERVAL_SECONDS
    grace = django_settings.PROXYHUB_SWEEPER_GRACE_SECONDS
    assert claim + sweep <= 30
    assert grace + sweep <= 30  # a lost countdown message: due, grace, then the next sweep
