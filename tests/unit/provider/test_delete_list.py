"""Delete (seed 000 entry 11), list (entry 12) and orphan seeds over the in-process simulator."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from provider_world import GOOD_TEMPLATE, World

from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.errors import NotFoundError, PermanentError
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.seed import seed_iso_name

DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
VOLUME = "DELETE /nodes/{node}/storage/{storage}/content/{volume}"
STOP = "POST /nodes/{node}/qemu/{vmid}/status/stop"
CONFIG = "GET /nodes/{node}/qemu/{vmid}/config"
WHEN = datetime(2026, 11, 1, tzinfo=UTC)


def _created(world: World, name: str, zone: str = "pve1") -> tuple[str, str, int]:
    req = world.request(name, zone=zone)
    done = world.create(req)
    assert done.status == "done", done.error
    world.settle()
    return str(done.provider_id), req.uid, int(str(done.provider_id).split("/")[1])


def _delete(world: World, provider_id: str, uid: str) -> None:
    result = world.delete(DeleteRequest.from_provider_id(provider_id, uid))
    assert result.status == "done", result.error


def test_get_after_delete_returns_not_found(world: World) -> None:
    provider_id, uid, _ = _created(world, "del")
    _delete(world, provider_id, uid)
    with pytest.raises(NotFoundError):
        world.provider.get(provider_id)
    assert world.vms_named("proxy-del") == []
    seeds = world.api.storage_content("pve1", "proxy-seeds", content="iso")
    assert not [s for s in seeds if "proxy-del-seed.iso" in s["volid"]]


def test_delete_twice_succeeds(world: World) -> None:
    provider_id, uid, _ = _created(world, "twice")
    _delete(world, provider_id, uid)
    destroys = world.engine.ledger.count("DELETE", DESTROY)
    _delete(world, provider_id, uid)
    assert world.engine.ledger.count("DELETE", DESTROY) == destroys == 1


@pytest.mark.parametrize("bad", ["", "vms/123", "vms/abc/x", "vms/123/a/b", "xyz/123/a"])
def test_delete_malformed_id_is_permanent(world: World, bad: str) -> None:
    with pytest.raises(PermanentError):
        world.provider.delete(bad)
    assert world.engine.ledger.calls() == []


def test_delete_seed_delete_is_task_and_idempotent(world: World) -> None:
    provider_id, uid, _ = _created(world, "seedy", zone="pve2")
    _delete(world, provider_id, uid)
    seed_deletes = world.engine.ledger.calls("DELETE", VOLUME)
    # On the VM's node only, as an imgdel task.
    assert [e.path_params["node"] for e in seed_deletes] == ["pve2"]
    assert seed_deletes[0].upid and ":imgdel:" in seed_deletes[0].upid
    # The volume is gone; deleting the seed again is still a successful task.
    world.engine.ledger.clear()
    _delete(world, provider_id, uid)
    again = world.engine.ledger.calls("DELETE", VOLUME)
    assert [e.path_params["node"] for e in again] == ["pve1", "pve2", "pve3"]
    for entry in again:
        assert world.api.task_status(entry.path_params["node"], entry.upid)["exitstatus"] == "OK"


def test_get_during_delete_still_returns_instance(world: World) -> None:
    provider_id, uid, _ = _created(world, "during")
    world.settle(30)
    req = DeleteRequest.from_provider_id(provider_id, uid)
    progress = world.provider.new_delete_progress()
    seen = []
    while True:
        result = world.step(lambda p: world.provider.delete_step(req, p), progress)
        progress = result.progress
        if progress["stage"] in ("stop_wait", "destroy"):
            seen.append(world.provider.get(provider_id).state)
        if progress["stage"] == "destroy_wait":
            break
    # The VM is reported (Running, then Stopped) until the destroy task removes it.
    assert seen[0] in ("Running", "Stopped") and seen[-1] == "Stopped"
    world.drive(lambda p: world.provider.delete_step(req, p), progress)
    with pytest.raises(NotFoundError):
        world.provider.get(provider_id)


def test_delete_late_never_destroys_a_reused_vmid(world: World) -> None:
    """Our VM is destroyed behind our back and a foreign VM takes its VMID; a delete replayed
    late (twice) must leave the newcomer alone (CAPMOX #856)."""
    provider_id, uid, vmid = _created(world, "stale")
    req = DeleteRequest.from_provider_id(provider_id, uid)
    progress = world.provider.new_delete_progress()
    first = world.step(lambda p: world.provider.delete_step(req, p), progress)
    assert first.progress["stage"] == "stop"  # inspected: ours, running
    # Behind proxyhub's back: stop, destroy, and a new VM on the same VMID.
    world.api.stop("pve1", vmid)
    world.engine.control.advance(5)
    world.api.destroy("pve1", vmid)
    world.engine.control.advance(5)
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name="newcomer")
    world.engine.control.advance(30)
    world.engine.ledger.clear()
    for _ in range(2):
        done = world.drive(lambda p: world.provider.delete_step(req, p), first.progress)
        assert done.status == "done"
    assert world.engine.ledger.count("DELETE", DESTROY) == 0
    assert world.engine.ledger.count("POST", STOP) == 0
    assert world.api.vm_config("pve1", vmid)["name"] == "newcomer"
    assert any("reused" in r.message for r in world.results)


