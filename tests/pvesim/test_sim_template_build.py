"""What the simulator learned for template builds (issue 14), each against pve-reference.

* ``download-url`` (§7.8): a real fetch from a loopback server; a ``download`` task whose id is
  the escaped file name (§4.5, §4.1); the checksum checked as Proxmox checks it, a mismatch
  failing the task with §3.7's text; the sync refusals of §3.7 (unknown storage, content type
  not configured) and the extension rule (400 ``wrong file extension``); the file listed with
  its content type (§7.5).
* ``POST /nodes/{node}/qemu`` (appendix; §5.4 ``import-from``): the VMID taken anywhere (§3.1
  sync text), ``lock: create`` while the ``qmcreate`` task runs (§6, §4.5), the imported disk
  sized from its source, what create adds (§5.6 ``meta``, ``smbios1`` uuid, ``vmgenid``, net0's
  MAC; §5.5 default boot order).
* ``POST .../template`` (appendix): a ``qmtemplate`` task (§4.5); a locked VM refused
  synchronously (§3.1); the disk renamed to a base volume (§5.4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from tests.support.imageserver import ImageServer, image_server

IMAGE = b"qcow2-bytes" * 300


@pytest.fixture
def served() -> Iterator[ImageServer]:
    with image_server(IMAGE) as server:
        yield server


def _download(api: Api, served: ImageServer, **kwargs: Any) -> str:
    fields: dict[str, Any] = {
        "url": served.url("debian-13.qcow2"),
        "filename": "debian-13.img",
        "content": "iso",
        "checksum": hashlib.sha256(IMAGE).hexdigest(),
        "algorithm": "sha256",
    }
    fields.update(kwargs)
    storage = fields.pop("storage", "local")
    return api.download_url("pve1", storage, **fields)


def test_download_url_fetches_for_real_and_stores_the_volume(
    api: Api, served: ImageServer, exitstatus: Callable[..., str]
) -> None:
    upid = _download(api, served)
    assert upid.split(":")[5:7] == ["download", "debian-13.img"]
    assert exitstatus(upid) == "OK"
    assert served.requests == ["/debian-13.qcow2"]
    items = [i for i in api.storage_content("pve1", "local") if i["volid"].endswith("13.img")]
    assert items == [
        {
            "content": "iso",
            "ctime": items[0]["ctime"],
            "format": "iso",
            "size": len(IMAGE),
            "volid": "local:iso/debian-13.img",
        }
    ]
    log = [line["t"] for line in api.task_log("pve1", upid)]
    assert "calculating checksum...OK, checksum verified" in log and log[-1] == "TASK OK"


def test_a_wrong_checksum_fails_the_download_task_with_proxmoxs_text(
    api: Api, served: ImageServer, exitstatus: Callable[..., str]
) -> None:
    upid = _download(api, served, checksum="ab" * 32)
    actual = hashlib.sha256(IMAGE).hexdigest()
    assert exitstatus(upid) == f"checksum mismatch: got '{actual}' != expect '{'ab' * 32}'"
    assert not [i for i in api.storage_content("pve1", "local") if "debian-13.img" in i["volid"]]


def test_download_url_refusals(
    api: Api, served: ImageServer, api_error: Callable[[Callable[[], Any]], ApiError]
) -> None:
    assert api_error(lambda: _download(api, served, storage="nope")).message == (
        "storage 'nope' does not exist"
    )
    err = api_error(lambda: _download(api, served, content="import"))
    assert (err.status, err.message) == (
        500,
        "storage 'local' is not configured for content-type 'import'",
    )
    err = api_error(lambda: _download(api, served, filename="debian-13.qcow2"))
    assert err.status == 400 and err.errors == {"filename": "wrong file extension"}
    err = api_error(lambda: _download(api, served, url="ftp://127.0.0.1/x.img"))
    assert err.status == 400 and "url" in err.errors
    assert served.requests == []


def _create(api: Api, vmid: int = 9100, **extra: Any) -> str:
    config = {
        "name": "tpl",
        "scsi0": "local-lvm:0,import-from=local:iso/debian-13.img",
        "scsihw": "virtio-scsi-pci",
        "agent": "1",
        "serial0": "socket",
        "vga": "serial0",
        "net0": "virtio,bridge=vmbr0",
        **extra,
    }
    return api.create_vm("pve1", vmid, config)


def test_create_imports_the_disk_under_a_create_lock(timed: Any, served: ImageServer) -> None:
    assert timed.wait(_download(timed.api, served))["exitstatus"] == "OK"
    upid = _create(timed.api)
    assert upid.split(":")[5:7] == ["qmcreate", "9100"]
    listed = [e for e in timed.api.cluster_resources() if e["vmid"] == 9100]
    assert listed[0]["lock"] == "create"
    assert timed.api.vm_config("pve1", 9100)["lock"] == "create"
    assert timed.wait(upid)["exitstatus"] == "OK"

    config = timed.api.vm_config("pve1", 9100)
    assert "lock" not in config
    assert config["scsi0"] == f"local-lvm:vm-9100-disk-0,size={len(IMAGE)}"
    assert config["boot"] == "order=scsi0;net0"
    assert config["net0"].startswith("virtio=BC:24:11:")
    assert config["smbios1"].startswith("uuid=") and config["vmgenid"]
    assert config["meta"].startswith("creation-qemu=")


def test_create_refuses_a_vmid_taken_anywhere_with_proxmoxs_text(
    api: Api, api_error: Callable[[Callable[[], Any]], ApiError]
) -> None:
    err = api_error(lambda: api.create_vm("pve1", 200, {"name": "x"}))
    assert (err.status, err.message) == (
        500,
        "unable to create VM 200 - CT 200 already exists on node 'pve2'",
    )
    err = api_error(lambda: api.create_vm("pve3", 9000, {"name": "x"}))
    assert err.message == "unable to create VM 9000 - VM 9000 already exists on node 'pve1'"


def test_an_import_from_a_missing_volume_fails_the_create_task(
    api: Api, exitstatus: Callable[..., str]
) -> None:
    upid = _create(api, scsi0="local-lvm:0,import-from=local:iso/absent.img")
    assert exitstatus(upid) == "volume 'local:iso/absent.img' does not exist"
    assert not [e for e in api.cluster_resources() if e["vmid"] == 9100]


def test_template_conversion_is_a_task_and_refuses_a_locked_vm(
    timed: Any, served: ImageServer
) -> None:
    timed.wait(_download(timed.api, served))
    create = _create(timed.api)
    with pytest.raises(ApiError) as locked:
        timed.api.convert_to_template("pve1", 9100)
    assert (locked.value.status, locked.value.message) == (500, "VM is locked (create)")
    timed.wait(create)

    upid = timed.api.convert_to_template("pve1", 9100)
    assert upid.split(":")[5:7] == ["qmtemplate", "9100"]
    assert timed.wait(upid)["exitstatus"] == "OK"
    config = timed.api.vm_config("pve1", 9100)
    assert str(config["template"]) == "1"
    assert config["scsi0"].startswith("local-lvm:base-9100-disk-0,")
