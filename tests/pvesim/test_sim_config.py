"""VM config reads and writes: pending, digest, locks, canonical values (§7.11-7.13)."""

from __future__ import annotations

import re
from typing import Any

from provisioning.proxmox.api import Api
from pvesim.simulator import Simulator

MAC = re.compile(r"BC:24:11(:[0-9A-F]{2}){3}")


def test_a_write_to_a_stopped_vm_applies_at_once_and_changes_the_digest(api: Api) -> None:
    before = api.vm_config("pve2", 101)
    api.set_vm_config("pve2", 101, {"cores": 2, "memory": 2048, "name": "proxy-legacy2"})
    after = api.vm_config("pve2", 101, current=True)
    assert (after["cores"], after["memory"], after["name"]) == ("2", "2048", "proxy-legacy2")
    assert after["digest"] != before["digest"]
    assert not [i for i in api.vm_pending("pve2", 101) if "pending" in i or "delete" in i]


def test_a_running_vm_keeps_cores_and_memory_pending_and_applies_the_name(api: Api) -> None:
    api.set_vm_config("pve1", 100, {"cores": 4, "memory": 4096, "name": "web-2", "tags": "B,a"})
    current = api.vm_config("pve1", 100, current=True)
    merged = api.vm_config("pve1", 100)
    assert (current["cores"], current["memory"]) == ("2", "2048")
    assert (merged["cores"], merged["memory"]) == ("4", "4096")
    assert current["name"] == merged["name"] == "web-2"
    assert current["tags"] == "a;b"
    pending = {item["key"]: item for item in api.vm_pending("pve1", 100)}
    assert pending["cores"] == {"key": "cores", "value": 2, "pending": 4}
    assert pending["memory"] == {"key": "memory", "value": "2048", "pending": "4096"}
    assert "pending" not in pending["name"]
    assert pending["digest"]["value"] == merged["digest"]


def test_pending_deletions_and_pending_only_keys(api: Api) -> None:
    api.set_vm_config("pve1", 100, {"vcpus": 2}, delete=["numa"])
    pending = {item["key"]: item for item in api.vm_pending("pve1", 100)}
    assert pending["numa"] == {"key": "numa", "value": 0, "delete": 1}
    assert pending["vcpus"] == {"key": "vcpus", "pending": 2}
    merged = api.vm_config("pve1", 100)
    assert "numa" not in merged and merged["vcpus"] == "2"


def test_start_applies_pending_changes(api: Api, engine: Simulator, finished: Any) -> None:
    api.set_vm_config("pve1", 100, {"cores": 4})
    finished(api.stop("pve1", 100))
    finished(api.start("pve1", 100))
    assert api.vm_config("pve1", 100, current=True)["cores"] == "4"
    assert not [i for i in api.vm_pending("pve1", 100) if "pending" in i]


def test_tags_are_lower_cased_sorted_and_deduplicated(api: Api) -> None:
    api.set_vm_config("pve2", 101, {"tags": "Proxy,managed proxy;PROXY"})
    assert api.vm_config("pve2", 101)["tags"] == "managed;proxy"
    api.set_vm_config("pve2", 101, {"name": "x"}, delete=["tags"])
    assert "tags" not in api.vm_config("pve2", 101)


def test_net_gets_a_generated_mac_and_canonical_order(api: Api) -> None:
    api.set_vm_config("pve2", 101, {"net0": "bridge=vmbr0,tag=4,firewall=1,model=virtio"})
    net0 = api.vm_config("pve2", 101)["net0"]
    model, rest = net0.split(",", 1)
    assert model.startswith("virtio=") and MAC.fullmatch(model[len("virtio=") :])
    assert rest == "bridge=vmbr0,firewall=1,tag=4"


def test_net_keeps_a_given_mac_upper_cased(api: Api) -> None:
    api.set_vm_config("pve2", 101, {"net0": "virtio=bc:24:11:aa:bb:cc,bridge=vmbr0,tag=4"})
    assert api.vm_config("pve2", 101)["net0"] == "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,tag=4"


def test_a_stale_digest_is_a_checksum_mismatch(api: Api, api_error: Any) -> None:
    digest = api.vm_config("pve2", 101)["digest"]
    api.set_vm_config("pve2", 101, {"name": "first"})
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"name": "second"}, digest=digest))
    assert (err.status, err.message) == (500, "checksum mismatch (file change by other user?)")
    fresh = api.vm_config("pve2", 101)["digest"]
    api.set_vm_config("pve2", 101, {"name": "second"}, digest=fresh)


def test_no_options_is_refused(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.set_vm_config("pve2", 101, {}))
    assert (err.status, err.message) == (500, "no options specified")


def test_a_locked_vm_refuses_config_writes(engine: Simulator, api: Api, api_error: Any) -> None:
    engine.control.set_lock(101, "backup")
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"name": "x"}))
    assert (err.status, err.message) == (500, "VM is locked (backup)")


def test_delete_list_errors_are_400(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.set_vm_config("pve2", 101, {}, delete=["foo"]))
    assert err.errors == {"delete": "unknown option 'foo'"}
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"cores": 4}, delete=["cores"]))
    assert err.errors == {"delete": "you can't use '-cores' and -delete cores' at the same time"}


