"""Releasing the seed ISO after boot (issue 11): ejected, removed, and never twice."""

from __future__ import annotations

from collections import Counter

import pytest
from provider_world import World, make_world

from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.release import ReleaseRequest
from provisioning.proxmox.steps import Progress, StepResult

CONFIG = "PUT /nodes/{node}/qemu/{vmid}/config"
VOLUME = "DELETE /nodes/{node}/storage/{storage}/content/{volume}"


def _booted(world: World, name: str = "rel") -> tuple[CreateRequest, ReleaseRequest]:
    req = world.request(name)
    done = world.create(req)
    assert done.status == "done", done.error
    world.settle(120)  # the agent installs from vendor-data and reports the address
    vmid = int(str(done.provider_id).split("/")[1])
    assert world.provider.get(str(done.provider_id)).state == "Running"
    return req, ReleaseRequest(req.vm_name, req.uid, vmid, "pve1", "pve1")


def _release(world: World, rel: ReleaseRequest, progress: Progress | None = None) -> StepResult:
    p = world.provider
    return world.drive(
        lambda pr: p.release_seed_step(rel, pr), progress or p.new_release_progress()
    )


def _seeds(world: World) -> set[str]:
    return {s["volid"] for s in world.api.storage_content("pve1", "proxy-seeds", content="iso")}


def _mutations(world: World) -> Counter[str]:
    return Counter(str(e.key) for e in world.engine.ledger.mutations())


def test_release_ejects_then_removes_and_the_guest_keeps_its_address(world: World) -> None:
    req, rel = _booted(world)
    volid = world.seed_volid(req)
    assert volid in _seeds(world)
    world.engine.ledger.clear()
    result = _release(world, rel)
    assert result.status == "done", result.error
    # Applied to the running VM at once, not left pending until the next start.
    sim = world.engine.control.vm(rel.vmid)
    assert sim["config"]["ide2"] == "none,media=cdrom"
    assert (sim["pending"], sim["pendingDelete"]) == ({}, [])
    assert volid not in _seeds(world)
    # One config write and one volume delete (plus the reads and the task poll).
    assert _mutations(world) == Counter({CONFIG: 1, VOLUME: 1})
    provider_id = f"vms/{rel.vmid}/{req.vm_name}"
    assert world.provider.get(provider_id).ip is not None
    # A reboot without the seed: the guest keeps the agent cloud-init installed, and its address.
    world.api.reboot("pve1", rel.vmid)
    world.settle(300)
    after = world.provider.get(provider_id)
    assert (after.state, after.ip) == ("Running", world.provider.get(provider_id).ip)
    assert after.ip is not None


def test_release_twice_changes_nothing_the_second_time(world: World) -> None:
    _, rel = _booted(world)
    assert _release(world, rel).status == "done"
    world.engine.ledger.clear()
    again = _release(world, rel)
    assert again.status == "done", again.error
    # The config holds no seed and the storage no volume: nothing is written at all.
    assert _mutations(world) == Counter()


def test_release_leaves_a_vm_that_is_not_ours_alone(world: World) -> None:
    req, rel = _booted(world)
    world.api.set_vm_config("pve1", rel.vmid, {"description": "someone else's now"})
    world.engine.ledger.clear()
    result = _release(world, rel)
    assert result.status == "done"
    assert _mutations(world) == Counter()
    assert world.seed_volid(req) in _seeds(world)


@pytest.mark.parametrize("path", [CONFIG, VOLUME], ids=["eject", "remove"])
def test_a_lost_reply_is_read_back_and_never_sent_again(path: str) -> None:
    world = make_world()
    req, rel = _booted(world)
    world.engine.ledger.clear()
    method, route = path.split(" ", 1)
    world.engine.control.drop_reply(method, route)
    first = _release(world, rel)
    assert first.status == "error" and first.error is not None and first.error.reply_lost
    done = world.drive(lambda pr: world.fresh_provider().release_seed_step(rel, pr), first.progress)
    assert done.status == "done", done.error
    assert _mutations(world) == Counter({CONFIG: 1, VOLUME: 1})
    assert world.seed_volid(req) not in _seeds(world)
    assert world.api.vm_config("pve1", rel.vmid)["ide2"] == "none,media=cdrom"


def _clean_release() -> list[tuple[int, bool]]:
    world = make_world()
    _, rel = _booted(world)
    world.results.clear()
    _release(world, rel)
    after = [(i, False) for i in range(len(world.results))]
    lost = [(i, True) for i, r in enumerate(world.results) if r.submitted]
    return after + lost


RELEASE_POINTS = _clean_release()


@pytest.mark.parametrize(
    ("crash_at", "lost_reply"),
    RELEASE_POINTS,
    ids=[f"step{i}-{'lost-reply' if lost else 'after'}" for i, lost in RELEASE_POINTS],
)
def test_release_resumes_after_each_step(crash_at: int, lost_reply: bool) -> None:
    """A worker dies after any step (record kept) or inside a submitting one (record lost):
    a fresh provider resumes, and nothing is applied twice nor any seed left behind."""
    world = make_world()
    req, rel = _booted(world)
    world.engine.ledger.clear()
    progress: Progress = world.provider.new_release_progress()
    for _ in range(crash_at):
        progress = world.step(lambda p: world.provider.release_seed_step(rel, p), progress).progress
    crashed = world.step(lambda p: world.provider.release_seed_step(rel, p), progress)
    resume_from = progress if lost_reply else crashed.progress
    if crashed.status != "done" or lost_reply:
        done = world.drive(
            lambda pr: world.fresh_provider().release_seed_step(rel, pr), resume_from
        )
        assert done.status == "done", done.error
    assert _mutations(world) == Counter({CONFIG: 1, VOLUME: 1})
    assert world.seed_volid(req) not in _seeds(world)
