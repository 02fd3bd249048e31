"""The journal's last row kept by the process that wrote it (issue 12, services/journal.py): a
step's next delivery starts from it instead of reading it, and the journal it writes is the one
it would write reading the row. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationState, Phase, StepState
from provisioning.services import driver, journal, operations

pytestmark = pytest.mark.django_db

# The journal's read of an operation's last row (journal_step without a kept row).
LAST_ROW_READ = re.compile(r'^SELECT .* FROM "provisioning_operationstep" .*ORDER BY .*"seq" DESC')

Shape = list[tuple[int, str, str, bool]]


@pytest.fixture
def capped(settings: Any) -> None:
    settings.PROXYHUB_NODE_TASK_LIMIT = 1
    settings.PROXYHUB_STORAGE_TASK_LIMIT = 0


def _shape(operation: Operation) -> Shape:
    """The journal as an operator reads it: each row's place, stage, state and whether its
    task's UPID is on it (UPIDs and times differ from run to run)."""
    return [
        (row.seq, row.name, row.state, bool(row.upid))
        for row in OperationStep.objects.filter(operation=operation).order_by("seq")
    ]


def _create_and_run(pump: Pump, sim: Sim, names: list[str]) -> list[Operation]:
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, name) for name in names])
    pump.run()
    ops = [Operation.objects.get(proxy__name=name) for name in names]
    for op, name in zip(ops, names, strict=True):
        assert op.state == OperationState.SUCCEEDED, (name, op.last_error)
        assert Proxy.objects.get(name=name).phase == Phase.RUNNING
    return ops


def _assert_well_formed(operation: Operation) -> None:
    """Rows numbered 1..n in the order their stages began, each ended before the next began,
    none left open once the operation ended."""
    rows = list(OperationStep.objects.filter(operation=operation).order_by("seq"))
    assert [row.seq for row in rows] == list(range(1, len(rows) + 1))
    for before, after in itertools.pairwise(rows):
        assert before.finished_at is not None, before.name
        assert before.finished_at <= after.started_at, (before.name, after.name)
    assert rows[-1].finished_at is not None
    assert all(row.state == StepState.SUCCEEDED for row in rows), _shape(operation)


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Per step run (driver._run_one): the operation and how many times it read its last row."""
    seen: list[tuple[str, int]] = []
    real = driver._run_one

    def counted(**kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as ctx:
            chained = real(**kwargs)
        reads = sum(bool(LAST_ROW_READ.match(q["sql"])) for q in ctx.captured_queries)
        seen.append((kwargs["operation_id"], reads))
        return chained

    monkeypatch.setattr(driver, "_run_one", counted)
    return seen


def test_a_step_after_one_this_process_journalled_reads_no_journal_row(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    _create_and_run(pump, sim, ["warm"])
    seen = _counting_reads(monkeypatch)
    (op,) = _create_and_run(pump, sim, ["p0"])
    steps = [reads for operation_id, reads in seen if operation_id == str(op.pk)]
    # Its first step has no row kept (the command journalled nothing); every later one does.
    assert len(steps) >= 6, steps
    assert steps[0] <= 1 and steps[1:] == [0] * (len(steps) - 1), steps
    _assert_well_formed(op)


def test_the_journal_is_the_same_whether_the_row_is_kept_or_read(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    _create_and_run(pump, sim, ["warm"])
    (kept,) = _create_and_run(pump, sim, ["kept"])
    # Another process journalled every step before: nothing kept here, each row is read.
    monkeypatch.setattr(driver, "journal_head_take", lambda operation_id, token: None)
    (read,) = _create_and_run(pump, sim, ["read"])
    assert _shape(kept) == _shape(read)
    assert [name for _, name, _, _ in _shape(kept)][:3] == ["lookup", "clone", "upload"]
    _assert_well_formed(kept)


def test_steps_that_waited_for_a_slot_start_from_the_rows_their_wait_wrote(
    pump: Pump, sim: Sim, capped: None
) -> None:
    # One task at a time on pve1: the creates queue for its slot, and their waits are journalled
    # by whoever hands them the slot (services.slots), never through a kept row.
    ops = _create_and_run(pump, sim, ["a", "b", "c"])
    waited = [op for op in ops if any(name == "slot_wait" for _, name, _, _ in _shape(op))]
    assert waited, [_shape(op) for op in ops]
    for op in ops:
        _assert_well_formed(op)
    for op in waited:
        names = [name for _, name, _, _ in _shape(op)]
        # The stage after each wait is a row of its own, after the wait's.
        for i, name in enumerate(names[:-1]):
            if name == "slot_wait":
                assert names[i + 1] != "slot_wait", names


def test_a_kept_row_is_taken_once_by_the_delivery_that_claims_its_token(
    pump: Pump, sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    op = Operation.objects.get(proxy__name="p0")
    token = op.dispatch_token
    row = OperationStep.objects.create(
        operation=op, seq=1, name="lookup", state=StepState.RUNNING, started_at=op.created_at
    )
    journal.journal_head_keep(str(op.pk), token, row)
    # A message with another token (a stale duplicate) is refused its claim and takes nothing.
    driver.operation_run_step(operation_id=str(op.pk), token="0" * 16)
    taken: list[Any] = []
    real = journal.journal_head_take

    def take(operation_id: str, token: str) -> Any:
        taken.append(real(operation_id, token))
        return taken[-1]

    monkeypatch.setattr(driver, "journal_head_take", take)
    pump.run()
    assert taken and taken[0] is not None and taken[0].pk == row.pk
    assert journal.journal_head_take(str(op.pk), token) is None  # once
