"""Acceptance: every request the seam can build is valid against the official Proxmox schema.

Each public method of ``Api`` is called with realistic arguments through a transport that only
records the ``Call``. Every recorded call must resolve to its own schema route and pass
Proxmox's parameter verification. A method added to ``Api`` without an entry here fails the
test, so nothing reaches a real cluster unchecked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioning.proxmox.api import Api, Call, Response
from provisioning.proxmox.deadline import Deadline
from pvesim.schema import DATA_DIR, Schema

OFFICIAL = Path("/work/shared/pve-reference/schema/endpoints.json")
UPID = "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:proxyhub@pve!sim:"
VOLID = "proxy-seeds:iso/proxy-fra-1-seed.iso"


class RecordingTransport:
    """Captures each ``Call`` and answers with data shaped like Proxmox's."""

    # What each call's ``data`` looks like; anything not listed starts a task (a UPID).
    DATA: dict[str, Any] = {
        "version": {"version": "9.1.9", "release": "9.1", "repoid": "0123abcd"},
        "nodes": [],
        "node_status": {},
        "node_network": [],
        "cluster_resources": [],
        "cluster_nextid": "100000",
        "storage_status": {},
        "storage_content": [],
        "vm_config": {"digest": "0" * 40},
        "set_vm_config": None,
        "vm_pending": [],
        "vm_status": {"status": "stopped"},
        "agent_network_interfaces": {"result": []},
        "agent_file_read": {"content": "{}"},
        "task_status": {"status": "stopped", "exitstatus": "OK"},
        "task_log": [{"n": 1, "t": "TASK OK"}],
        "node_tasks": [],
        "pools": [],
        "create_pool": None,
        "roles": [],
        "create_role": None,
        "update_role": None,
        "users": [],
        "create_user": None,
        "user_tokens": [],
        "user_token": {"privsep": 1},
        "create_token": {"full-tokenid": "proxyhub@pve!proxyhub", "info": {}, "value": "x"},
        "delete_token": None,
        "acl": [],
        "set_acl": None,
        "permissions": {},
    }

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        self.calls.append(call)
        return Response(200, self.DATA.get(call.name, UPID))


