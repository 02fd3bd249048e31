"""Seed 000 cases that had no test of their own (issue 13, "Missing tests"), one test each,
named for the case and citing the entry it comes from."""

from __future__ import annotations

import logging

import pytest
from provider_world import GOOD_TEMPLATE, World, make_world

from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.errors import PermanentError, TransientError
from provisioning.proxmox.ids import MAX_ATTEMPTS, vmid_for

CLONE = "/nodes/{node}/qemu/{vmid}/clone"
VOLUME = "DELETE /nodes/{node}/storage/{storage}/content/{volume}"


def test_entry_2_two_vms_with_the_name_are_permanent_and_listed_by_vmid(world: World) -> None:
    """Entry 2: more than one VM carries the proxy's name; proxyhub cannot tell which is its
    own, so the create ends permanently and names every VMID for the operator."""
    for vmid in (150200, 150100):
        world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name="proxy-twice")
    world.settle(30)
    world.engine.ledger.clear()
    result = world.create(world.request("twice"))
    assert isinstance(result.error, PermanentError)
    assert "2 VMs are named proxy-twice (VMIDs 150100, 150200)" in str(result.error)
    assert world.engine.ledger.mutations() == []


def test_entry_2_no_free_vmid_after_32_probes_is_transient_and_names_the_range() -> None:
    """Entry 2: every one of the 32 candidate VMIDs is taken by someone else's VM. That can heal
    (VMs get removed, the range widened), so it is transient, and it names the range."""
    world = make_world(vmidRange={"min": 100000, "max": 100031})
    world.engine.control.create_vms(
        32, start_vmid=100000, node="pve2", name_prefix="other-", tags=None
    )
    req = world.request("crowded")
    candidates = {vmid_for(req.uid, a, 100000, 100031) for a in range(MAX_ATTEMPTS)}
    assert candidates <= set(range(100000, 100032))
    world.engine.ledger.clear()
    result = world.create(req)
    assert type(result.error) is TransientError
    assert f"after {MAX_ATTEMPTS} attempts in 100000-100031" in str(result.error)
    assert world.engine.ledger.mutations() == []


def test_entry_2_our_hibernated_vm_found_by_create_is_permanent(world: World) -> None:
    """Entry 2: create finds its own VM hibernated to disk (``lock: suspended``). That lock
    never clears by itself and starting it would resume a stale memory image: permanent."""
    req = world.request("sleeper")
    first = world.create(req)
    assert first.status == "done", first.error
    vmid = int(str(first.provider_id).split("/")[1])
    world.engine.control.hibernate_vm(vmid)
    world.settle(30)
    world.engine.ledger.clear()
    again = world.create(req)
    assert isinstance(again.error, PermanentError)
    assert "hibernated (lock: suspended)" in str(again.error)
    assert world.engine.ledger.mutations() == []


@pytest.mark.parametrize("setting", [{"bridge": "vmbr1"}, {"vlanTag": 4}])
def test_entry_4_template_without_net0_is_refused_when_a_bridge_or_vlan_is_set(
    setting: dict[str, object],
) -> None:
    """Entry 4: with ``bridge`` or ``vlanTag`` set, the configure step rewrites the copy's
    net0; a template without one is refused before the clone."""
    world = make_world(**setting)
    world.engine.cluster.guests[GOOD_TEMPLATE].config.pop("net0")
    result = world.create(world.request("nonet"))
    assert isinstance(result.error, PermanentError)
    assert f"template {GOOD_TEMPLATE} has no net0" in str(result.error)
    assert world.engine.ledger.mutations() == []


def test_entry_4_a_template_missing_from_the_cluster_is_permanent() -> None:
    """Entry 4: the catalogue names a template VMID the cluster does not have."""
    world = make_world(templates={"debian-13": {"vmid": 9999}})
    result = world.create(world.request("orphaned"))
    assert isinstance(result.error, PermanentError)
    assert "template VM 9999 does not exist in cluster pvesim" in str(result.error)
    assert world.engine.ledger.mutations() == []


def test_entry_11_every_node_seed_delete_skips_a_failing_node_and_logs_it(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Entry 11 step 7: with no VM of ours left to say where the seed is, the seed is deleted on
    every node; a node that fails is skipped and logged, and the others still get theirs."""
    caplog.set_level(logging.INFO, logger="proxyhub.proxmox")
    req = world.request("everywhere", zone="pve3")
    done = world.create(req)
    assert done.status == "done", done.error
    world.settle()
    vmid = int(str(done.provider_id).split("/")[1])
    world.api.stop("pve3", vmid)
    world.settle(30)
    world.api.destroy("pve3", vmid)  # gone out of band: the delete cannot know the node
    world.settle(30)
    world.engine.ledger.clear()
    world.engine.control.fail_call(
        "DELETE",
        VOLUME.split(" ", 1)[1],
        kind="status",
        status=500,
        message="storage 'proxy-seeds' is not online",
    )
    result = world.delete(DeleteRequest.from_provider_id(str(done.provider_id), req.uid))
    assert result.status == "done", result.error
    tried = [e.path_params["node"] for e in world.engine.ledger.calls("DELETE", VOLUME)]
    assert tried == ["pve1", "pve2", "pve3"]
    (skipped,) = [r for r in caplog.records if r.getMessage() == "proxmox seed delete skipped"]
    assert skipped.node == "pve1" and "not online" in skipped.reason  # type: ignore[attr-defined]
    seeds = world.api.storage_content("pve3", "proxy-seeds", content="iso")
    assert not [s for s in seeds if "proxy-everywhere-seed.iso" in s["volid"]]
