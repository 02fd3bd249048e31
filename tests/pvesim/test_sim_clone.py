"""Clone (pve-reference §7.14, §8 rule 2; seed 000 entries 2 and 4)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from provisioning.proxmox.api import Api
from pvesim.profiles import PROFILES
from pvesim.simulator import Simulator
from tests.support.simtransport import sim_api

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _entry(api: Api, vmid: int) -> dict[str, Any] | None:
    return next((e for e in api.cluster_resources() if e["vmid"] == vmid), None)


def test_the_clone_lock_sequence(timed: Any, api_error: Any) -> None:
    """The target is a bare, locked, nameless entry until the task ends (seed 000 F8)."""
    api = timed.api
    upid = api.clone("pve1", 9000, newid=100400, name="proxy-seq")
    assert _entry(api, 100400) == {
        "id": "qemu/100400",
        "lock": "clone",
        "node": "pve1",
        "status": "unknown",
        "type": "qemu",
        "vmid": 100400,
    }
    config = api.vm_config("pve1", 100400)
    assert config == {
        "description": " qmclone temporary file",
        "digest": "eb54fb9d9f120ba0c3bdf694f73b10002c375c38",
        "lock": "clone",
    }
    err = api_error(lambda: api.set_vm_config("pve1", 100400, {"cores": 2}))
    assert (err.status, err.message) == (500, "VM is locked (clone)")
    assert api.task_status("pve1", upid)["status"] == "running"
    assert timed.wait(upid)["exitstatus"] == "OK"
    entry = _entry(api, 100400)
    assert entry is not None and entry["name"] == "proxy-seq" and entry["status"] == "stopped"
    assert "lock" not in entry
    api.set_vm_config("pve1", 100400, {"cores": 2})


def test_a_long_clone_shows_vm_n_after_pvestatds_pass(clock: Any, secret: str) -> None:
    slow = dataclasses.replace(PROFILES["fast"], name="slow-clone", clone=60.0)
    api, _ = sim_api(profile=slow, clock=clock, token_secret=secret)
    api.clone("pve1", 9000, newid=100401, name="proxy-slow")
    clock.advance(11)
    entry = _entry(api, 100401)
    assert entry is not None
    assert (entry["name"], entry["status"], entry["lock"], entry["template"]) == (
        "VM 100401",
        "stopped",
        "clone",
        0,
    )


def test_the_task_is_qmclone_with_the_source_vmid(api: Api, finished: Any) -> None:
    upid = api.clone("pve1", 9000, newid=100402, name="proxy-a")
    assert re.fullmatch(
        r"UPID:pve1:[0-9A-F]{8}:[0-9A-F]{8}:[0-9A-F]{8}:qmclone:9000:proxyhub@pve!sim:", upid
    )
    status = finished(upid)
    assert (status["type"], status["id"], status["exitstatus"]) == ("qmclone", "9000", "OK")


def test_the_clone_log(api: Api) -> None:
    upid = api.clone("pve1", 9000, newid=100403, name="proxy-a")
    assert [line["t"] for line in api.task_log("pve1", upid)] == [
        "creating a clone of VM 9000 with ID 100403",
        "create full clone of drive scsi0 (vmstore:base-9000-disk-0)",
        "allocated target volume 'vmstore:vm-100403-disk-0'",
        "transferred 0.0 B of 3.0 GiB (0.00%)",
        "transferred 1.5 GiB of 3.0 GiB (50.00%)",
        "transferred 3.0 GiB of 3.0 GiB (100.00%)",
        "TASK OK",
    ]


def test_the_clones_config(api: Api) -> None:
    source = api.vm_config("pve1", 9000)
    api.clone("pve1", 9000, newid=100404, name="proxy-a", description="mark\nline two")
    clone = api.vm_config("pve1", 100404)
    assert clone["name"] == "proxy-a"
    assert clone["description"] == "mark\nline two"
    assert "template" not in clone
    assert clone["scsi0"] == "vmstore:vm-100404-disk-0,discard=on,iothread=1,size=3G,ssd=1"
    assert clone["net0"] != source["net0"]
    assert clone["net0"].endswith(",bridge=vmbr0") and clone["net0"].startswith("virtio=BC:24:11:")
    assert clone["smbios1"] != source["smbios1"] and re.fullmatch(f"uuid={UUID}", clone["smbios1"])
    assert clone["vmgenid"] != source["vmgenid"] and re.fullmatch(UUID, clone["vmgenid"])
    for key in ("meta", "tags", "agent", "boot", "cores", "memory", "ostype", "scsihw"):
        assert clone[key] == source[key], key
    assert api.vm_status("pve1", 100404)["status"] == "stopped"


def test_name_and_description_default_from_the_source(api: Api, raw: Any) -> None:
    answer = raw("POST", "/api2/json/nodes/pve1/qemu/9000/clone", form={"newid": "100405"})
    assert answer.status == 200
    clone = api.vm_config("pve1", 100405)
    assert clone["name"] == "Copy-of-VM-debian-13"
    assert clone["description"] == api.vm_config("pve1", 9000)["description"]


def test_a_taken_vmid_on_the_same_node_is_refused_synchronously(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.clone("pve1", 9000, newid=100, name="proxy-a"))
    assert (err.status, err.message) == (500, "unable to create VM 100: config file already exists")


def test_a_vmid_taken_on_another_node_fails_inside_the_task(api: Api, exitstatus: Any) -> None:
    upid = api.clone("pve1", 9000, newid=101, name="proxy-a")
    assert "File exists" in exitstatus(upid)
    assert _entry(api, 101)["name"] == "proxy-legacy"  # type: ignore[index]


def test_a_missing_source(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.clone("pve1", 9999, newid=100406, name="proxy-a"))
    assert err.message == "unable to find configuration file for VM 9999 on node 'pve1'"


def test_a_locked_source_is_refused(engine: Simulator, api: Api, api_error: Any) -> None:
    engine.control.set_lock(9000, "backup")
    err = api_error(lambda: api.clone("pve1", 9000, newid=100407, name="proxy-a"))
    assert err.message == "VM is locked (backup)"


def test_a_storage_without_images_is_400(api: Api, api_error: Any) -> None:
    err = api_error(
        lambda: api.clone("pve1", 9000, newid=100408, name="proxy-a", storage="proxy-seeds")
    )
    assert err.errors == {"storage": "storage 'proxy-seeds' does not support vm images"}


def test_a_full_clone_onto_another_storage(api: Api) -> None:
    api.clone("pve1", 9000, newid=100409, name="proxy-a", storage="local-lvm")
    assert api.vm_config("pve1", 100409)["scsi0"].startswith("local-lvm:vm-100409-disk-0,")


def test_target_moves_the_clone_to_another_node(api: Api) -> None:
    api.clone("pve1", 9000, newid=100410, name="proxy-a", target="pve2")
    assert _entry(api, 100410)["node"] == "pve2"  # type: ignore[index]
    assert api.vm_config("pve2", 100410)["scsi0"].startswith("vmstore:vm-100410-disk-0,")


def test_target_needs_shared_storage(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.clone("pve2", 101, newid=100411, name="proxy-a", target="pve3"))
    assert err.message == "can't clone VM to node 'pve3' (VM uses local storage)"


def test_a_template_clones_linked_by_default(api: Api, raw: Any) -> None:
    raw("POST", "/api2/json/nodes/pve1/qemu/9000/clone", form={"newid": "100412"})
    scsi0 = api.vm_config("pve1", 100412)["scsi0"]
    assert scsi0.startswith("vmstore:base-9000-disk-0/vm-100412-disk-0,")


def test_linked_clones_need_a_template(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.clone("pve1", 100, newid=100413, name="proxy-a", full=False))
    assert err.message == (
        "Linked clone feature is not supported for 'local-lvm:vm-100-disk-0' (scsi0)"
    )


def test_the_cloud_init_drive_is_copied(api: Api) -> None:
    api.clone("pve1", 9002, newid=100414, name="proxy-a")
    assert api.vm_config("pve1", 100414)["ide2"] == "vmstore:vm-100414-cloudinit,media=cdrom"


def test_a_failing_clone_removes_its_target(engine: Simulator, api: Api, exitstatus: Any) -> None:
    engine.control.fail_next_task("qmclone", "lvcreate 'pve/vm-100415-disk-0' error: no space")
    upid = api.clone("pve1", 9000, newid=100415, name="proxy-a")
    assert exitstatus(upid) == "clone failed: lvcreate 'pve/vm-100415-disk-0' error: no space"
    assert _entry(api, 100415) is None
    assert not [i for i in api.storage_content("pve1", "vmstore") if i.get("vmid") == 100415]


def test_a_failing_clone_holds_its_lock_until_it_fails(timed: Any) -> None:
    timed.engine.control.fail_next_task("qmclone", "storage went away")
    upid = timed.api.clone("pve1", 9000, newid=100416, name="proxy-a")
    assert _entry(timed.api, 100416)["lock"] == "clone"  # type: ignore[index]
    assert timed.wait(upid)["exitstatus"] == "clone failed: storage went away"
    assert _entry(timed.api, 100416) is None


def test_pending_changes_of_the_source_are_not_copied(engine: Simulator, api: Api) -> None:
    engine.control.add_pending(100, "cores", 8)
    upid = api.clone("pve1", 100, newid=100417, name="proxy-a")
    assert api.vm_config("pve1", 100417)["cores"] == "2"
    assert "found pending changes for 'cores', discarding for clone" in [
        line["t"] for line in api.task_log("pve1", upid)
    ]


def test_the_template_agent_is_inherited(engine: Simulator, api: Api) -> None:
    api.clone("pve1", 9000, newid=100418, name="proxy-a")
    api.clone("pve1", 9001, newid=100419, name="proxy-b")
    assert engine.control.vm(100418)["agentBaked"] is True
    assert engine.control.vm(100419)["agentBaked"] is False


def test_a_start_during_the_clone_waits_for_it(timed: Any) -> None:
    """Seed 000 entry 10 (F3): the start queues behind the clone's lock instead of failing."""
    api = timed.api
    clone = api.clone("pve1", 9000, newid=100420, name="proxy-w")
    start = api.start("pve1", 100420)
    timed.advance(0.2)
    assert api.task_status("pve1", start)["status"] == "running"
    assert timed.wait(clone)["exitstatus"] == "OK"
    assert timed.wait(start)["exitstatus"] == "OK"
    assert api.vm_status("pve1", 100420)["status"] == "running"