# Realistic invocations of every public method, as proxyhub's provider makes them.
INVOCATIONS: dict[str, list[Callable[[Api], object]]] = {
    "version": [lambda a: a.version()],
    "nodes": [lambda a: a.nodes()],
    "node_status": [lambda a: a.node_status("pve1")],
    "node_network": [
        lambda a: a.node_network("pve1"),
        lambda a: a.node_network("pve1", type="bridge"),
        lambda a: a.node_network("pve1", type=None),
    ],
    "cluster_resources": [lambda a: a.cluster_resources()],
    "cluster_nextid": [lambda a: a.cluster_nextid(), lambda a: a.cluster_nextid(vmid=100123)],
    "storage_status": [lambda a: a.storage_status("pve1", "proxy-seeds")],
    "storage_content": [
        lambda a: a.storage_content("pve1", "proxy-seeds"),
        lambda a: a.storage_content("pve1", "proxy-seeds", content="iso"),
        lambda a: a.storage_content("pve1", "local-lvm", content="images", vmid=100123),
    ],
    "node_storages": [lambda a: a.node_storages("pve1")],
    "download_url": [
        lambda a: a.download_url(
            "pve1",
            "local",
            url="https://cloud.debian.org/images/cloud/trixie/latest/debian-13-genericcloud-amd64.qcow2",
            filename="debian-13-genericcloud-amd64.qcow2",
            content="import",
            checksum="ab" * 32,
            algorithm="sha256",
        )
    ],
    "create_vm": [
        lambda a: a.create_vm(
            "pve1",
            9100,
            {
                "name": "tpl-debian-13",
                "scsi0": "local-lvm:0,import-from=local:import/debian-13-genericcloud-amd64.qcow2",
                "scsihw": "virtio-scsi-pci",
                "agent": "1",
                "serial0": "socket",
                "vga": "serial0",
                "net0": "virtio,bridge=vmbr0",
                "memory": "1024",
                "cores": 1,
            },
        )
    ],
    "convert_to_template": [lambda a: a.convert_to_template("pve1", 9100)],
    "upload_iso": [
        lambda a: a.upload_iso(
            "pve1", "proxy-seeds", filename="proxy-fra-1-seed.iso", content=b"\0" * 2048
        )
    ],
    "delete_volume": [
        lambda a: a.delete_volume("pve1", "proxy-seeds", VOLID),
        lambda a: a.delete_volume("pve1", "proxy-seeds", VOLID, delay=5),
    ],
    "vm_config": [
        lambda a: a.vm_config("pve1", 100123),
        lambda a: a.vm_config("pve1", 100123, current=True),
    ],
    "set_vm_config": [
        lambda a: a.set_vm_config(
            "pve1",
            100123,
            {
                "cores": 2,
                "memory": 2048,
                "agent": "1",
                "tags": "proxyhub",
                "ide2": f"{VOLID},media=cdrom",
                "net0": "virtio=BC:24:11:D2:47:9A,bridge=vmbr0,tag=4",
                "onboot": True,
                "description": "proxyhub-managed=true\nproxyhub-uid=6f1c",
            },
            digest="0" * 40,
        ),
        lambda a: a.set_vm_config("pve1", 100123, {"agent": "1"}, delete=["ide2", "unused0"]),
        lambda a: a.set_vm_config("pve1", 100123, {"boot": "order=scsi0;ide2;net0"}),
    ],
    "vm_pending": [lambda a: a.vm_pending("pve1", 100123)],
    "clone": [
        lambda a: a.clone(
            "pve1",
            9001,
            newid=100123,
            name="proxy-fra-1",
            description="proxyhub-managed=true\nproxyhub-uid=6f1c",
            storage="local-lvm",
            target="pve2",
        ),
        lambda a: a.clone("pve1", 9001, newid=100124, name="proxy-fra-2", full=False),
        lambda a: a.clone("pve1", 9001, newid=100125, name="proxy-fra-3", pool="proxyhub"),
    ],
    "resize": [
        lambda a: a.resize("pve1", 100123, disk="scsi0", size="10G"),
        lambda a: a.resize("pve1", 100123, disk="virtio0", size="+512M"),
    ],
    "start": [lambda a: a.start("pve1", 100123)],
    "stop": [lambda a: a.stop("pve1", 100123)],
    "shutdown": [
        lambda a: a.shutdown("pve1", 100123),
        lambda a: a.shutdown("pve1", 100123, timeout=30, force_stop=True),
    ],
    "reboot": [lambda a: a.reboot("pve1", 100123)],
    "vm_status": [lambda a: a.vm_status("pve1", 100123)],
    "destroy": [
        lambda a: a.destroy("pve1", 100123),
        lambda a: a.destroy("pve1", 100123, purge=False, destroy_unreferenced_disks=False),
    ],
    "agent_network_interfaces": [lambda a: a.agent_network_interfaces("pve1", 100123)],
    "agent_file_read": [lambda a: a.agent_file_read("pve1", 100123, "/run/cloud-init/result.json")],
    "task_status": [lambda a: a.task_status("pve1", UPID)],
    "node_tasks": [
        lambda a: a.node_tasks("pve1"),
        lambda a: a.node_tasks("pve1", vmid=123, typefilter="qmstart", source="all", limit=0),
    ],
    "task_log": [
        lambda a: a.task_log("pve1", UPID),
        lambda a: a.task_log("pve1", UPID, start=50, limit=50),
    ],
    # Issue 14: the bootstrap's access-control calls and the privileges preflight.
    "pools": [lambda a: a.pools()],
    "create_pool": [
        lambda a: a.create_pool("proxyhub"),
        lambda a: a.create_pool("proxyhub", comment="proxyhub proxy VMs"),
    ],
    "roles": [lambda a: a.roles()],
    "create_role": [lambda a: a.create_role("ProxyHub", privs=["VM.Audit", "VM.Clone"])],
    "update_role": [lambda a: a.update_role("ProxyHub", privs=["VM.Audit"])],
    "users": [lambda a: a.users()],
    "create_user": [lambda a: a.create_user("proxyhub@pve", comment="proxyhub service account")],
    "user_tokens": [lambda a: a.user_tokens("proxyhub@pve")],
    "user_token": [lambda a: a.user_token("proxyhub@pve", "proxyhub")],
    "create_token": [lambda a: a.create_token("proxyhub@pve", "proxyhub", comment="proxyhub")],
    "delete_token": [lambda a: a.delete_token("proxyhub@pve", "proxyhub")],
    "acl": [lambda a: a.acl()],
    "set_acl": [
        lambda a: a.set_acl(
            "/pool/proxyhub",
            roles=["ProxyHub"],
            users=["proxyhub@pve"],
            tokens=["proxyhub@pve!proxyhub"],
        ),
        lambda a: a.set_acl("/", roles=["Administrator"], users=["proxyhub@pve"], delete=True),
    ],
    "permissions": [lambda a: a.permissions(), lambda a: a.permissions(path="/pool/proxyhub")],
}


@pytest.fixture(scope="module")
def schema() -> Schema:
    """The official schema when the shared reference is present, else the vendored copy."""
    main = OFFICIAL if OFFICIAL.is_file() else DATA_DIR / "endpoints.json"
    # Endpoints outside endpoints.json (GET /nodes/{node}/network) come from the vendored
    # extract of all-endpoints.json; its equality with the official file is tested elsewhere.
    return Schema.from_files([main, DATA_DIR / "extra-endpoints.json"])


def public_methods() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(Api, inspect.isfunction)
        if not name.startswith("_")
    }


def test_every_public_api_method_has_a_realistic_invocation() -> None:
    assert set(INVOCATIONS) == public_methods()


def record(invoke: Callable[[Api], object]) -> list[Call]:
    transport = RecordingTransport()
    invoke(Api(transport))
    return transport.calls


CASES = [
    pytest.param(invoke, id=f"{name}-{i}")
    for name, invokes in INVOCATIONS.items()
    for i, invoke in enumerate(invokes)
]


@pytest.mark.parametrize("invoke", CASES)
def test_every_request_the_seam_builds_is_valid(
    schema: Schema, invoke: Callable[[Api], object]
) -> None:
    calls = record(invoke)
    assert len(calls) == 1
    [call] = calls
    route = schema.match(call.method, call.url_path())
    assert route is not None, f"{call.method} {call.url_path()} is not a Proxmox route"
    assert route.key == call.schema_key
    assert route.path_params == dict(call.path_params)
    params: dict[str, object] = {**route.path_params, **call.params}
    if call.upload is not None:
        # The server takes ``filename`` from the file part's ``filename=`` attribute (§7.7).
        params["filename"] = call.upload.filename
    assert schema.validate(route.key, params) == {}
