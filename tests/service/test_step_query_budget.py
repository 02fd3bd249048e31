"""The database work of one step (issue 12): with one worker process, a fleet's makespan is the
sum of its step deliveries, and most of a delivery is the control loop's own SQL. Each step of a
warm create (a delivery may run several, services/driver.py) stays within a budget of statements,
counted through Django's connection (the queries are the measure; no wall-clock figure).

Counted: statements that read or write a table. Savepoints and the PostgreSQL clock read
(``services.clock``) are left out so the budget is the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import Phase
from provisioning.services import clock, driver, operations

pytestmark = pytest.mark.django_db

# A poll of a running task that finds it ended (it also teaches the duration estimate): claim,
# operation read, held slots, the proxy's row lock, the journal's open row's update, the
# operation's and the proxy's updates, the estimate's move (one UPDATE: durations_learn).
# Before this budget: 15; 10 while the estimate was read then written; 9 while each step read
# the journal's last row (the process that journalled the step before keeps it: journal.py).
POLL_BUDGET = 8
# A poll whose next step needs no slot also gives its slot back and looks for a waiter to hand
# it to.
RELEASE = 2
# The start's wait that sees the VM run is the running check too (proxmox/create.py), and it
# plans the boot's first look when the boot is known to take a while (services/runners.py): it
# also journals the check's row, reads the cluster's estimates (when this process's copy is a
# second old: services.durations) and, when that boot is not yet due, opens the address's row;
# no step of its own runs for either (before: two whole steps).
# The budget counted the row but not the read, so it held only when the boot was already due:
# on a slower run the test failed either way.
MET = 3
# Any step of a warm create after its first (the first places the proxy). Before: up to 20;
# 13 while a submitting step read its held slots and its node's slots apart (slots.slots_look);
# 12 while it read the maintenance switches itself (maintenance.with_switches_flag); 11 while
# it read the estimate its wait is planned from (services.durations keeps a cluster's for 1 s);
# 10 while it read the journal's last row.
STEP_BUDGET = 9
# A stage a step ran and ended on its way (CreateMachine.follows: the config write after the
# upload's end, the resize and the start after the task before them) costs its journal row,
# one statement, where a step of its own cost up to STEP_BUDGET.
PASSED = 1


def _clock_reads(captured: list[dict[str, Any]]) -> int:
    return sum("CLOCK_TIMESTAMP()" in query["sql"].upper() for query in captured)


def _table_statements(captured: list[dict[str, Any]]) -> list[str]:
    out = []
    for query in captured:
        sql = query["sql"].strip()
        upper = sql.upper()
        if upper.startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            continue
        if "CLOCK_TIMESTAMP()" in upper:
            continue
        out.append(sql)
    return out


def _releases(sql: str) -> bool:
    return sql.startswith('UPDATE "provisioning_taskslot"') and '"operation_id" = NULL' in sql


def _switch_read(sql: str) -> bool:
    return sql.startswith('SELECT "provisioning_maintenancewindow"')


def _extra(sql: list[str], passed: int = 0) -> int:
    """Statements a step spends on work beside its own: a slot given back, and the journal
    rows of the ``passed`` stages it ran and ended on its way."""
    return (RELEASE if any(_releases(q) for q in sql) else 0) + PASSED * passed


def _stage(operation_id: str) -> str:
    progress = Operation.objects.get(pk=operation_id).progress
    return str((progress.get("create") or {}).get("stage") or progress.get("stage") or "")


def test_each_step_of_a_create_stays_within_its_statement_budget(
    pump: Pump, sim: Sim, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PROXYHUB_NODE_TASK_LIMIT = 3
    # A first create makes what a fleet makes once (the node's slot rows, the estimates, the
    # breaker's row); the second is counted.
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "warm")])
    pump.run()
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    real = driver._run_one
    journal = driver.journal_step
    seen: list[tuple[str, list[str]]] = []
    passed: list[int] = []
    clock_reads: list[int] = []

    def counted(**kwargs: Any) -> str | None:
        # One step (a delivery may run several: driver.operation_run_step).
        stage = _stage(kwargs["operation_id"])
        passed.append(0)
        with CaptureQueriesContext(connection) as ctx:
            chained = real(**kwargs)
        seen.append((stage, _table_statements(ctx.captured_queries)))
        clock_reads.append(_clock_reads(ctx.captured_queries))
        return chained

    def journalled(op: Any, outcome: Any, now: Any, **kwargs: Any) -> Any:
        # The stages the step ran and ended before the one it reports (StepMachine.follows).
        passed[-1] = len(outcome.result.passed)
        return journal(op, outcome, now, **kwargs)

    monkeypatch.setattr(driver, "_run_one", counted)
    monkeypatch.setattr(driver, "journal_step", journalled)
    # The database clock is read once per anchor (services.clock), not by every step: the
    # anchor is made long enough to cover the create on a slow machine.
    monkeypatch.setattr(clock, "ANCHOR_SECONDS", 3600.0)
    clock.forget_anchor()
    pump.run()

    proxy = Proxy.objects.get(name="p0")
    assert proxy.phase == Phase.RUNNING and proxy.ip
    # The receipts are still journalled before the waits: every task stage kept its UPID.
    upids = dict(OperationStep.objects.filter(operation__proxy=proxy).values_list("name", "upid"))
    assert all(upids[name] for name in ("clone", "upload", "resize", "start")), upids
    polls = [
        (stage, len(sql) - _extra(sql, n))
        for (stage, sql), n in zip(seen, passed, strict=True)
        if stage.endswith("_wait")
    ]
    assert len(polls) >= 4, seen
    ending = max(i for i, (stage, _) in enumerate(seen) if stage == "start_wait")
    over = [
        (stage, sql)
        for i, (stage, sql) in enumerate(seen)
        if i and len(sql) - _extra(sql, passed[i]) > STEP_BUDGET + (MET if i == ending else 0)
    ]
    assert not over, [(stage, len(sql), sql) for stage, sql in over]
    assert "running" not in [stage for stage, _ in seen], [stage for stage, _ in seen]
    # The config write, the resize and the start run in the step that saw the task before them
    # end: none is a step of its own.
    assert not {"configure", "resize", "start"} & {stage for stage, _ in seen}, seen
    # No maintenance switch is on in the cluster: the operation's own read says so, and no step
    # asks the switches table itself (it did once per writing step).
    asked = [stage for stage, sql in seen for q in sql if _switch_read(q)]
    assert not asked, asked
    last_start = max(i for i, (stage, _) in enumerate(polls) if stage == "start_wait")
    # A poll whose step went on to submit the next task (CreateMachine.follows) is a
    # submitting step too, with any step's budget.
    followed = [
        n > 0 for (stage, _), n in zip(seen, passed, strict=True) if stage.endswith("_wait")
    ]
    budgets = [
        (STEP_BUDGET if followed[i] else POLL_BUDGET) + (MET if i == last_start else 0)
        for i in range(len(polls))
    ]
    assert any(followed), polls
    assert all(n <= budget for (_, n), budget in zip(polls, budgets, strict=True)), polls
    # PostgreSQL's clock, once for the whole create (each step read it two or three times);
    # SQLite's is the local clock and is never read.
    assert sum(clock_reads) <= (1 if connection.vendor == "postgresql" else 0), clock_reads
