"""Two proxyhub installations sharing one cluster and its ISO storage (issue 11).

Each installation has a proxy named ``shared-1`` (so both VMs are ``proxy-shared-1``), with its
own uid. Neither may boot from the other's seed, and neither's delete may remove the other's.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from provider_world import GOOD_TEMPLATE, World, catalogue

from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.ids import vmid_for
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.seed import legacy_seed_iso_name, seed_iso_name

OTHER = "inst-other"
DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
WHEN = datetime(2026, 11, 1, tzinfo=UTC)


def _other(world: World) -> Provider:
    config = ProxmoxConfig.from_mapping(catalogue(), installation_id=OTHER)
    return Provider(world.api, config, budgets=world.provider.budgets, clock=world.clock)


def _request(world: World, marker: str) -> CreateRequest:
    return world.request(
        "shared-1", uid=str(uuid.uuid4()), cloud_init=f"#cloud-config\n# {marker}\n".encode()
    )


def _attached_seed(world: World, provider_id: str) -> bytes:
    vmid = int(provider_id.split("/")[1])
    volid = world.api.vm_config("pve1", vmid)["ide2"].split(",", 1)[0]
    data = world.engine.control.volume_data("pve1", volid)
    assert data is not None, f"{volid} is attached but not on the storage"
    return data


def test_two_installations_never_share_a_seed(world: World) -> None:
    """Both creates run at once (the second looks while the first's clone is nameless): each VM
    must boot from its own cloud-init, not from whichever upload came last."""
    other = _other(world)
    ours, theirs = _request(world, "canary-ours"), _request(world, "canary-theirs")
    progress = world.provider.new_create_progress()
    while progress.get("stage") != "clone_wait":
        progress = world.step(lambda p: world.provider.create_step(ours, p), progress).progress
    their_done = world.create(theirs, other)
    our_done = world.drive(lambda p: world.provider.create_step(ours, p), progress)
    assert our_done.status == their_done.status == "done"
    assert b"canary-ours" in _attached_seed(world, str(our_done.provider_id))
    assert b"canary-theirs" in _attached_seed(world, str(their_done.provider_id))


def test_a_delete_finding_no_vm_of_its_own_leaves_the_other_installations_seed(
    world: World,
) -> None:
    """`proxies delete shared-1` in the installation whose create never made a VM: the VM named
    proxy-shared-1 is the other installation's, and so is the seed it runs from."""
    ours = _request(world, "canary-ours")
    done = world.create(ours)
    assert done.status == "done", done.error
    world.settle()
    before = _attached_seed(world, str(done.provider_id))

    gone = world.delete(
        DeleteRequest(vm_name="proxy-shared-1", uid=str(uuid.uuid4())), _other(world)
    )
    assert gone.status == "done", gone.error
    assert world.engine.ledger.count("DELETE", DESTROY) == 0
    assert _attached_seed(world, str(done.provider_id)) == before


def test_seed_names_carry_installation_and_uid_and_parse_back() -> None:
    uid = "0123abcd-ef01-4a23-8b45-6789abcdef01"
    name = seed_iso_name("proxy-a-b-1", installation_id="inst-test", uid=uid)
    assert name.startswith("proxy-a-b-1_") and name.endswith("-seed.iso")
    assert "_0123abcdef01-" in name
    assert name != seed_iso_name("proxy-a-b-1", installation_id=OTHER, uid=uid)
    assert legacy_seed_iso_name("proxy-a-b-1") == "proxy-a-b-1-seed.iso"


def test_destroy_refuses_a_mark_without_uid(world: World) -> None:
    """A mark without a uid is not ours: the delete leaves the VM alone."""
    req = world.request("blank")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    mark = "proxyhub-managed=true\nproxyhub-installation=inst-test"
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name=req.vm_name, description=mark)
    world.settle(30)
    result = world.delete(DeleteRequest(vm_name=req.vm_name, uid=req.uid, vmid=vmid))
    assert result.status == "done", result.error
    assert world.engine.ledger.count("DELETE", DESTROY) == 0
    assert world.vms_named(req.vm_name)


def test_destroy_refuses_our_uid_under_another_installation(world: World) -> None:
    req = world.request("twin")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    mark = render_mark(req.uid, WHEN, OTHER)
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name=req.vm_name, description=mark)
    world.settle(30)
    result = world.delete(DeleteRequest(vm_name=req.vm_name, uid=req.uid, vmid=vmid))
    assert result.status == "done", result.error
    assert world.engine.ledger.count("DELETE", DESTROY) == 0


def test_create_never_adopts_a_uidless_mark_of_another_installation(world: World) -> None:
    req = world.request("theirs")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    mark = f"proxyhub-managed=true\nproxyhub-installation={OTHER}"
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name=req.vm_name, description=mark)
    world.settle(30)
    result = world.create(req)
    assert isinstance(result.error, PermanentError)
    assert OTHER in str(result.error)
    assert world.api.vm_config("pve1", vmid)["description"] == mark


@pytest.mark.parametrize("ours_references_it", [True, False])
def test_delete_removes_a_legacy_seed_only_when_our_vm_uses_it(
    world: World, ours_references_it: bool
) -> None:
    """A VM created by an earlier version boots from ``proxy-<name>-seed.iso``: the delete of
    that VM removes it; a delete that does not find it attached leaves the file alone."""
    req = world.request("oldform")
    done = world.create(req)
    assert done.status == "done", done.error
    vmid = int(str(done.provider_id).split("/")[1])
    legacy = f"proxy-seeds:iso/{legacy_seed_iso_name(req.vm_name)}"
    world.api.upload_iso(
        "pve1", "proxy-seeds", filename=legacy_seed_iso_name(req.vm_name), content=b"x" * 2048
    )
    world.settle()
    if ours_references_it:
        world.api.set_vm_config("pve1", vmid, {"ide2": f"{legacy},media=cdrom"})
    world.settle()
    result = world.delete(DeleteRequest.from_provider_id(str(done.provider_id), req.uid))
    assert result.status == "done", result.error
    left = {s["volid"] for s in world.api.storage_content("pve1", "proxy-seeds", content="iso")}
    assert (legacy in left) is not ours_references_it