def test_a_start_gives_up_on_a_clone_lock_after_ten_seconds(clock: Any, secret: str) -> None:
    slow = dataclasses.replace(PROFILES["fast"], name="slow-clone", clone=60.0)
    api, _ = sim_api(profile=slow, clock=clock, token_secret=secret)
    api.clone("pve1", 9000, newid=100421, name="proxy-w")
    start = api.start("pve1", 100421)
    clock.advance(10.5)
    assert api.task_status("pve1", start)["exitstatus"] == (
        "can't lock file '/var/lock/qemu-server/lock-100421.conf' - got timeout"
    )


def test_every_vm_has_its_own_identity_and_config_writes_keep_it(
    engine: Simulator, api: Api
) -> None:
    """Seed 001's identity: an SMBIOS UUID and a vmgenid per VM (pve-reference §5.6, §7.14)."""
    seen = set()
    for entry in api.cluster_resources():
        if entry.get("type") != "qemu":
            continue
        config = api.vm_config(str(entry["node"]), int(entry["vmid"]))
        assert re.fullmatch(f"uuid={UUID}", config["smbios1"])
        seen.add((config["smbios1"], config["vmgenid"]))
    assert len(seen) == sum(1 for e in api.cluster_resources() if e.get("type") == "qemu")
    api.clone("pve1", 9000, newid=100405, name="proxy-b")
    before = api.vm_config("pve1", 100405)
    api.set_vm_config("pve1", 100405, {"cores": 2, "description": "changed"})
    after = api.vm_config("pve1", 100405)
    assert (after["smbios1"], after["vmgenid"]) == (before["smbios1"], before["vmgenid"])


def test_a_recreated_vm_has_a_new_identity_and_nothing_else_changes(
    engine: Simulator, api: Api
) -> None:
    api.clone("pve1", 9000, newid=100406, name="proxy-c", description="our mark")
    assert api.start("pve1", 100406)
    before = api.vm_config("pve1", 100406)
    engine.control.clear_ledger()
    new = engine.control.recreate_vm(100406)
    after = api.vm_config("pve1", 100406)
    assert after["smbios1"] == new["smbios1"] != before["smbios1"]
    assert after["vmgenid"] == new["vmgenid"] != before["vmgenid"]
    assert re.fullmatch(f"uuid={UUID}", after["smbios1"]) and re.fullmatch(UUID, after["vmgenid"])
    for key in ("name", "description", "net0", "scsi0", "tags"):
        assert after.get(key) == before.get(key), key
    assert api.vm_status("pve1", 100406)["status"] == "stopped"
    assert engine.ledger.mutations() == []  # a control call is not an API call
