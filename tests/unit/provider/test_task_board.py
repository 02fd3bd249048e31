"""One look at a node's task list answers for every task of ours there (issue 12, ``task_board``).

Driven on the in-process simulator with a manual clock: clones of the template on one node, some
ended and one running; the simulator's ledger counts what each look cost.
"""

from __future__ import annotations

from typing import Any

import pytest
from provider_world import GOOD_TEMPLATE, World

from provisioning.proxmox import task_board
from provisioning.proxmox.steps import ENDED_ELSEWHERE, TIMING, StepResult, poll_task
from provisioning.proxmox.task_board import TaskBoard
from provisioning.proxmox.tasks import listed_outcome, read_task

LIST = "GET /nodes/{node}/tasks"
STATUS = "GET /nodes/{node}/tasks/{upid}/status"


def _clones(world: World, count: int, *, gap: float = 30.0) -> list[str]:
    """``count`` clones on pve1, each submitted ``gap`` seconds after the one before: all but
    the last have ended by the time the last is submitted."""
    upids = []
    for n in range(count):
        if n:
            world.engine.control.advance(gap)
        upids.append(world.api.clone("pve1", GOOD_TEMPLATE, newid=4000 + n, name=f"board-{n}"))
    return upids


def _requests(world: World) -> list[str]:
    return [str(e.key) for e in world.engine.ledger.calls()]


def test_one_list_answers_for_every_task_of_ours_on_the_node(world: World) -> None:
    older, old, newest = _clones(world, 3)
    board = TaskBoard(lambda node, upid: [older, old, newest])
    world.engine.ledger.clear()

    look = board.look(world.api, newest, clock=world.clock)

    assert look.seen.outcome.state == "running"
    assert set(look.ended) == {older, old}
    assert _requests(world) == [LIST]
    sent = world.engine.ledger.calls()[0].params
    assert sent["source"] == "all"
    assert sent["userfilter"] == "proxyhub@pve"  # the user, whatever its token
    assert int(sent["since"]) == min(int(u.split(":")[4], 16) for u in (older, old, newest))

    # The ended tasks' polls read nothing: the board saw them end, and an end cannot go stale.
    world.engine.ledger.clear()
    remembered = board.look(world.api, older, clock=world.clock)
    assert _requests(world) == []
    assert remembered.seen.outcome == read_task(world.api, older)
    # Timed by the look that saw it: what the wait learns (``steps.with_timing``).
    assert (remembered.seen.sent, remembered.seen.landed) == (look.seen.sent, look.seen.landed)
    world.engine.ledger.clear()
    # Once: a second poll of the same task (another attempt, another process) reads again.
    board.look(world.api, older, clock=world.clock)
    assert _requests(world) == [LIST]


def test_a_node_with_no_other_task_of_ours_costs_one_status_read(world: World) -> None:
    (only,) = _clones(world, 1)
    board = TaskBoard(lambda node, upid: [])
    world.engine.ledger.clear()
    look = board.look(world.api, only, clock=world.clock)
    assert look.seen.outcome.state == "running"
    assert look.ended == ()
    assert _requests(world) == [STATUS]


def test_tasks_on_other_nodes_are_not_asked_of_this_one(world: World) -> None:
    (here,) = _clones(world, 1)
    elsewhere = here.replace("UPID:pve1:", "UPID:pve2:")
    board = TaskBoard(lambda node, upid: [elsewhere])
    world.engine.ledger.clear()
    board.look(world.api, here, clock=world.clock)
    assert _requests(world) == [STATUS]


def test_a_task_the_list_does_not_show_is_never_taken_for_ended(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A list cut at its limit shows the newest task only: the oldest (this poll's own) is read
    # on its own, and the middle one, not shown, is neither ended nor remembered.
    older, old, newest = _clones(world, 3)
    monkeypatch.setattr(task_board, "LIST_LIMIT", 1)
    board = TaskBoard(lambda node, upid: [older, old, newest])
    world.engine.ledger.clear()

    look = board.look(world.api, older, clock=world.clock)

    assert look.seen.outcome.state == "ok"
    assert look.ended == ()
    assert _requests(world) == [LIST, STATUS]
    # A UPID the node never ran is not an end either.
    ghost = old.replace(":qmclone:", ":qmstart:")
    board = TaskBoard(lambda node, upid: [ghost])
    assert board.look(world.api, newest, clock=world.clock).ended == ()


def test_the_poll_names_the_ended_tasks_for_the_caller_to_wake(world: World) -> None:
    older, newest = _clones(world, 2)
    board = TaskBoard(lambda node, upid: [older])
    since = world.clock()

    def poll() -> StepResult:
        return poll_task(
            world.api,
            {"stage": "clone_wait", "upid": newest, "since": since},
            step="clone_wait",
            op="create",
            budget=600.0,
            poll_interval=1.0,
            next_stage="config",
            clock=world.clock,
            board=board,
        )

    result = poll()
    assert result.status == "wait"
    assert result.details[ENDED_ELSEWHERE] == [older]
    # Its own end, seen in the same way, teaches its wait as a status read would.
    world.engine.control.advance(30.0)
    ended = poll()
    assert ended.status == "continue"
    assert ended.details[TIMING]["seen_done"] == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("entry", "state", "exitstatus"),
    [
        ({"status": "RUNNING"}, "running", ""),
        ({"status": "OK"}, "running", ""),  # no end time: not over, whatever the status says
        ({"status": "OK", "endtime": 1}, "ok", "OK"),
        ({"status": "WARNINGS: 2", "endtime": 1}, "warnings", "WARNINGS: 2"),
        ({"status": "unable to create VM 200", "endtime": 1}, "failed", "unable to create VM 200"),
        ({"endtime": 1}, "running", ""),
    ],
)
def test_a_listed_entry_reads_as_its_status_read_would(
    entry: dict[str, Any], state: str, exitstatus: str
) -> None:
    outcome = listed_outcome("UPID:x", entry)
    assert (outcome.state, outcome.exitstatus) == (state, exitstatus)


def test_every_listed_task_agrees_with_its_own_status_read(world: World) -> None:
    upids = _clones(world, 4, gap=0.3)
    # VM 200 exists already: a clone onto it fails in its task, with Proxmox's text.
    upids.append(world.api.clone("pve1", GOOD_TEMPLATE, newid=200, name="taken"))
    world.engine.control.advance(0.2)
    listing = world.api.node_tasks("pve1", source="all", limit=50)
    listed = {str(e["upid"]): e for e in listing}
    states = set()
    for upid in upids:
        from_list = listed_outcome(upid, listed[upid])
        assert from_list == read_task(world.api, upid)
        states.add(from_list.state)
    assert states == {"running", "ok", "failed"}  # every kind was compared
