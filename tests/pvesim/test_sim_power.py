"""Power, destroy, resize and status/current (pve-reference §3.2, §7.15-7.18; §8 rules 3-4)."""

from __future__ import annotations

from typing import Any

from provisioning.proxmox.api import Api
from pvesim.simulator import Simulator


def test_start_runs_the_vm(api: Api, new_vm: Any, finished: Any) -> None:
    vmid = new_vm()
    upid = api.start("pve1", vmid)
    assert f":qmstart:{vmid}:" in upid
    assert finished(upid)["exitstatus"] == "OK"
    status = api.vm_status("pve1", vmid)
    assert (status["status"], status["qmpstatus"]) == ("running", "running")
    assert status["pid"] > 0 and "running-qemu" in status


def test_start_of_a_running_vm_is_a_task_error(api: Api, exitstatus: Any) -> None:
    assert exitstatus(api.start("pve1", 100)) == "VM 100 already running"


def test_start_of_a_template_is_a_task_error(api: Api, exitstatus: Any) -> None:
    assert exitstatus(api.start("pve1", 9000)) == "you can't start a vm if it's a template"


def test_start_of_a_missing_vm_fails_in_the_task(api: Api, exitstatus: Any) -> None:
    upid = api.start("pve1", 100999)
    assert (
        exitstatus(upid) == "Configuration file 'nodes/pve1/qemu-server/100999.conf' does not exist"
    )


def test_start_of_a_locked_vm_is_a_task_error(engine: Simulator, api: Api, exitstatus: Any) -> None:
    engine.control.set_lock(101, "backup")
    upid = api.start("pve2", 101)
    assert exitstatus(upid, "pve2") == "VM is locked (backup)"
    assert [line["t"] for line in api.task_log("pve2", upid)] == [
        "TASK ERROR: VM is locked (backup)"
    ]


def test_stop_of_a_stopped_vm_is_a_successful_no_op(api: Api, exitstatus: Any) -> None:
    assert exitstatus(api.stop("pve2", 101), "pve2") == "OK"


def test_stop_and_shutdown_stop_a_running_vm(api: Api, exitstatus: Any) -> None:
    assert exitstatus(api.shutdown("pve1", 100)) == "OK"
    assert api.vm_status("pve1", 100)["status"] == "stopped"
    assert exitstatus(api.start("pve1", 100)) == "OK"
    assert exitstatus(api.stop("pve1", 100)) == "OK"
    assert api.vm_status("pve1", 100)["qmpstatus"] == "stopped"


def test_stop_of_a_running_locked_vm_is_a_task_error(
    engine: Simulator, api: Api, exitstatus: Any
) -> None:
    engine.control.set_lock(100, "migrate")
    assert exitstatus(api.stop("pve1", 100)) == "VM is locked (migrate)"


def test_shutdown_of_a_paused_vm_is_refused_synchronously(
    engine: Simulator, api: Api, api_error: Any, exitstatus: Any
) -> None:
    engine.control.pause_vm(100)
    err = api_error(lambda: api.shutdown("pve1", 100))
    assert (err.status, err.message) == (500, "VM is paused - cannot shutdown")
    assert exitstatus(api.shutdown("pve1", 100, force_stop=True)) == "WARNINGS: 1"


def test_reboot_of_a_stopped_vm_is_refused_synchronously(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.reboot("pve2", 101))
    assert (err.status, err.message) == (500, "VM 101 not running")


def test_reboot_of_a_missing_vm(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.reboot("pve1", 100999))
    assert err.message == "unable to find configuration file for VM 100999 on node 'pve1'"


def test_reboot_restarts_and_applies_pending(api: Api, exitstatus: Any) -> None:
    api.set_vm_config("pve1", 100, {"cores": 3})
    assert exitstatus(api.reboot("pve1", 100)) == "OK"
    status = api.vm_status("pve1", 100)
    assert status["status"] == "running" and status["uptime"] == 0
    assert api.vm_config("pve1", 100, current=True)["cores"] == "3"


def test_a_hibernated_vm_starts_by_resuming(engine: Simulator, api: Api, exitstatus: Any) -> None:
    engine.control.hibernate_vm(100)
    status = api.vm_status("pve1", 100)
    assert (status["status"], status["lock"]) == ("stopped", "suspended")
    assert exitstatus(api.start("pve1", 100)) == "OK"
    status = api.vm_status("pve1", 100)
    assert status["status"] == "running" and "lock" not in status


def test_status_current_of_a_template(api: Api) -> None:
    status = api.vm_status("pve1", 9000)
    assert status == {
        "agent": 1,
        "cpu": 0,
        "cpus": 1,
        "disk": 0,
        "ha": {"managed": 0},
        "maxdisk": 3 * 1024**3,
        "maxmem": 1024**3,
        "mem": 0,
        "memhost": 0,
        "name": "debian-13",
        "netin": 0,
        "netout": 0,
        "qmpstatus": "stopped",
        "serial": 1,
        "status": "stopped",
        "tags": "debian;template",
        "template": 1,
        "uptime": 0,
        "vmid": 9000,
    }


