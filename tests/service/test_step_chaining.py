"""Steps that follow each other at once run in one delivery while nothing else is due
(services/driver.py, issue 12): a create alone no longer pays a broker round trip between a
task's end and its next submission, and a busy worker still serves every due step in its turn.
Counts come from the pump (the messages sent) and the simulator's ledger."""

from __future__ import annotations

from typing import Any

import pytest
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import Phase
from provisioning.services import operations

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


def test_a_step_due_for_another_operation_takes_its_turn_first(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Two creates queued at once: the first one's placement does not run its clone ahead of
    the second one's placement; its next step goes through the broker, behind it."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    pump.call(
        operations.proxies_create,
        specs=[proxy_spec(sim, "a"), proxy_spec(sim, "b")],
    )
    first = pump.queue[0].operation_id
    pump.deliver_one()
    op = Operation.objects.get(pk=first)
    assert (op.progress.get("create") or {}).get("stage") == "clone"
    assert first in {m.operation_id for m in pump.queue}
    assert not [e for e in sim.engine.ledger.mutations() if str(e.key).endswith("/clone")]
    pump.run()
    assert sorted(Proxy.objects.values_list("phase", flat=True)) == [Phase.RUNNING] * 2