def test_delete_of_a_vm_gone_between_its_config_and_status_reads_goes_on(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A destroy whose reply was lost ends between the recheck's config read and its status
    read: the status read's "does not exist" means the VM is gone, so the delete goes on to the
    seed instead of failing the step as a fault (found by the service tier under load)."""
    provider_id, uid, vmid = _created(world, "racing")
    req = DeleteRequest.from_provider_id(provider_id, uid)
    first = world.step(
        lambda p: world.provider.delete_step(req, p), world.provider.new_delete_progress()
    )
    assert first.progress["stage"] == "stop"
    status = world.provider.api.vm_status

    def destroyed_meanwhile(node: str, vmid_: int, **kwargs: object) -> dict[str, object]:
        monkeypatch.setattr(world.provider.api, "vm_status", status)
        world.api.stop(node, vmid_)
        world.engine.control.advance(5)
        world.api.destroy(node, vmid_)
        world.engine.control.advance(5)
        return status(node, vmid_, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(world.provider.api, "vm_status", destroyed_meanwhile)
    # A lost reply leaves a cold record (issue 12): a fresh provider reads the status back.
    resumed = world.fresh_provider()
    gone = world.step(lambda p: resumed.delete_step(req, p), first.progress)
    assert gone.status == "continue" and gone.progress["stage"] == "seed", gone.error
    assert f"VM {vmid} is gone" in gone.message
    done = world.drive(lambda p: world.provider.delete_step(req, p), gone.progress)
    assert done.status == "done"
    seeds = world.api.storage_content("pve1", "proxy-seeds", content="iso")
    assert not [s for s in seeds if "proxy-racing-seed.iso" in s["volid"]]


def test_delete_foreign_vm_with_our_name_is_left_alone(world: World) -> None:
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150010, name="proxy-foreign")
    world.settle()
    result = world.delete(DeleteRequest(vm_name="proxy-foreign", uid="u-1", vmid=150010))
    assert result.status == "done"
    assert world.engine.ledger.count("DELETE", DESTROY) == 0
    assert world.api.vm_config("pve1", 150010)["name"] == "proxy-foreign"


def test_delete_another_proxys_vm_with_same_name_is_left_alone(world: World) -> None:
    mark = render_mark("other-uid", WHEN, "inst-test")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150011, name="proxy-same", description=mark)
    world.settle()
    result = world.delete(DeleteRequest(vm_name="proxy-same", uid="my-uid", vmid=150011))
    assert result.status == "done"
    assert world.engine.ledger.count("DELETE", DESTROY) == 0


def test_delete_hibernated_vm_of_ours_is_permanent(world: World) -> None:
    provider_id, uid, vmid = _created(world, "hib")
    world.engine.control.hibernate_vm(vmid)
    result = world.delete(DeleteRequest.from_provider_id(provider_id, uid))
    assert isinstance(result.error, PermanentError)
    assert "resume or destroy" in str(result.error)


def test_delete_waits_for_a_lock(world: World) -> None:
    provider_id, uid, vmid = _created(world, "lockwait")
    world.engine.control.set_lock(vmid, "backup")
    req = DeleteRequest.from_provider_id(provider_id, uid)
    progress = world.provider.new_delete_progress()
    result = world.step(lambda p: world.provider.delete_step(req, p), progress)
    assert result.status == "wait" and "locked (backup)" in result.message
    world.engine.control.clear_lock(vmid)
    assert (
        world.drive(lambda p: world.provider.delete_step(req, p), result.progress).status == "done"
    )
    assert world.engine.ledger.count("DELETE", DESTROY) == 1


def test_list_managed_excludes_unmarked_vms(world: World) -> None:
    provider_id, uid, _ = _created(world, "listed")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150020, name="proxy-unmarked")
    other = render_mark("x-uid", WHEN, "other-installation")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150021, name="proxy-theirs", description=other)
    world.settle()
    listed = world.provider.list_managed()
    assert [(m.provider_id, m.uid) for m in listed] == [(provider_id, uid)]
    # Default foreign VMs (proxy-legacy without a mark, another installation's) stay out too.
    assert all(m.name == "proxy-listed" for m in listed)


def test_list_managed_empty_uid_still_listed(world: World) -> None:
    description = "proxyhub-managed=true\nproxyhub-installation=inst-test"
    world.api.clone(
        "pve1", GOOD_TEMPLATE, newid=150030, name="proxy-nouid", description=description
    )
    world.settle()
    listed = world.provider.list_managed()
    assert [(m.vmid, m.uid, m.created_at) for m in listed] == [(150030, "", None)]


def test_list_managed_uses_one_listing_and_skips_nameless(world: World) -> None:
    _created(world, "one")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150040, name="proxy-midclone")  # still nameless
    world.engine.ledger.clear()
    listed = world.provider.list_managed()
    assert [m.name for m in listed] == ["proxy-one"]
    assert world.engine.ledger.count("GET", "GET /cluster/resources") == 1


def test_list_managed_reads_no_config_of_a_name_the_caller_settled(world: World) -> None:
    _created(world, "settled")
    _created(world, "open")
    vmids = {m.name: m.vmid for m in world.provider.list_managed()}
    world.engine.ledger.clear()
    listed = world.provider.list_managed(skip_names={"proxy-settled"})
    assert [m.name for m in listed] == ["proxy-open"]
    assert world.engine.ledger.count("GET", CONFIG, vmid=vmids["proxy-settled"]) == 0
    assert world.engine.ledger.count("GET", CONFIG, vmid=vmids["proxy-open"]) == 1


def test_orphan_seeds_are_this_installations_without_a_vm(world: World) -> None:
    """Only seeds named for this installation are candidates: another installation's and the
    legacy ``proxy-<name>-seed.iso`` (which names no installation) are never orphans here."""
    _created(world, "keep")
    uid = "0123abcd-ef01-4a23-8b45-6789abcdef01"
    ours = seed_iso_name("proxy-orphan", installation_id="inst-test", uid=uid)
    kept = seed_iso_name("proxy-keep", installation_id="inst-test", uid=uid)
    theirs = seed_iso_name("proxy-orphan", installation_id="inst-other", uid=uid)
    for name in (ours, kept, theirs, "proxy-orphan-seed.iso", "not-a-seed.iso"):
        world.api.upload_iso("pve2", "proxy-seeds", filename=name, content=b"x" * 2048)
    world.settle()
    orphans = world.provider.list_orphan_seeds()
    assert [(o.node, o.volid, o.vm_name, o.uid_tag) for o in orphans] == [
        ("pve2", f"proxy-seeds:iso/{ours}", "proxy-orphan", "0123abcdef01")
    ]
    assert orphans[0].ctime is not None