def test_an_ha_managed_vm(engine: Simulator, api: Api, api_error: Any, finished: Any) -> None:
    engine.control.set_ha(101, state="stopped")
    assert api.vm_status("pve2", 101)["ha"] == {"managed": 1, "state": "stopped"}
    upid = api.start("pve2", 101)
    assert ":hastart:101:" in upid
    finished(upid, "pve2")
    assert api.vm_status("pve2", 101)["ha"] == {"managed": 1, "state": "started"}
    assert ":hastop:101:" in api.shutdown("pve2", 101)
    err = api_error(lambda: api.destroy("pve2", 101, purge=False))
    assert err.message == (
        "unable to remove VM 101 - used in HA resources and purge parameter not set."
    )


# --- destroy ---------------------------------------------------------------------------------


def test_destroy_of_a_running_vm_is_refused(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.destroy("pve1", 100))
    assert (err.status, err.message) == (500, "VM 100 is running - destroy failed")


def test_destroy_of_a_protected_vm_is_refused(api: Api, api_error: Any) -> None:
    api.set_vm_config("pve2", 101, {"protection": True})
    err = api_error(lambda: api.destroy("pve2", 101))
    assert err.message == "can't remove VM 101 - protection mode enabled"


def test_destroy_of_a_missing_vm(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.destroy("pve1", 100999))
    assert err.message == "Configuration file 'nodes/pve1/qemu-server/100999.conf' does not exist"


def test_destroy_of_a_locked_vm_fails_in_the_task(
    engine: Simulator, api: Api, exitstatus: Any
) -> None:
    engine.control.set_lock(101, "backup")
    assert exitstatus(api.destroy("pve2", 101), "pve2") == "VM is locked (backup)"
    engine.control.set_lock(101, "suspended")
    assert exitstatus(api.destroy("pve2", 101), "pve2") == "OK"


def test_destroy_frees_volumes_and_the_vmid_only_at_the_end(timed: Any) -> None:
    api = timed.api
    upid = api.clone("pve1", 9000, newid=100500, name="proxy-d")
    timed.wait(upid)
    api.upload_iso("pve1", "proxy-seeds", filename="proxy-d-seed.iso", content=b"seed")
    destroy = api.destroy("pve1", 100500)
    assert api.task_status("pve1", destroy)["status"] == "running"
    assert 100500 in {e["vmid"] for e in api.cluster_resources()}
    assert api.vm_config("pve1", 100500)["name"] == "proxy-d"
    assert timed.wait(destroy)["exitstatus"] == "OK"
    assert 100500 not in {e["vmid"] for e in api.cluster_resources()}
    assert not [i for i in api.storage_content("pve1", "vmstore") if i.get("vmid") == 100500]
    assert len(api.storage_content("pve1", "proxy-seeds")) == 1  # the seed is not the VM's
    assert api.cluster_nextid(vmid=100500) == 100500


def test_destroy_a_template_with_linked_clones_fails(api: Api, raw: Any, exitstatus: Any) -> None:
    raw("POST", "/api2/json/nodes/pve1/qemu/9001/clone", form={"newid": "100501"})
    assert exitstatus(api.destroy("pve1", 9001)) == (
        "base volume 'vmstore:base-9001-disk-0' is still in use by linked cloned"
    )


# --- resize ----------------------------------------------------------------------------------


def test_resize_to_an_absolute_size_rewrites_size(api: Api, new_vm: Any, exitstatus: Any) -> None:
    vmid = new_vm()
    upid = api.resize("pve1", vmid, disk="scsi0", size="10G")
    assert f":resize:{vmid}:" in upid
    assert exitstatus(upid) == "OK"
    assert api.vm_config("pve1", vmid)["scsi0"].endswith("size=10G,ssd=1")
    [volume] = [i for i in api.storage_content("pve1", "vmstore") if i.get("vmid") == vmid]
    assert volume["size"] == 10 * 1024**3


def test_resize_by_an_increment(api: Api, new_vm: Any, exitstatus: Any) -> None:
    vmid = new_vm()
    assert exitstatus(api.resize("pve1", vmid, disk="scsi0", size="+512M")) == "OK"
    assert "size=3584M" in api.vm_config("pve1", vmid)["scsi0"]


def test_shrinking_is_a_task_error_and_equal_is_a_no_op(
    api: Api, new_vm: Any, exitstatus: Any
) -> None:
    vmid = new_vm()
    digest = api.vm_config("pve1", vmid)["digest"]
    assert exitstatus(api.resize("pve1", vmid, disk="scsi0", size="2G")) == (
        "shrinking disks is not supported"
    )
    assert exitstatus(api.resize("pve1", vmid, disk="scsi0", size="3G")) == "OK"
    assert api.vm_config("pve1", vmid)["digest"] == digest


def test_resize_checks_run_in_the_task(
    engine: Simulator, api: Api, new_vm: Any, exitstatus: Any
) -> None:
    vmid = new_vm()
    assert exitstatus(api.resize("pve1", vmid, disk="scsi5", size="4G")) == (
        "disk 'scsi5' does not exist"
    )
    engine.control.set_lock(vmid, "backup")
    assert exitstatus(api.resize("pve1", vmid, disk="scsi0", size="4G")) == "VM is locked (backup)"
    assert exitstatus(api.resize("pve1", 100999, disk="scsi0", size="4G")) == (
        "Configuration file 'nodes/pve1/qemu-server/100999.conf' does not exist"
    )
