"""Cluster and node reads: version, nodes, node status and network, resources, nextid."""

from __future__ import annotations

from typing import Any

import pytest

from provisioning.proxmox.api import Api
from pvesim.simulator import Simulator
from tests.support.simtransport import sim_api


def test_version_names_the_emulated_release(api: Api) -> None:
    assert api.version() == {"release": "9.2", "repoid": "49318c671b82f31e", "version": "9.2.20"}


def test_nodes_lists_all_three_and_an_offline_one_keeps_only_maxima(
    engine: Simulator, api: Api
) -> None:
    engine.control.node_offline("pve3")
    nodes = {n["node"]: n for n in api.nodes()}
    assert list(nodes) == ["pve1", "pve2", "pve3"]
    assert nodes["pve1"]["status"] == "online" and nodes["pve1"]["uptime"] > 0
    assert nodes["pve1"]["id"] == "node/pve1" and nodes["pve1"]["type"] == "node"
    offline = nodes["pve3"]
    assert offline["status"] == "offline"
    assert "uptime" not in offline and "cpu" not in offline and offline["maxmem"] > 0


def test_node_status_carries_versions_memory_and_cpu(api: Api) -> None:
    status = api.node_status("pve2")
    assert status["pveversion"] == "pve-manager/9.2.20/49318c671b82f31e"
    assert status["kversion"].startswith("Linux 7.0.14-17-pve #1 SMP")
    assert set(status["memory"]) == {"total", "used", "free", "available"}
    assert status["cpuinfo"]["cpus"] == 16
    assert all(isinstance(x, str) for x in status["loadavg"])


def test_every_node_has_the_bridge_vmbr0(api: Api) -> None:
    for node in ("pve1", "pve2", "pve3"):
        bridges = api.node_network(node)
        assert [b["iface"] for b in bridges] == ["vmbr0"]
        assert bridges[0]["type"] == "bridge" and bridges[0]["bridge_vlan_aware"] == 1
    everything = api.node_network("pve1", type=None)
    assert {i["iface"] for i in everything} == {"eno1", "vmbr0"}


def test_resources_list_guests_in_string_order_of_their_vmid(engine: Simulator, api: Api) -> None:
    engine.control.create_vms(2, start_vmid=1000, tags=None)
    vmids = [e["vmid"] for e in api.cluster_resources()]
    assert vmids == [100, 1000, 1001, 101, 102, 200, 9000, 9001, 9002]


def test_resource_entries_carry_proxmoxs_fields(api: Api) -> None:
    entries = {e["vmid"]: e for e in api.cluster_resources()}
    web = entries[100]
    assert web["id"] == "qemu/100" and web["type"] == "qemu" and web["node"] == "pve1"
    assert web["status"] == "running" and web["name"] == "web-1" and web["template"] == 0
    assert web["maxmem"] == 2 * 1024**3 and web["maxcpu"] == 2
    assert web["maxdisk"] == 10 * 1024**3 and web["disk"] == 0 and web["uptime"] > 0
    assert web["tags"] == "web"
    assert entries[9000]["template"] == 1 and entries[9000]["maxdisk"] == 3 * 1024**3
    assert entries[200]["type"] == "lxc" and entries[200]["id"] == "lxc/200"
    assert entries[200]["name"] == "ct-dns"
    assert "lock" not in web and "hastate" not in web


def test_resources_type_filter(api: Api) -> None:
    nodes = api.cluster_resources(type="node")
    assert {e["type"] for e in nodes} == {"node"} and len(nodes) == 3
    storages = api.cluster_resources(type="storage")
    ids = {e["id"] for e in storages}
    assert "storage/pve1/vmstore" in ids and "storage/pve3/proxy-seeds" in ids
    shared = next(e for e in storages if e["storage"] == "vmstore")
    assert shared["shared"] == 1 and shared["plugintype"] == "rbd"


def test_guests_of_an_offline_node_read_unknown(engine: Simulator, api: Api) -> None:
    engine.control.node_offline("pve3")
    entry = next(e for e in api.cluster_resources() if e["vmid"] == 102)
    assert entry["status"] == "unknown"
    assert entry["node"] == "pve3"


