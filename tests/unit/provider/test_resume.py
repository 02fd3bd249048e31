"""Crash anywhere, resume from the record alone: seed 000 entry 10's "what a retry finds".

For every step of a create (and of a delete) the machine is stopped twice over:

* after the step, with its record persisted: a fresh provider continues from that record;
* inside a step that submitted a mutation, before its record was persisted (the reply was
  lost with the worker): a fresh provider continues from the record *before* it.

Each run must end with exactly one VM, running, and no mutation applied twice. The only
mutation that may repeat is the seed upload whose reply was lost: it overwrites the same file
with the same bytes (entry 10: "upload overwrites").
"""

from __future__ import annotations

from collections import Counter

import pytest
from provider_world import World, make_world

from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.steps import Progress, StepResult

UPLOAD = "POST /nodes/{node}/storage/{storage}/upload"


def _mutations(world: World) -> Counter[str]:
    return Counter(str(e.key) for e in world.engine.ledger.mutations())


def _crash_points(results: list[StepResult]) -> list[tuple[int, bool]]:
    """Every step, with its record kept; and every submitting step, with its reply lost."""
    after = [(i, False) for i in range(len(results))]
    lost = [(i, True) for i, r in enumerate(results) if r.submitted]
    return after + lost


def _clean_create() -> tuple[list[tuple[int, bool]], Counter[str]]:
    world = make_world()
    world.create(world.request("resume"))
    return _crash_points(world.results), _mutations(world)


CREATE_POINTS, CREATE_MUTATIONS = _clean_create()


@pytest.mark.parametrize(
    ("crash_at", "lost_reply"),
    CREATE_POINTS,
    ids=[f"step{i}-{'lost-reply' if lost else 'after'}" for i, lost in CREATE_POINTS],
)
def test_create_resumes_after_each_step(crash_at: int, lost_reply: bool) -> None:
    world = make_world()
    req = world.request("resume")
    progress: Progress = world.provider.new_create_progress()
    for _ in range(crash_at):
        progress = world.step(lambda p: world.provider.create_step(req, p), progress).progress
    crashed = world.step(lambda p: world.provider.create_step(req, p), progress)
    assert crashed.submitted or not lost_reply
    if not lost_reply:
        progress = crashed.progress
    if crashed.status == "done" and not lost_reply:
        result = crashed
    else:
        result = world.drive(lambda p: world.fresh_provider().create_step(req, p), progress)

    assert result.status == "done", result.error
    world.settle()
    vms = world.vms_named("proxy-resume")
    assert len(vms) == 1 and vms[0]["status"] == "running"
    assert result.provider_id == f"vms/{vms[0]['vmid']}/proxy-resume"

    mutations = _mutations(world)
    repeated_upload = lost_reply and crashed.step == "upload"
    for key, count in CREATE_MUTATIONS.items():
        expected = count + 1 if key == UPLOAD and repeated_upload else count
        assert mutations[key] == expected, (key, mutations)
    assert set(mutations) == set(CREATE_MUTATIONS)


def _clean_delete() -> tuple[list[tuple[int, bool]], Counter[str]]:
    world = make_world()
    done = world.create(world.request("gone"))
    world.settle()
    world.engine.ledger.clear()
    world.results.clear()
    world.delete(DeleteRequest.from_provider_id(str(done.provider_id), world.request("gone").uid))
    return _crash_points(world.results), _mutations(world)


DELETE_POINTS, DELETE_MUTATIONS = _clean_delete()


@pytest.mark.parametrize(
    ("crash_at", "lost_reply"),
    DELETE_POINTS,
    ids=[f"step{i}-{'lost-reply' if lost else 'after'}" for i, lost in DELETE_POINTS],
)
def test_delete_resumes_after_each_step(crash_at: int, lost_reply: bool) -> None:
    world = make_world()
    created = world.create(world.request("gone"))
    world.settle()
    world.engine.ledger.clear()
    req = DeleteRequest.from_provider_id(str(created.provider_id), world.request("gone").uid)
    progress: Progress = world.provider.new_delete_progress()
    for _ in range(crash_at):
        progress = world.step(lambda p: world.provider.delete_step(req, p), progress).progress
    crashed = world.step(lambda p: world.provider.delete_step(req, p), progress)
    assert crashed.submitted or not lost_reply
    if not lost_reply:
        progress = crashed.progress
    if not (crashed.status == "done" and not lost_reply):
        result = world.drive(lambda p: world.fresh_provider().delete_step(req, p), progress)
        assert result.status == "done", result.error

    world.settle()
    assert world.vms_named("proxy-gone") == []
    seeds = world.api.storage_content("pve1", "proxy-seeds", content="iso")
    assert not [s for s in seeds if "proxy-gone-seed.iso" in s["volid"]]
    mutations = _mutations(world)
    # Stop and destroy are observed before they are sent, so none repeats; a seed delete
    # whose reply was lost runs again, and deleting a missing volume changes nothing.
    for key in ("POST /nodes/{node}/qemu/{vmid}/status/stop", "DELETE /nodes/{node}/qemu/{vmid}"):
        assert mutations[key] == DELETE_MUTATIONS[key], (key, mutations)
