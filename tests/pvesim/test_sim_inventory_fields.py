"""What ``/cluster/resources?type=vm`` tells about each guest, field by field, as the inventory
reads it (pve-reference §7.9; the example is ``examples/cluster_resources_vm.json``)."""

from __future__ import annotations

import json
from typing import Any

from provisioning.proxmox.api import Api
from pvesim.protocol import SimRequest
from pvesim.simulator import Simulator


def _entries(api: Api) -> dict[int, dict[str, Any]]:
    return {int(e["vmid"]): e for e in api.cluster_resources(type="vm")}


def test_pool_is_listed_only_for_pool_members(engine: Simulator, api: Api) -> None:
    """§7.9 ``pool``: from user.cfg, only when the guest is in a pool."""
    engine.control.set_pool(100, "prod")
    entries = _entries(api)
    assert entries[100]["pool"] == "prod"
    assert all("pool" not in e for vmid, e in entries.items() if vmid != 100)


def test_pool_needs_pool_audit_on_the_pool(engine: Simulator, api: Api) -> None:
    """§7.9 and §2.4: pool membership is shown only to a caller with ``Pool.Audit``."""
    engine.control.set_pool(100, "prod")
    engine.control.deny("/pool/prod", "Pool.Audit")
    entry = _entries(api)[100]
    assert "pool" not in entry and entry["name"] == "web-1"


def test_a_guest_moves_between_pools_and_leaves_its_pool_when_destroyed(
    engine: Simulator, api: Api
) -> None:
    engine.control.set_pool(101, "a")
    engine.control.set_pool(101, "b")
    assert _entries(api)[101]["pool"] == "b"
    engine.control.set_pool(101, None)
    assert "pool" not in _entries(api)[101]
    engine.control.set_pool(101, "b")
    api.destroy("pve2", 101)
    engine.control.advance(5)
    assert 101 not in _entries(api)
    assert engine.control.vm(102)["pool"] is None
    assert 101 not in engine.cluster.access.pools["b"].vms


def test_a_container_is_listed_with_its_type_hostname_and_tags(api: Api) -> None:
    """§7.9 ``type`` is ``lxc`` and ``id`` ``lxc/<vmid>``; §7.20: the name is the hostname."""
    ct = _entries(api)[200]
    assert (ct["type"], ct["id"], ct["name"], ct["tags"]) == ("lxc", "lxc/200", "ct-dns", "infra")
    assert ct["template"] == 0 and ct["status"] == "running"


def test_lock_tags_template_and_hastate_as_proxmox_lists_them(engine: Simulator, api: Api) -> None:
    """§7.9: ``lock`` and ``tags`` only when set (§6, §5.2: the stored ``a;b`` form),
    ``template`` a 0/1 number, ``hastate`` only for HA-managed guests."""
    engine.control.set_lock(101, "backup")
    engine.control.set_ha(102, state="started")
    api.set_vm_config("pve1", 100, {"tags": "Web,Alpha web"})
    entries = _entries(api)
    assert entries[101]["lock"] == "backup" and "lock" not in entries[100]
    assert entries[100]["tags"] == "alpha;web"
    assert entries[9000]["template"] == 1 and entries[100]["template"] == 0
    assert entries[102]["hastate"] == "started" and "hastate" not in entries[100]
    untagged = engine.control.create_vms(1, start_vmid=300, tags=None)[0]
    assert "tags" not in _entries(api)[untagged]


def test_set_pool_over_http_and_an_unknown_guest_refused(engine: Simulator, api: Api) -> None:
    answer = engine.handle(
        SimRequest("POST", "/_sim/set_pool", json_body={"vmid": 200, "pool": "infra"})
    )
    assert answer.status == 200
    assert _entries(api)[200]["pool"] == "infra"
    refused = engine.handle(
        SimRequest("POST", "/_sim/set_pool", json_body={"vmid": 999, "pool": "infra"})
    )
    assert refused.status == 400 and "999" in json.loads(refused.body or b"")["error"]
