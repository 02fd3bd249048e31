"""A start's wait on a busy node reads the node's task list, not its VM's status (issue 12).

The issue's second batched read: one look answers for every VM a fleet is starting. Proxmox's
``/cluster/resources`` is the wrong look for it: its ``status`` comes from pvestatd and lags up to
10 s behind the VM (pve-reference §7.9, §8 item 5), so a create that waited for it would end
seconds late. The ``qmstart`` task's end is the same fact, live: ``vm_start`` ends once QEMU
runs (§7.16). So a start's wait on a node where other tasks of ours run looks at its task
through the board (``task_board``), one list for all of them, and an end the board already saw
costs no request at all. On a node with nothing else of ours the status read stays the one read.

Driven on the in-process simulator with a manual clock, as ``test_task_board``.
"""

from __future__ import annotations

from typing import Any

from provider_world import GOOD_TEMPLATE, World

from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.steps import ENDED_ELSEWHERE, TIMING, Progress, StepResult
from provisioning.proxmox.task_board import TaskBoard

LIST = "GET /nodes/{node}/tasks"
TASK = "GET /nodes/{node}/tasks/{upid}/status"
STATUS = "GET /nodes/{node}/qemu/{vmid}/status/current"


class Board:
    """A board whose tasks in flight are what the test says (the services read the slots)."""

    def __init__(self) -> None:
        self.in_flight: list[str] = []
        self.board = TaskBoard(lambda node, upid: list(self.in_flight))


def _provider(world: World, board: TaskBoard) -> Provider:
    return Provider(
        world.api, world.config, budgets=Budgets(poll_interval=0.05), clock=world.clock, board=board
    )


def _to_start_wait(world: World, provider: Provider, name: str) -> Progress:
    """A create of ``name`` driven until its start was submitted: the record its wait runs."""
    req = world.request(name)
    progress = provider.new_create_progress()
    for _ in range(200):
        result = world.step(lambda pr: provider.create_step(req, pr), progress)
        progress = result.progress
        if progress.get("stage") == "start_wait":
            return progress
        assert result.status not in ("done", "error"), result
    raise AssertionError("the create never submitted its start")


def _requests(world: World) -> list[str]:
    return [str(e.key) for e in world.engine.ledger.calls()]


def _other_clone(world: World) -> str:
    """A clone of ours on pve1 that runs for a while (another create's task)."""
    return world.api.clone("pve1", GOOD_TEMPLATE, newid=4100, name="neighbour")


def test_a_start_s_wait_beside_other_tasks_reads_the_node_s_list_not_the_vm(
    world: World,
) -> None:
    shared = Board()
    provider = _provider(world, shared.board)
    progress = _to_start_wait(world, provider, "listed")
    neighbour = _other_clone(world)
    shared.in_flight[:] = [neighbour]
    world.engine.control.advance(5.0)  # the start is over (and the neighbour's clone too)
    world.engine.ledger.clear()

    result = provider.create_step(world.request("listed"), progress)

    assert (result.status, result.step, result.met) == ("done", "running", "running")
    assert _requests(world) == [LIST]
    # The neighbour's end is named for the caller to wake, as any poll's board look does.
    assert result.details[ENDED_ELSEWHERE] == [neighbour]
    # The look times the start as the status read did (what later starts plan from).
    assert result.details[TIMING]["kind"] == "qmstart"
    # And the VM runs: the task's end is the fact the status read would have shown.
    vmid = int(str(result.provider_id).split("/")[1])
    status = world.api.vm_status("pve1", vmid)
    assert (status["status"], status["qmpstatus"]) == ("running", "running")


def test_a_start_the_board_saw_end_costs_its_wait_no_request(world: World) -> None:
    shared = Board()
    provider = _provider(world, shared.board)
    progress = _to_start_wait(world, provider, "woken")
    start = str(progress["upid"])
    neighbour = _other_clone(world)
    world.engine.control.advance(5.0)
    # The neighbour's poll looks first: one list, which sees this create's start end.
    shared.in_flight[:] = [start]
    look = shared.board.look(world.api, neighbour, clock=world.clock)
    assert look.ended == (start,)
    world.engine.ledger.clear()

    result = provider.create_step(world.request("woken"), progress)

    assert (result.status, result.met) == ("done", "running")
    assert _requests(world) == []


def test_a_start_still_running_in_the_list_waits_without_a_status_read(
    world_factory: Any,
) -> None:
    world = world_factory(profile="realistic")
    shared = Board()
    provider = _provider(world, shared.board)
    progress = _to_start_wait(world, provider, "slow")
    shared.in_flight[:] = [_other_clone(world)]
    world.engine.ledger.clear()

    waiting = provider.create_step(world.request("slow"), progress)

    assert (waiting.status, waiting.step) == ("wait", "start_wait")
    assert _requests(world) == [LIST]
    assert waiting.progress["seen_running"] is not None  # what the wait learns from
    result: StepResult = waiting
    for _ in range(100):
        world.engine.control.advance(max(result.delay, 0.05))
        result = provider.create_step(world.request("slow"), result.progress)
        if result.status != "wait":
            break
    assert (result.status, result.met) == ("done", "running")
    assert STATUS not in _requests(world)
    assert result.details[TIMING]["seen_running"] > 0  # bracketed: a measure, not a bound


def test_a_start_alone_on_its_node_still_reads_only_the_vm_s_status(world: World) -> None:
    shared = Board()
    provider = _provider(world, shared.board)
    progress = _to_start_wait(world, provider, "alone")
    world.engine.control.advance(5.0)
    world.engine.ledger.clear()

    result = provider.create_step(world.request("alone"), progress)

    assert (result.status, result.met) == ("done", "running")
    assert _requests(world) == [STATUS]


def test_a_start_whose_task_failed_in_the_list_is_judged_by_the_vm_s_status(
    world: World,
) -> None:
    """Started by someone else just before ours ran, the ``qmstart`` fails ("already
    running"), which is the outcome wanted: the failure is judged on the VM's status."""
    shared = Board()
    provider = _provider(world, shared.board)
    progress = _to_start_wait(world, provider, "beaten")
    # Undo our start, then start it "by hand" so that ours, sent again, fails in its task.
    vmid = int(progress["vmid"])
    world.engine.control.advance(5.0)
    world.api.stop("pve1", vmid)
    world.engine.control.advance(5.0)
    world.api.start("pve1", vmid)
    world.engine.control.advance(5.0)
    ours = world.api.start("pve1", vmid)
    world.engine.control.advance(5.0)
    shared.in_flight[:] = [_other_clone(world)]
    world.engine.ledger.clear()

    result = provider.create_step(world.request("beaten"), dict(progress, upid=ours))

    assert (result.status, result.step) == ("continue", "start_wait")
    assert result.message.startswith("start task failed but the VM runs")
    assert _requests(world) == [LIST, STATUS]
    ended = provider.create_step(world.request("beaten"), result.progress)
    assert (ended.status, ended.step) == ("done", "running")
