"""The guest agent: Proxmox's three messages, boot timing, and where the agent comes from
(pve-reference §3.3, §7.19; seed 000 entry 7)."""

from __future__ import annotations

import ipaddress
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.simulator import Simulator

NOT_RUNNING = "QEMU guest agent is not running"


def _ipv4(interfaces: list[dict[str, Any]], name: str = "eth0") -> str | None:
    iface = next(i for i in interfaces if i["name"] == name)
    found = [a["ip-address"] for a in iface["ip-addresses"] if a["ip-address-type"] == "ipv4"]
    return found[0] if found else None


def _agent_message(api: Api, node: str, vmid: int) -> str:
    with pytest.raises(ApiError) as caught:
        api.agent_network_interfaces(node, vmid)
    assert caught.value.status == 500
    return caught.value.message


def _start_clone(timed: Any, template: int, vmid: int, **config: Any) -> None:
    api = timed.api
    timed.wait(api.clone("pve1", template, newid=vmid, name=f"proxy-g{vmid}"))
    if config:
        api.set_vm_config("pve1", vmid, config)
    assert timed.wait(api.start("pve1", vmid))["exitstatus"] == "OK"


def test_no_agent_key_is_no_qemu_guest_agent_configured(engine: Simulator, api: Api) -> None:
    engine.control.remove_agent(100)
    assert _agent_message(api, "pve1", 100) == "No QEMU guest agent configured"


def test_a_stopped_vm_is_not_running(api: Api) -> None:
    assert _agent_message(api, "pve2", 101) == "VM 101 is not running"


def test_a_missing_vm(api: Api) -> None:
    assert _agent_message(api, "pve1", 100999) == (
        "Configuration file 'nodes/pve1/qemu-server/100999.conf' does not exist"
    )


def test_a_running_vm_with_a_baked_agent_reports_lo_and_eth0(engine: Simulator, api: Api) -> None:
    interfaces = api.agent_network_interfaces("pve1", 100)
    assert [i["name"] for i in interfaces] == ["lo", "eth0"]
    mac = api.vm_config("pve1", 100)["net0"].split(",")[0].split("=")[1]
    assert interfaces[1]["hardware-address"] == mac.lower()
    address = _ipv4(interfaces)
    assert address is not None
    assert ipaddress.ip_address(address) in ipaddress.ip_network("10.20.0.0/16")
    assert _ipv4(interfaces, "lo") == "127.0.0.1"


def test_the_baked_agent_answers_after_its_boot_delay_and_the_address_later(
    timed: Any,
) -> None:
    api = timed.api
    _start_clone(timed, 9000, 101000)
    assert _agent_message(api, "pve1", 101000) == NOT_RUNNING
    timed.advance(0.35)  # the agent is up (0.3 s), DHCP not yet (0.6 s)
    assert _ipv4(api.agent_network_interfaces("pve1", 101000)) is None
    timed.advance(0.3)
    address = _ipv4(api.agent_network_interfaces("pve1", 101000))
    assert address is not None and address.startswith("10.20.")


def test_a_template_without_the_agent_never_answers(timed: Any) -> None:
    _start_clone(timed, 9001, 101001)
    timed.advance(3600)
    assert _agent_message(timed.api, "pve1", 101001) == NOT_RUNNING


def test_a_seed_whose_vendor_data_installs_the_agent(
    timed: Any, seed_iso: Any, agent_vendor_data: bytes
) -> None:
    api = timed.api
    timed.wait(
        api.upload_iso(
            "pve1",
            "proxy-seeds",
            filename="proxy-g101002-seed.iso",
            content=seed_iso(agent_vendor_data),
        )
    )
    _start_clone(timed, 9001, 101002, ide2="proxy-seeds:iso/proxy-g101002-seed.iso,media=cdrom")
    timed.advance(0.9)  # DHCP (0.6 s) plus the package install (0.4 s) not done yet
    assert _agent_message(api, "pve1", 101002) == NOT_RUNNING
    timed.advance(0.2)
    assert _ipv4(api.agent_network_interfaces("pve1", 101002)) is not None
    assert timed.engine.control.vm(101002)["agentInstalled"] is True


def test_a_seed_without_vendor_data_gives_no_agent(timed: Any, seed_iso: Any) -> None:
    api = timed.api
    timed.wait(api.upload_iso("pve1", "proxy-seeds", filename="s.iso", content=seed_iso(None)))
    _start_clone(timed, 9001, 101003, ide2="proxy-seeds:iso/s.iso,media=cdrom")
    timed.advance(3600)
    assert _agent_message(api, "pve1", 101003) == NOT_RUNNING


def test_vendor_data_as_mime_multipart_with_base64_parts(
    engine: Simulator, api: Api, new_vm: Any, seed_iso: Any, exitstatus: Any
) -> None:
    message = MIMEMultipart("mixed")
    message.attach(MIMEText("#!/bin/sh\necho operator vendor data\n", "x-shellscript"))
    agent_part = MIMEText("#cloud-config\npackages: [qemu-guest-agent]\n", "cloud-config", "utf-8")
    message.attach(agent_part)
    assert "qemu-guest-agent" not in message.as_string()  # base64: only decoding finds it
    api.upload_iso("pve1", "proxy-seeds", filename="m.iso", content=seed_iso(message.as_bytes()))
    vmid = new_vm(template=9001)
    api.set_vm_config("pve1", vmid, {"ide2": "proxy-seeds:iso/m.iso,media=cdrom"})
    assert exitstatus(api.start("pve1", vmid)) == "OK"
    assert _ipv4(api.agent_network_interfaces("pve1", vmid)) is not None