def test_a_paused_vm_is_listed_as_running(engine: Simulator, api: Api) -> None:
    """Seed 000 entry 9 (F14): only status/current tells a paused VM apart."""
    engine.control.pause_vm(100)
    entry = next(e for e in api.cluster_resources() if e["vmid"] == 100)
    assert entry["status"] == "running"
    assert api.vm_status("pve1", 100)["qmpstatus"] == "paused"


def test_lock_and_ha_state_appear_in_the_listing(engine: Simulator, api: Api) -> None:
    engine.control.set_lock(101, "backup")
    engine.control.set_ha(100, state="started")
    entries = {e["vmid"]: e for e in api.cluster_resources()}
    assert entries[101]["lock"] == "backup"
    assert entries[100]["hastate"] == "started"


def test_nextid_is_the_lowest_free_vmid_as_a_string(raw: Any) -> None:
    assert raw.json("GET", "/api2/json/cluster/nextid") == {"data": "103"}


def test_nextid_echoes_a_free_vmid_and_refuses_a_used_one(
    api: Api, raw: Any, api_error: Any
) -> None:
    assert raw.json("GET", "/api2/json/cluster/nextid", query={"vmid": "100500"}) == {
        "data": "100500"
    }
    assert api.cluster_nextid(vmid=100500) == 100500
    err = api_error(lambda: api.cluster_nextid(vmid=101))
    assert err.status == 400
    assert err.errors == {"vmid": "VM 101 already exists"}


def test_nextid_exhausted_names_the_range_with_its_exclusive_upper_bound(
    api: Api, engine: Any, api_error: Any
) -> None:
    """pve-reference §5.1: ``/cluster/nextid`` scans ``[lower, upper)`` and, exhausted, answers
    500 ``unable to get any free VMID in range [<lower>, <upper>]`` with the exclusive bound."""
    engine.cluster.nextid_range = (100, 103)  # 100, 101 and 102 are taken in the default state
    err = api_error(lambda: api.cluster_nextid())
    assert (err.status, err.message) == (500, "unable to get any free VMID in range [100, 103]")


def test_a_container_is_readable_and_foreign_to_qemu_endpoints(
    raw: Any, api: Api, api_error: Any
) -> None:
    config = raw.json("GET", "/api2/json/nodes/pve2/lxc/200/config")["data"]
    assert config["hostname"] == "ct-dns" and config["memory"] == 512
    status = raw.json("GET", "/api2/json/nodes/pve2/lxc/200/status/current")["data"]
    assert status["type"] == "lxc" and status["status"] == "running"
    err = api_error(lambda: api.vm_config("pve2", 200))
    assert err.message == "Configuration file 'nodes/pve2/qemu-server/200.conf' does not exist"


def test_a_vm_asked_on_the_wrong_node_does_not_exist(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.vm_status("pve2", 100))
    assert err.message == "Configuration file 'nodes/pve2/qemu-server/100.conf' does not exist"


def test_ten_thousand_vms_are_listed_complete_and_in_order() -> None:
    """Scale check (the timing itself is measured in benchmarks/, per STYLE.md)."""
    api, engine = sim_api(state="empty", token_secret="s")
    created = engine.control.create_vms(10000, start_vmid=100000, running=True)
    assert len(created) == 10000
    entries = api.cluster_resources()
    assert len(entries) == 10000
    assert [e["vmid"] for e in entries[:3]] == [100000, 100001, 100002]
    assert {e["node"] for e in entries} == {"pve1", "pve2", "pve3"}
    assert all(e["status"] == "running" for e in entries)
    assert api.cluster_nextid() == 100


@pytest.mark.parametrize("state", ["empty"])
def test_the_empty_state_has_nodes_and_storages_only(state: str) -> None:
    api, _ = sim_api(state=state, token_secret="s")
    assert api.cluster_resources() == []
    assert api.storage_status("pve1", "proxy-seeds")["content"] == "iso"
    assert api.cluster_nextid() == 100
