"""Warm records skip read-backs; cold ones never do (issue 12, ``steps.Tickets``)."""

from __future__ import annotations

from provider_world import World

from provisioning.proxmox.steps import Progress

START = "POST /nodes/{node}/qemu/{vmid}/status/start"
TASKS = "GET /nodes/{node}/tasks"


def _to_stage(world: World, stage: str) -> Progress:
    req = world.request("warm")
    progress = world.provider.new_create_progress()
    while progress.get("stage") != stage:
        progress = world.step(lambda p: world.provider.create_step(req, p), progress).progress
    return progress


def test_a_record_run_twice_in_one_process_is_read_back_the_second_time(world: World) -> None:
    """The start was sent, then the result could not be saved (the database failed): the
    same process runs the same record again. Its ticket was taken by the first run, so the
    second reads the node's tasks, finds the start and never sends it twice."""
    req = world.request("warm")
    record = _to_stage(world, "start")
    world.engine.ledger.clear()
    first = world.provider.create_step(req, record)
    assert first.submitted and world.engine.ledger.count("GET", TASKS) == 0
    again = world.provider.create_step(req, record)
    assert not again.submitted and again.upid == first.upid
    assert world.engine.ledger.count("GET", TASKS) == 1
    assert world.engine.ledger.count("POST", START) == 1


def test_a_record_from_another_process_is_read_back(world: World) -> None:
    req = world.request("warm")
    record = _to_stage(world, "start")
    world.engine.ledger.clear()
    world.fresh_provider().create_step(req, record)
    assert world.engine.ledger.count("GET", TASKS) == 1


def test_an_error_record_is_cold(world: World) -> None:
    """A lost start reply: the error record carries no ticket, so the retry in the same
    process reads the node's tasks and adopts the start it finds."""
    req = world.request("warm")
    record = _to_stage(world, "start")
    world.engine.control.drop_reply("POST", "/nodes/{node}/qemu/{vmid}/status/start")
    lost = world.provider.create_step(req, record)
    assert lost.status == "error" and "ticket" not in lost.progress
    done = world.drive(lambda p: world.provider.create_step(req, p), lost.progress)
    assert done.status == "done"
    assert [e.status for e in world.engine.ledger.calls("POST", START)] == [200]


def test_the_boot_watch_leaves_a_vm_that_is_not_the_one_created_to_the_full_read(
    world: World,
) -> None:
    req = world.request("watched")
    done = world.create(req)
    record, pid = done.progress, str(done.provider_id)
    world.settle(60)
    seen = world.provider.observe_boot(pid, record, uid=req.uid)
    assert seen is not None and seen.state == "Running" and seen.ip
    # Another VM's MAC (a reused VMID answers): not settled by the agent read.
    assert (
        world.provider.observe_boot(pid, dict(record, mac="BC:24:11:00:00:01"), uid=req.uid) is None
    )
    # Stopped: the agent says so, and only the full read decides.
    world.api.stop("pve1", int(record["vmid"]))
    world.settle(5)
    assert world.provider.observe_boot(pid, record, uid=req.uid) is None
    assert world.provider.get(pid).state == "Stopped"
    # A record without the MAC (an older version's) is never settled by the agent read.
    assert world.provider.observe_boot(pid, dict(record, mac=None), uid=req.uid) is None
