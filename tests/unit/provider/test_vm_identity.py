"""Seed 001's identity (SMBIOS UUID and vmgenid) and seed 003's readiness rule, over the
in-process simulator. What was sent to Proxmox is read from the simulator's ledger."""

from __future__ import annotations

import pytest
from provider_world import World

from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.identity import Identity, IdentityMismatch, identity_of, smbios_uuid
from provisioning.proxmox.power_checks import PowerRequest

DOCKER0 = {
    "name": "docker0",
    "hardware-address": "02:42:ac:11:00:01",
    "ip-addresses": [{"ip-address": "172.17.0.1", "ip-address-type": "ipv4", "prefix": 16}],
}
TUN0 = {
    "name": "tun0",
    "hardware-address": "00:00:00:00:00:00",
    "ip-addresses": [{"ip-address": "10.8.0.1", "ip-address-type": "ipv4", "prefix": 24}],
}


def _made(world: World, name: str) -> tuple[str, int, Identity, str]:
    req = world.request(name)
    done = world.create(req)
    assert done.status == "done", done.error
    vmid = int(str(done.provider_id).split("/")[1])
    made = Identity(done.details["smbios_uuid"], done.details["vmgenid"])
    world.settle()
    return str(done.provider_id), vmid, made, req.uid


def test_create_returns_the_identity_proxmox_gave_the_clone(world: World) -> None:
    _, vmid, made, _ = _made(world, "idc")
    config = world.api.vm_config("pve1", vmid)
    assert made == identity_of(config)
    assert made.smbios_uuid and made.vmgenid
    template = identity_of(world.api.vm_config("pve1", 9000))
    assert made.smbios_uuid != template.smbios_uuid and made.vmgenid != template.vmgenid


def test_get_returns_the_identity_and_an_old_record_without_one_still_reads(world: World) -> None:
    provider_id, _, made, _ = _made(world, "idg")
    instance = world.provider.get(provider_id)  # an old record: nothing to compare
    assert Identity(instance.smbios_uuid, instance.vmgenid) == made
    assert world.provider.get(provider_id, identity=made).vmid == instance.vmid


def test_a_recreated_vm_is_a_mismatch_on_get_power_delete_and_adoption(world: World) -> None:
    provider_id, vmid, made, uid = _made(world, "idr")
    world.engine.control.recreate_vm(vmid)  # same name, same mark, same VMID
    world.settle()
    world.engine.ledger.clear()

    with pytest.raises(IdentityMismatch) as caught:
        world.provider.get(provider_id, identity=made)
    assert caught.value.kind == "permanent"
    assert "expected SMBIOS UUID " + made.smbios_uuid in caught.value.message
    assert "Accept the VM found" in caught.value.remediation

    for action in ("start", "shutdown", "reboot"):
        req = PowerRequest.from_provider_id(action, provider_id, uid, made)  # type: ignore[arg-type]
        preview = world.provider.inspect_power(req)
        assert preview.refusal and "not the VM proxyhub made" in preview.refusal
        result = world.drive(
            lambda p, r=req: world.provider.power_step(r, p), world.provider.new_power_progress()
        )
        assert result.status == "error" and isinstance(result.error, IdentityMismatch)

    delete = DeleteRequest(vm_name="proxy-idr", uid=uid, vmid=vmid, identity=made)
    result = world.delete(delete)
    assert result.status == "error" and isinstance(result.error, IdentityMismatch)

    create = world.create(world.request("idr", identity=made))
    assert create.status == "error" and isinstance(create.error, IdentityMismatch)

    assert world.mutations() == []  # nothing was started, stopped, destroyed or written
    assert world.api.vm_status("pve1", vmid)["status"] == "stopped"
    assert len(world.vms_named("proxy-idr")) == 1


def test_without_a_recorded_identity_the_recreated_vm_is_taken_as_before(world: World) -> None:
    """Old records keep working: name and mark decide until an identity is recorded."""
    provider_id, vmid, _, _ = _made(world, "ido")
    new = world.engine.control.recreate_vm(vmid)
    instance = world.provider.get(provider_id)
    assert instance.smbios_uuid == smbios_uuid(new["smbios1"])
    assert instance.vmgenid == new["vmgenid"]


def test_the_address_is_only_net0s_ipv4_with_docker_and_tun_listed_first(world: World) -> None:
    provider_id, vmid, made, _ = _made(world, "addr")
    world.engine.control.set_guest_interfaces(vmid, [DOCKER0, TUN0], first=True)
    world.settle(30)
    instance = world.provider.get(provider_id, identity=made)
    assert instance.state == "Running"
    assert instance.ip is not None and instance.ip.startswith("10.20.")


def test_net0_with_ipv6_only_keeps_waiting_while_docker_has_ipv4(world: World) -> None:
    provider_id, vmid, _, _ = _made(world, "v6")
    world.engine.control.set_guest_interfaces(vmid, [DOCKER0, TUN0], first=True, nic_ipv4=False)
    world.settle(30)
    instance = world.provider.get(provider_id)
    assert (instance.state, instance.ip) == ("Provisioning", None)