def test_a_vlan_tag_puts_the_vm_in_another_subnet(api: Api, new_vm: Any, exitstatus: Any) -> None:
    vmid = new_vm()
    net0 = api.vm_config("pve1", vmid)["net0"]
    api.set_vm_config("pve1", vmid, {"net0": net0 + ",tag=4"})
    exitstatus(api.start("pve1", vmid))
    address = _ipv4(api.agent_network_interfaces("pve1", vmid))
    assert address is not None
    assert ipaddress.ip_address(address) in ipaddress.ip_network("10.24.0.0/16")


def test_addresses_are_stable_per_vm(api: Api, new_vm: Any, exitstatus: Any) -> None:
    vmid = new_vm()
    exitstatus(api.start("pve1", vmid))
    first = _ipv4(api.agent_network_interfaces("pve1", vmid))
    exitstatus(api.reboot("pve1", vmid))
    assert _ipv4(api.agent_network_interfaces("pve1", vmid)) == first
    other = new_vm()
    exitstatus(api.start("pve1", other))
    assert _ipv4(api.agent_network_interfaces("pve1", other)) != first


def test_a_paused_vm_or_a_disabled_agent_does_not_answer(
    engine: Simulator, api: Api, new_vm: Any, exitstatus: Any
) -> None:
    engine.control.pause_vm(100)
    assert _agent_message(api, "pve1", 100) == NOT_RUNNING
    vmid = new_vm()
    api.set_vm_config("pve1", vmid, {"agent": 0})
    exitstatus(api.start("pve1", vmid))
    assert _agent_message(api, "pve1", vmid) == NOT_RUNNING


def test_a_bridge_the_node_lacks_gives_no_address(api: Api, new_vm: Any, exitstatus: Any) -> None:
    vmid = new_vm()
    net0 = api.vm_config("pve1", vmid)["net0"].replace("bridge=vmbr0", "bridge=vmbr9")
    api.set_vm_config("pve1", vmid, {"net0": net0})
    exitstatus(api.start("pve1", vmid))
    assert _ipv4(api.agent_network_interfaces("pve1", vmid)) is None


def test_a_missing_seed_iso_makes_qemu_fail_to_start(
    api: Api, new_vm: Any, exitstatus: Any
) -> None:
    vmid = new_vm()
    api.set_vm_config("pve1", vmid, {"ide2": "proxy-seeds:iso/gone.iso,media=cdrom"})
    assert exitstatus(api.start("pve1", vmid)).endswith("start failed: QEMU exited with code 1")
    assert api.vm_status("pve1", vmid)["status"] == "stopped"


def test_ping_and_osinfo(raw: Any) -> None:
    ping = raw.json("POST", "/api2/json/nodes/pve1/qemu/100/agent/ping")
    assert ping == {"data": {"result": {}}}
    osinfo = raw.json("GET", "/api2/json/nodes/pve1/qemu/100/agent/get-osinfo")["data"]
    assert osinfo["result"]["id"] == "debian"


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


def test_scripted_interfaces_come_after_the_nics_or_before_them(
    engine: Simulator, api: Api
) -> None:
    engine.control.set_guest_interfaces(100, [DOCKER0, TUN0])
    assert [i["name"] for i in api.agent_network_interfaces("pve1", 100)] == [
        "lo",
        "eth0",
        "docker0",
        "tun0",
    ]
    engine.control.set_guest_interfaces(100, [DOCKER0, TUN0], first=True, nic_ipv4=False)
    interfaces = api.agent_network_interfaces("pve1", 100)
    assert [i["name"] for i in interfaces] == ["lo", "docker0", "tun0", "eth0"]
    assert _ipv4(interfaces, "docker0") == "172.17.0.1"
    # eth0 keeps only its IPv6 link-local address.
    assert _ipv4(interfaces) is None
    assert [a["ip-address-type"] for a in interfaces[3]["ip-addresses"]] == ["ipv6"]


def test_scripted_interfaces_are_refused_without_the_agent_shape(engine: Simulator) -> None:
    from pvesim.control import ControlError

    with pytest.raises(ControlError):
        engine.control.set_guest_interfaces(100, [{"hardware-address": "x"}])
    with pytest.raises(ControlError):
        engine.control.set_guest_interfaces(100, [{"name": "x", "ip-addresses": [{"a": 1}]}])


def test_clones_inherit_the_scripted_interfaces(timed: Any) -> None:
    timed.engine.control.set_guest_interfaces(9000, [DOCKER0], first=True)
    _start_clone(timed, 9000, 100500)
    timed.advance(600)
    names = [i["name"] for i in timed.api.agent_network_interfaces("pve1", 100500)]
    assert names == ["lo", "docker0", "eth0"]