def test_attaching_a_seed_cdrom_appends_it_to_the_boot_order(api: Api, new_vm: Any) -> None:
    vmid = new_vm()
    api.set_vm_config(
        "pve1", vmid, {"ide2": "proxy-seeds:iso/proxy-t-seed.iso,media=cdrom", "agent": 1}
    )
    config = api.vm_config("pve1", vmid)
    assert config["ide2"] == "proxy-seeds:iso/proxy-t-seed.iso,media=cdrom"
    assert config["boot"] == "order=scsi0;ide2"
    api.set_vm_config("pve1", vmid, {"name": "x"}, delete=["ide2"])
    assert api.vm_config("pve1", vmid)["boot"] == "order=scsi0"


def test_a_boot_order_naming_a_missing_device_is_refused(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"boot": "order=scsi0;virtio7"}))
    assert err.message == "invalid bootorder: device 'virtio7' does not exist'"


def test_allocation_syntax_creates_a_disk(api: Api) -> None:
    api.set_vm_config("pve2", 101, {"scsi1": "local-lvm:2"})
    assert api.vm_config("pve2", 101)["scsi1"] == "local-lvm:vm-101-disk-1,size=2G"
    volids = {i["volid"] for i in api.storage_content("pve2", "local-lvm", vmid=101)}
    assert volids == {"local-lvm:vm-101-disk-0", "local-lvm:vm-101-disk-1"}


def test_removing_a_disk_of_a_stopped_vm_leaves_it_unused(api: Api) -> None:
    api.set_vm_config("pve2", 101, {"scsi1": "local-lvm:1"})
    api.set_vm_config("pve2", 101, {}, delete=["scsi1"])
    config = api.vm_config("pve2", 101)
    assert "scsi1" not in config and config["unused0"] == "local-lvm:vm-101-disk-1"


def test_keys_no_privilege_covers_need_root(api: Api, api_error: Any) -> None:
    err = api_error(
        lambda: api.set_vm_config("pve2", 101, {"vmgenid": "4d6f8a0c-2e4b-4c6d-9f1a-3b5d7f9a1c3e"})
    )
    assert (err.status, err.message) == (500, "only root can set 'vmgenid' config")


def test_config_of_a_missing_vm(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.set_vm_config("pve1", 100999, {"name": "x"}))
    assert err.message == "Configuration file 'nodes/pve1/qemu-server/100999.conf' does not exist"


def test_a_hookscript_and_pending_change_set_by_control_show_up(
    engine: Simulator, api: Api
) -> None:
    engine.control.set_hookscript(101)
    engine.control.add_pending(101, "cores", 8)
    assert api.vm_config("pve2", 101, current=True)["hookscript"] == "local:snippets/hook.pl"
    pending = {i["key"]: i for i in api.vm_pending("pve2", 101)}
    assert pending["cores"]["pending"] == 8


def test_remove_agent_leaves_no_agent_key(engine: Simulator, api: Api) -> None:
    engine.control.remove_agent(100)
    assert "agent" not in api.vm_config("pve1", 100)
    assert "agent" not in api.vm_status("pve1", 100)


def test_post_config_writes_in_a_qmconfig_task(api: Api, raw: Any, finished: Any) -> None:
    answer = raw.json("POST", "/api2/json/nodes/pve2/qemu/101/config", form={"cores": "2"})
    upid = answer["data"]
    assert ":qmconfig:101:" in upid
    assert finished(upid, "pve2")["exitstatus"] == "OK"
    assert api.vm_config("pve2", 101)["cores"] == "2"
    waited = raw.json(
        "POST",
        "/api2/json/nodes/pve2/qemu/101/config",
        form={"cores": "3", "background_delay": "5"},
    )
    assert waited == {"data": None}


def test_post_config_checks_the_lock_synchronously(engine: Simulator, raw: Any) -> None:
    engine.control.set_lock(101, "backup")
    answer = raw("POST", "/api2/json/nodes/pve2/qemu/101/config", form={"cores": "2"})
    assert (answer.status, answer.reason) == (500, "VM is locked (backup)")


# --- what a drift repair relies on (issue 14) --------------------------------------------------


def test_a_running_vm_takes_a_bridge_and_tag_change_at_once(api: Api) -> None:
    """§7.13 step 3: bridge and tag of ``netN`` are always hot-plugged; the listing's figures
    (§7.9) come from the current config, so a pending ``cores`` leaves ``maxcpu`` as it was."""
    net0 = api.vm_config("pve1", 100)["net0"]
    api.set_vm_config("pve1", 100, {"net0": net0.replace("bridge=vmbr0", "bridge=vmbr0,tag=7")})
    assert "tag=7" in api.vm_config("pve1", 100, current=True)["net0"]
    api.set_vm_config("pve1", 100, {"cores": 4})
    (entry,) = [e for e in api.cluster_resources() if e["vmid"] == 100]
    assert entry["maxcpu"] == 2


def test_a_mac_change_without_network_hotplug_stays_pending(api: Api) -> None:
    """A model or MAC change needs ``network`` in ``hotplug`` (§7.13 step 3)."""
    api.set_vm_config("pve2", 101, {"hotplug": "disk"})  # stopped: applied at once
    api.start("pve2", 101)
    api.set_vm_config("pve2", 101, {"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"})
    pending = {item["key"]: item for item in api.vm_pending("pve2", 101)}
    assert pending["net0"]["pending"] == "virtio=BC:24:11:00:00:01,bridge=vmbr0"


def test_revert_drops_a_pending_change_and_keeps_the_current_value(api: Api) -> None:
    api.set_vm_config("pve1", 100, {"cores": 4})
    digest = api.vm_config("pve1", 100)["digest"]
    api.set_vm_config("pve1", 100, {}, revert=["cores"], digest=digest)
    assert not [i for i in api.vm_pending("pve1", 100) if "pending" in i]
    assert api.vm_config("pve1", 100)["cores"] == "2"
