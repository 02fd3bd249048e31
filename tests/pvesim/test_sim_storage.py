"""Storage: status, content, ISO upload, volume delete (pve-reference §7.4-7.7, §3.7)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from provisioning.proxmox.api import Api
from pvesim.protocol import SimRequest
from pvesim.simulator import Simulator


def test_storage_status_reports_type_content_and_space(api: Api) -> None:
    local = api.storage_status("pve1", "local")
    assert local["type"] == "dir" and local["content"] == "iso,vztmpl,backup"
    assert local["active"] == 1 and local["enabled"] == 1 and local["shared"] == 0
    assert local["total"] == local["used"] + local["avail"]
    lvm = api.storage_status("pve1", "local-lvm")
    assert (lvm["type"], lvm["content"]) == ("lvmthin", "images,rootdir")
    seeds = api.storage_status("pve2", "proxy-seeds")
    assert seeds["content"] == "iso"
    shared = api.storage_status("pve3", "vmstore")
    assert (shared["type"], shared["shared"], shared["content"]) == ("rbd", 1, "images")


def test_an_unknown_storage_is_400_no_such_storage(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.storage_status("pve1", "nosuch"))
    assert (err.status, err.message, err.errors) == (
        400,
        "Parameter verification failed.",
        {"storage": "No such storage."},
    )


def test_content_is_sorted_by_volid_with_proxmoxs_fields(api: Api) -> None:
    items = api.storage_content("pve1", "vmstore")
    volids = [i["volid"] for i in items]
    assert volids == sorted(volids, key=str.lower)
    base = next(i for i in items if i["volid"] == "vmstore:base-9000-disk-0")
    assert base == {
        "content": "images",
        "ctime": base["ctime"],
        "format": "raw",
        "size": 3 * 1024**3,
        "vmid": 9000,
        "volid": "vmstore:base-9000-disk-0",
    }
    only_9002 = api.storage_content("pve1", "vmstore", vmid=9002)
    assert {i["volid"] for i in only_9002} == {
        "vmstore:base-9002-disk-0",
        "vmstore:vm-9002-cloudinit",
    }
    isos = api.storage_content("pve1", "local", content="iso")
    assert [i["volid"] for i in isos] == ["local:iso/debian-13.1.0-amd64-netinst.iso"]


def test_content_of_an_unknown_storage_is_500(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.storage_content("pve1", "nosuch"))
    assert (err.status, err.message) == (500, "storage 'nosuch' does not exist")


def test_upload_is_an_imgcopy_task_with_an_empty_id_and_proxmoxs_log(
    api: Api, finished: Any
) -> None:
    upid = api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=b"x" * 2048)
    assert upid.startswith("UPID:pve1:") and ":imgcopy::proxyhub@pve!sim:" in upid
    assert finished(upid)["exitstatus"] == "OK"
    lines = [line["t"] for line in api.task_log("pve1", upid)]
    assert lines[0].startswith("starting file import from: /var/tmp/pveupload-")
    assert lines[1:4] == [
        "target node: pve1",
        "target file: /mnt/pve/proxy-seeds/template/iso/proxy-a-seed.iso",
        "file size is: 2048",
    ]
    assert lines[4].startswith("command: cp -- /var/tmp/pveupload-")
    assert lines[4].endswith(" /mnt/pve/proxy-seeds/template/iso/proxy-a-seed.iso")
    assert lines[5:] == ["finished file import successfully", "TASK OK"]
    [item] = api.storage_content("pve1", "proxy-seeds")
    assert (item["volid"], item["size"], item["format"]) == (
        "proxy-seeds:iso/proxy-a-seed.iso",
        2048,
        "iso",
    )


def test_upload_overwrites_a_file_of_the_same_name(engine: Simulator, api: Api) -> None:
    api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=b"old")
    api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=b"newer")
    [item] = api.storage_content("pve1", "proxy-seeds")
    assert item["size"] == 5
    assert engine.control.volume_data("pve1", "proxy-seeds:iso/proxy-a-seed.iso") == b"newer"


def test_upload_lands_only_on_the_node_it_was_sent_to(api: Api) -> None:
    api.upload_iso("pve2", "proxy-seeds", filename="proxy-b-seed.iso", content=b"x")
    assert api.storage_content("pve1", "proxy-seeds") == []
    assert len(api.storage_content("pve2", "proxy-seeds")) == 1


def test_upload_refuses_a_name_without_iso_or_img_suffix(api: Api, api_error: Any) -> None:
    err = api_error(
        lambda: api.upload_iso("pve1", "proxy-seeds", filename="seed.raw", content=b"x")
    )
    assert (err.status, err.errors) == (400, {"filename": "wrong file extension"})
    assert api.upload_iso("pve1", "proxy-seeds", filename="SEED.IMG", content=b"x")


def test_upload_normalises_the_file_name(api: Api) -> None:
    api.upload_iso("pve1", "proxy-seeds", filename="../dir/my seed+1.iso", content=b"x")
    [item] = api.storage_content("pve1", "proxy-seeds")
    assert item["volid"] == "proxy-seeds:iso/my_seed_1.iso"


def test_upload_to_a_storage_without_iso_content_is_500(api: Api, api_error: Any) -> None:
    engine_err = api_error(
        lambda: api.upload_iso("pve1", "local-lvm", filename="a.iso", content=b"x")
    )
    assert engine_err.message == "can't upload to storage type 'lvmthin'"


def test_upload_to_a_dir_storage_without_iso_content(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.cluster.nodes["pve1"].storages["local"].content = ("vztmpl", "backup")
    err = api_error(lambda: api.upload_iso("pve1", "local", filename="a.iso", content=b"x"))
    assert (err.status, err.message) == (500, "storage 'local' does not support 'iso' content")


def test_upload_checksum_mismatch_fails_the_task(engine: Simulator, exitstatus: Any) -> None:
    data = b"seed bytes"
    good = hashlib.sha256(data).hexdigest()
    request = SimRequest(
        "POST",
        "/api2/json/nodes/pve1/storage/proxy-seeds/upload",
        form={"content": "iso", "checksum-algorithm": "sha256", "checksum": "00" * 32},
        headers={"authorization": f"PVEAPIToken={engine.token}"},
        files={"filename": ("a.iso", data)},
    )
    upid = json.loads(engine.handle(request).body or b"")["data"]
    assert exitstatus(upid) == f"checksum mismatch: got '{good}' != expect '{'00' * 32}'"


def test_volume_delete_is_an_imgdel_task_logging_the_removal(api: Api, finished: Any) -> None:
    api.upload_iso("pve1", "proxy-seeds", filename="s.iso", content=b"x")
    upid = api.delete_volume("pve1", "proxy-seeds", "proxy-seeds:iso/s.iso")
    assert upid is not None and ":imgdel:proxy-seeds:proxyhub@pve!sim:" in upid
    assert finished(upid)["exitstatus"] == "OK"
    assert [line["t"] for line in api.task_log("pve1", upid)] == [
        "Removed volume 'proxy-seeds:iso/s.iso'",
        "TASK OK",
    ]
    assert api.storage_content("pve1", "proxy-seeds") == []


def test_deleting_a_missing_volume_is_still_a_successful_task(api: Api, finished: Any) -> None:
    upid = api.delete_volume("pve1", "proxy-seeds", "iso/never-there.iso")
    assert upid is not None
    assert finished(upid)["exitstatus"] == "OK"


def test_an_owned_volume_is_deleted_under_vmid_at_storage(api: Api) -> None:
    upid = api.delete_volume("pve2", "local-lvm", "local-lvm:vm-101-disk-0")
    assert upid is not None and ":imgdel:101@local-lvm:" in upid


def test_delete_with_delay_returns_null_when_done_in_time(api: Api) -> None:
    api.upload_iso("pve1", "proxy-seeds", filename="s.iso", content=b"x")
    assert api.delete_volume("pve1", "proxy-seeds", "proxy-seeds:iso/s.iso", delay=5) is None


def test_delete_with_another_storage_in_the_volid_is_400(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.delete_volume("pve1", "proxy-seeds", "local:iso/x.iso"))
    assert err.status == 400
    assert err.errors == {"volume": "storage ID mismatch (local != proxy-seeds)"}
