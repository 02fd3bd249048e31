"""Work under way goes before work that can wait (``dispatch.PRIORITY_*``, issue 12).

One worker's queue held the first steps of 60 creates ahead of the look that would see their
first clones end, so a node sat idle for over a second with its next clones waiting; and each
create's seed release, cleanup after its proxy runs, took the worker's turn from creates still
on their way. An operation's first step and that cleanup now go at ``PRIORITY_CAN_WAIT``;
everything else, the sweeper's re-sends included, at ``PRIORITY_UNDER_WAY``. These tests hold
the real Redis broker to that order and the services to what they send.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import pools
from pump import Pump, Sim, proxy_spec
from redis_broker import broker, queue_messages

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationState, Phase, StepState
from provisioning.services import dispatch, operations
from provisioning.services.seeds import SEED_RELEASE_STAGE


def _next_on_the_queue(app: Any) -> str:
    """The operation of the step message a worker would take next: kombu's Redis channel reads
    the queue's priority lists in the order its BRPOP names them, as ``basic_get`` does."""
    with app.connection_for_read() as conn:
        message = conn.default_channel.basic_get(dispatch.STEP_QUEUE, no_ack=True)
        assert message is not None
        _, kwargs, _ = message.decode()
        return str(kwargs["operation_id"])


def test_a_step_under_way_is_delivered_before_new_work_sent_earlier(
    live_broker: str, live_queue: Any
) -> None:
    pools.reset()  # kombu's pools are global, by URL: drop what earlier tests opened
    with broker(live_broker) as app:
        for n in range(3):
            dispatch.send_step(f"new-{n}", "t", priority=dispatch.PRIORITY_CAN_WAIT)
        dispatch.send_step("under-way", "t")
        # Two lists of one queue: the worker's BRPOP names the first priority's first.
        waiting = {m["kwargs"]["operation_id"]: m for m in queue_messages(live_queue)}
        assert {m["queue"] for m in waiting.values()} == {dispatch.STEP_QUEUE}
        assert waiting["under-way"]["priority"] == dispatch.PRIORITY_UNDER_WAY
        assert waiting["new-0"]["priority"] == dispatch.PRIORITY_CAN_WAIT
        assert waiting["under-way"]["list"] != waiting["new-0"]["list"]
        order = [_next_on_the_queue(app) for _ in range(4)]
    # Work under way first; what can wait keeps its own order.
    assert order == ["under-way", "new-0", "new-1", "new-2"]


@pytest.mark.django_db
def test_a_create_starts_as_new_work_and_its_steps_under_way_go_first(pump: Pump, sim: Sim) -> None:
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    assert [m.priority for m in pump.sent] == [dispatch.PRIORITY_CAN_WAIT]
    pump.run()
    op = Operation.objects.get(proxy__name="p0")
    assert op.state == OperationState.SUCCEEDED
    # After the first, only the cleanup once the proxy runs went as work that can wait.
    later = [m.priority for m in pump.sent[1:]]
    assert later.count(dispatch.PRIORITY_CAN_WAIT) == 1, later
    assert set(later) == {dispatch.PRIORITY_UNDER_WAY, dispatch.PRIORITY_CAN_WAIT}


@pytest.mark.django_db
def test_the_seed_release_waits_its_turn_and_the_address_row_ends_when_the_proxy_runs(
    pump: Pump, sim: Sim
) -> None:
    """The step that finds the address does not go on into the release in the same delivery
    (a chain would take the worker from creates still on their way): the release is sent as
    work that can wait. The journal's address row ends with that step, when the proxy runs,
    not when the release begins."""
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    proxy = Proxy.objects.get(name="p0")
    while proxy.phase != Phase.RUNNING:
        pump.deliver_one()
        proxy.refresh_from_db()
    op = Operation.objects.get(proxy=proxy)
    assert op.state in (OperationState.RUNNING, OperationState.WAITING)
    assert op.progress["stage"] == SEED_RELEASE_STAGE
    rows = list(OperationStep.objects.filter(operation=op).order_by("seq"))
    address = rows[-1]
    assert address.name == "address" and address.state == StepState.SUCCEEDED
    assert address.finished_at is not None
    assert proxy.observed_at == address.finished_at  # the same step, the same commit
    # Nothing of the release ran yet: its message waits as work that can wait.
    assert not any(r.name == SEED_RELEASE_STAGE for r in rows)
    assert [(m.operation_id, m.priority) for m in pump.queue] == [
        (str(op.pk), dispatch.PRIORITY_CAN_WAIT)
    ]
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    release = OperationStep.objects.get(operation=op, name=SEED_RELEASE_STAGE)
    assert release.started_at >= address.finished_at
