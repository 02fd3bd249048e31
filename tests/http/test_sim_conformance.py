"""The simulator over HTTPS behaves as pve-reference says a real Proxmox VE node does.

One test per documented behaviour, spoken with plain ``requests`` over TLS, so what is checked
is the wire: status lines, reason phrases, bodies, UPIDs. The engine runs on a manual clock;
``pve`` finishes every task at once (``instant``), ``pve_timed`` lets time pass only when the
test says so (``fast``). Section numbers refer to pve-reference/README.md.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from typing import Any
from urllib.parse import quote

import pytest
import requests
from pvesim_client import SECRET, Pve, seed_iso

from tests.support.imageserver import image_server

pytestmark = pytest.mark.http

UPID = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?):(?P<pid>[0-9A-F]{8}):"
    r"(?P<pstart>[0-9A-F]{8,9}):(?P<starttime>[0-9A-F]{8}):(?P<type>[^:\s/]+):"
    r"(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)
TEMPLATE = 9000  # the good template, agent baked in (defaults.py)
NO_AGENT_TEMPLATE = 9001
AGENT_VENDOR_DATA = (
    b"#cloud-config\npackages:\n  - qemu-guest-agent\n"
    b"runcmd:\n  - systemctl enable --now qemu-guest-agent\n"
)


def clone(pve: Pve, newid: int, source: int = TEMPLATE, **params: Any) -> str:
    return str(
        pve.data(
            "POST",
            f"/nodes/pve1/qemu/{source}/clone",
            data={"newid": str(newid), "name": f"proxy-c{newid}", **params},
        )
    )


def ok(pve: Pve, upid: str) -> None:
    status = pve.wait(upid)
    assert status["exitstatus"] == "OK", status


def config(pve: Pve, vmid: int, node: str = "pve1") -> dict[str, Any]:
    return dict(pve.data("GET", f"/nodes/{node}/qemu/{vmid}/config"))


def resources(pve: Pve) -> dict[int, dict[str, Any]]:
    return {e["vmid"]: e for e in pve.data("GET", "/cluster/resources", params={"type": "vm"})}


def mac_of(net: str) -> str:
    return net.split(",")[0].split("=")[1]


# --- authentication and routing (§1.1, §1.3, §2.2) ------------------------------------------


def test_no_token_is_401_no_ticket_with_an_empty_body(pve: Pve) -> None:
    answer = pve.request("GET", "/version", token=None)
    assert (answer.status_code, answer.reason, answer.content) == (401, "No ticket", b"")


def test_a_wrong_secret_is_401_authentication_failed(pve: Pve) -> None:
    answer = pve.request("GET", "/version", token="proxyhub@pve!sim=not-the-secret")
    assert (answer.status_code, answer.reason, answer.content) == (
        401,
        "Authentication failed!",
        b"",
    )


def test_the_right_token_is_accepted(pve: Pve) -> None:
    version = pve.data("GET", "/version", token=f"proxyhub@pve!sim={SECRET}")
    assert {"version", "release", "repoid"} <= set(version)


def test_an_unknown_route_is_501_with_a_json_body(pve: Pve) -> None:
    answer = pve.request("GET", "/nodes/pve1/qemu/123/foo")
    assert answer.status_code == 501
    assert answer.reason == "Method 'GET /nodes/pve1/qemu/123/foo' not implemented"
    # errors.json: this message has no trailing newline (pve-manager HTTPServer.pm).
    assert answer.json() == {
        "data": None,
        "message": "Method 'GET /nodes/pve1/qemu/123/foo' not implemented",
    }


def test_a_delete_with_a_body_is_501_in_plain_text(pve: Pve) -> None:
    answer = pve.request("DELETE", "/nodes/pve1/qemu/100", data="purge=1")
    assert (answer.status_code, answer.reason) == (501, "Unexpected content for method 'DELETE'")
    assert answer.text == "Unexpected content for method 'DELETE'"


# --- parameter verification (§1.3) ----------------------------------------------------------


def verification(pve: Pve, method: str, path: str, **kwargs: Any) -> dict[str, str]:
    answer = pve.request(method, path, **kwargs)
    assert (answer.status_code, answer.reason) == (400, "Parameter verification failed.")
    body = answer.json()
    assert body["data"] is None
    assert body["message"] == "Parameter verification failed.\n"
    return dict(body["errors"])


def test_an_unknown_parameter_is_400(pve: Pve) -> None:
    assert verification(pve, "PUT", "/nodes/pve1/qemu/100/config", data={"foo": "1"}) == {
        "foo": "property is not defined in schema and the schema does not allow "
        "additional properties"
    }


def test_a_bad_vmid_is_400(pve: Pve) -> None:
    errors = verification(pve, "POST", f"/nodes/pve1/qemu/{TEMPLATE}/clone", data={"newid": "50"})
    assert errors == {"newid": "invalid format - value does not look like a valid VM ID\n"}


def test_a_form_boolean_true_is_400(pve: Pve) -> None:
    errors = verification(
        pve,
        "POST",
        f"/nodes/pve1/qemu/{TEMPLATE}/clone",
        data={"newid": "100500", "full": "true"},
    )
    assert errors == {"full": "type check ('boolean') failed - got 'true'"}


def test_a_json_body_may_carry_real_booleans(pve: Pve) -> None:
    upid = pve.data(
        "POST", f"/nodes/pve1/qemu/{TEMPLATE}/clone", json={"newid": 100501, "full": True}
    )
    ok(pve, upid)


# --- tasks and UPIDs (§4) -------------------------------------------------------------------


def test_upid_format_and_task_status(pve: Pve) -> None:
    upid = clone(pve, 100510)
    found = UPID.fullmatch(upid)
    assert found is not None, upid
    assert (found["node"], found["type"], found["id"]) == ("pve1", "qmclone", str(TEMPLATE))
    assert found["user"] == "proxyhub@pve!sim"
    status = pve.task(upid)
    assert status["upid"] == upid
    assert status["status"] == "stopped"
    assert status["exitstatus"] == "OK"
    # A token's identity is split into user and tokenid (§4.2).
    assert (status["user"], status["tokenid"]) == ("proxyhub@pve", "sim")
    assert (status["pid"], status["starttime"]) == (
        int(found["pid"], 16),
        int(found["starttime"], 16),
    )


def test_task_log_pages_and_counts(pve: Pve) -> None:
    upid = clone(pve, 100511)
    path = f"/nodes/pve1/tasks/{quote(upid, safe='')}/log"
    answer = pve.request("GET", path)
    body = answer.json()
    total = body["total"]
    assert len(body["data"]) == min(total, 50)  # limit defaults to 50
    assert body["data"][-1]["t"] == "TASK OK"
    assert [line["n"] for line in body["data"]] == list(range(1, len(body["data"]) + 1))
    page = pve.request("GET", path, params={"start": "1", "limit": "2"}).json()
    assert page["total"] == total
    assert [line["n"] for line in page["data"]] == [2, 3]


def test_an_empty_task_log_reads_no_content(pve_timed: Pve) -> None:
    # A node runs four tasks at once; the fifth waits for a slot and has written nothing.
    upids = [clone(pve_timed, 100520 + i) for i in range(5)]
    waiting = upids[-1]
    assert pve_timed.task(waiting)["status"] == "running"
    body = pve_timed.request("GET", f"/nodes/pve1/tasks/{quote(waiting, safe='')}/log").json()
    assert body == {"data": [{"n": 1, "t": "no content"}], "total": 1}


def test_task_status_on_the_wrong_node_is_no_such_task(pve: Pve) -> None:
    upid = clone(pve, 100512)
    errors = verification(pve, "GET", f"/nodes/pve2/tasks/{quote(upid, safe='')}/status")
    assert errors == {"upid": "no such task"}


# --- clone (§7.14, §8 rule 2) ---------------------------------------------------------------


def test_a_clone_is_listed_at_once_as_a_nameless_locked_entry(pve_timed: Pve) -> None:
    upid = clone(pve_timed, 100530)
    entry = resources(pve_timed)[100530]
    assert entry == {
        "id": "qemu/100530",
        "vmid": 100530,
        "node": "pve1",
        "type": "qemu",
        "status": "unknown",
        "lock": "clone",
    }
    # Any write to the target meanwhile is refused, synchronously.
    answer = pve_timed.request("PUT", "/nodes/pve1/qemu/100530/config", data={"cores": "2"})
    assert (answer.status_code, answer.reason) == (500, "VM is locked (clone)")
    assert answer.json() == {"data": None, "message": "VM is locked (clone)\n"}
    ok(pve_timed, upid)
    assert "lock" not in config(pve_timed, 100530)


def test_a_clone_gets_new_identity_and_keeps_description_and_tags(pve: Pve) -> None:
    pve.data(
        "PUT",
        f"/nodes/pve1/qemu/{TEMPLATE}/config",
        data={"tags": "golden", "description": "base image"},
    )
    source = config(pve, TEMPLATE)
    ok(pve, clone(pve, 100531))
    copy = config(pve, 100531)
    assert copy["name"] == "proxy-c100531"
    assert mac_of(copy["net0"]) != mac_of(source["net0"])
    assert copy["net0"].split(",")[1:] == source["net0"].split(",")[1:]
    assert copy["smbios1"] != source["smbios1"]
    assert (copy["description"], copy["tags"]) == ("base image", "golden")
    assert "template" not in copy


def test_a_clone_description_parameter_wins(pve: Pve) -> None:
    ok(pve, clone(pve, 100532, description="proxyhub-managed=true"))
    assert config(pve, 100532)["description"] == "proxyhub-managed=true"


def test_a_clone_onto_a_taken_vmid_is_refused(pve: Pve) -> None:
    ok(pve, clone(pve, 100533))
    answer = pve.request("POST", f"/nodes/pve1/qemu/{TEMPLATE}/clone", data={"newid": "100533"})
    assert (answer.status_code, answer.reason) == (
        500,
        "unable to create VM 100533: config file already exists",
    )


# --- config writes (§5.2, §7.13) -------------------------------------------------------------


def test_tags_come_back_normalised(pve: Pve) -> None:
    ok(pve, clone(pve, 100540))
    pve.data("PUT", "/nodes/pve1/qemu/100540/config", data={"tags": "Proxy,managed proxy"})
    assert config(pve, 100540)["tags"] == "managed;proxy"
    assert resources(pve)[100540]["tags"] == "managed;proxy"


def test_every_write_changes_the_digest(pve: Pve) -> None:
    ok(pve, clone(pve, 100541))
    digests = [config(pve, 100541)["digest"]]
    for cores in ("2", "3"):
        pve.data("PUT", "/nodes/pve1/qemu/100541/config", data={"cores": cores})
        digests.append(config(pve, 100541)["digest"])
    assert len(set(digests)) == 3
    stale = pve.request(
        "PUT", "/nodes/pve1/qemu/100541/config", data={"cores": "4", "digest": digests[0]}
    )
    assert (stale.status_code, stale.reason) == (
        500,
        "checksum mismatch (file change by other user?)",
    )


def test_put_config_answers_null(pve: Pve) -> None:
    ok(pve, clone(pve, 100542))
    answer = pve.request("PUT", "/nodes/pve1/qemu/100542/config", data={"memory": "2048"})
    assert answer.json() == {"data": None}
    assert config(pve, 100542)["memory"] == "2048"  # a property string: a JSON string


# --- disks and power (§3.2, §3.5, §7.16, §7.18) ------------------------------------------------


def test_resize_refuses_to_shrink_in_the_task(pve: Pve) -> None:
    ok(pve, clone(pve, 100550))
    grow = pve.data("PUT", "/nodes/pve1/qemu/100550/resize", data={"disk": "scsi0", "size": "10G"})
    ok(pve, grow)
    assert "size=10G" in config(pve, 100550)["scsi0"]
    shrink = pve.data("PUT", "/nodes/pve1/qemu/100550/resize", data={"disk": "scsi0", "size": "5G"})
    assert UPID.fullmatch(shrink)["type"] == "resize"  # type: ignore[index]
    assert pve.wait(shrink)["exitstatus"] == "shrinking disks is not supported"


def test_starting_a_running_vm_fails_in_the_task(pve: Pve) -> None:
    ok(pve, clone(pve, 100551))
    ok(pve, pve.data("POST", "/nodes/pve1/qemu/100551/status/start"))
    again = pve.data("POST", "/nodes/pve1/qemu/100551/status/start")
    assert pve.wait(again)["exitstatus"] == "VM 100551 already running"


def test_stopping_a_stopped_vm_is_a_successful_task(pve: Pve) -> None:
    ok(pve, clone(pve, 100552))
    ok(pve, pve.data("POST", "/nodes/pve1/qemu/100552/status/stop"))


def test_destroying_a_running_vm_is_refused(pve: Pve) -> None:
    ok(pve, clone(pve, 100553))
    ok(pve, pve.data("POST", "/nodes/pve1/qemu/100553/status/start"))
    answer = pve.request("DELETE", "/nodes/pve1/qemu/100553", params={"purge": "1"})
    assert (answer.status_code, answer.reason) == (500, "VM 100553 is running - destroy failed")
    ok(pve, pve.data("POST", "/nodes/pve1/qemu/100553/status/stop"))
    destroy = pve.data(
        "DELETE",
        "/nodes/pve1/qemu/100553",
        params={"purge": "1", "destroy-unreferenced-disks": "1"},
    )
    ok(pve, destroy)
    gone = pve.request("GET", "/nodes/pve1/qemu/100553/config")
    assert gone.reason == "Configuration file 'nodes/pve1/qemu-server/100553.conf' does not exist"


# --- storage (§7.5-7.7) ---------------------------------------------------------------------


def upload(pve: Pve, filename: str, content: bytes, **fields: str) -> Any:
    return pve.request(
        "POST",
        "/nodes/pve1/storage/proxy-seeds/upload",
        data={"content": "iso", **fields},
        files={"filename": (filename, content, "application/octet-stream")},
    )


def isos(pve: Pve) -> dict[str, int]:
    items = pve.data("GET", "/nodes/pve1/storage/proxy-seeds/content", params={"content": "iso"})
    return {i["volid"]: i["size"] for i in items}


def test_upload_is_an_imgcopy_task_with_an_empty_id(pve: Pve) -> None:
    answer = upload(pve, "proxy-a-seed.iso", b"A" * 4096)
    assert answer.status_code == 200
    upid = answer.json()["data"]
    found = UPID.fullmatch(upid)
    assert found is not None
    assert (found["type"], found["id"]) == ("imgcopy", "")
    ok(pve, upid)
    assert isos(pve)["proxy-seeds:iso/proxy-a-seed.iso"] == 4096


def test_upload_overwrites_a_file_of_the_same_name(pve: Pve) -> None:
    ok(pve, upload(pve, "proxy-b-seed.iso", b"1" * 100).json()["data"])
    ok(pve, upload(pve, "proxy-b-seed.iso", b"2" * 300).json()["data"])
    assert isos(pve)["proxy-seeds:iso/proxy-b-seed.iso"] == 300


def test_upload_of_an_iso_needs_the_iso_extension(pve: Pve) -> None:
    answer = upload(pve, "seed.txt", b"x")
    assert (answer.status_code, answer.reason) == (400, "Parameter verification failed.")
    assert answer.json()["errors"] == {"filename": "wrong file extension"}


def test_upload_with_a_wrong_checksum_fails_in_the_task(pve: Pve) -> None:
    answer = upload(pve, "c.iso", b"data", **{"checksum-algorithm": "sha256", "checksum": "0" * 64})
    status = pve.wait(answer.json()["data"])
    assert status["exitstatus"].startswith("checksum mismatch: got '")


def test_volume_delete_is_imgdel_and_a_missing_volume_is_still_ok(pve: Pve) -> None:
    ok(pve, upload(pve, "proxy-d-seed.iso", b"d").json()["data"])
    volid = quote("proxy-seeds:iso/proxy-d-seed.iso", safe="")
    upid = pve.data("DELETE", f"/nodes/pve1/storage/proxy-seeds/content/{volid}")
    found = UPID.fullmatch(upid)
    assert found is not None and found["type"] == "imgdel"
    ok(pve, upid)
    assert "proxy-seeds:iso/proxy-d-seed.iso" not in isos(pve)
    ok(pve, pve.data("DELETE", f"/nodes/pve1/storage/proxy-seeds/content/{volid}"))


# --- /cluster/nextid (§7.10) -----------------------------------------------------------------


def test_nextid_is_a_string_and_a_taken_vmid_is_400(pve: Pve) -> None:
    free = pve.data("GET", "/cluster/nextid")
    assert isinstance(free, str) and int(free) >= 100
    assert pve.data("GET", "/cluster/nextid", params={"vmid": "100600"}) == "100600"
    errors = verification(pve, "GET", "/cluster/nextid", params={"vmid": str(TEMPLATE)})
    assert errors == {"vmid": f"VM {TEMPLATE} already exists"}


# --- the guest agent (§3.3, §7.19) -----------------------------------------------------------


def agent(pve: Pve, vmid: int) -> Any:
    return pve.request("GET", f"/nodes/pve1/qemu/{vmid}/agent/network-get-interfaces")


def agent_error(pve: Pve, vmid: int) -> str:
    answer = agent(pve, vmid)
    assert answer.status_code == 500
    message = answer.json()["message"]
    assert message == answer.reason + "\n"
    return str(answer.reason)


def ipv4(pve: Pve, vmid: int) -> str | None:
    answer = agent(pve, vmid)
    assert answer.status_code == 200, answer.reason
    for iface in answer.json()["data"]["result"]:
        if iface["name"] == "eth0":
            for address in iface.get("ip-addresses", []):
                if address["ip-address-type"] == "ipv4":
                    return str(address["ip-address"])
    return None


def start_clone(pve: Pve, vmid: int, source: int, **settings: str) -> None:
    ok(pve, clone(pve, vmid, source))
    if settings:
        pve.data("PUT", f"/nodes/pve1/qemu/{vmid}/config", data=settings)
    ok(pve, pve.data("POST", f"/nodes/pve1/qemu/{vmid}/status/start"))


def test_the_agents_three_messages(pve: Pve) -> None:
    ok(pve, clone(pve, 100700))
    assert agent_error(pve, 100700) == "VM 100700 is not running"
    pve.data("PUT", "/nodes/pve1/qemu/100700/config", data={"delete": "agent"})
    ok(pve, pve.data("POST", "/nodes/pve1/qemu/100700/status/start"))
    assert agent_error(pve, 100700) == "No QEMU guest agent configured"
    start_clone(pve, 100701, NO_AGENT_TEMPLATE)
    assert agent_error(pve, 100701) == "QEMU guest agent is not running"


def test_a_baked_agent_reports_an_address_after_the_boot_delay(pve_timed: Pve) -> None:
    start_clone(pve_timed, 100710, TEMPLATE)
    assert agent_error(pve_timed, 100710) == "QEMU guest agent is not running"
    pve_timed.control("advance", seconds=0.35)  # agent up (0.3 s), no DHCP lease yet (0.6 s)
    assert ipv4(pve_timed, 100710) is None
    pve_timed.control("advance", seconds=0.3)
    address = ipv4(pve_timed, 100710)
    assert address is not None
    assert ipaddress.ip_address(address).version == 4


def test_a_template_without_the_agent_never_reports(pve_timed: Pve) -> None:
    start_clone(pve_timed, 100711, NO_AGENT_TEMPLATE)
    pve_timed.control("advance", seconds=3600)
    assert agent_error(pve_timed, 100711) == "QEMU guest agent is not running"


def test_vendor_data_that_installs_the_agent_gives_an_address(pve_timed: Pve) -> None:
    answer = upload(pve_timed, "proxy-v-seed.iso", seed_iso(AGENT_VENDOR_DATA))
    ok(pve_timed, answer.json()["data"])
    start_clone(
        pve_timed,
        100712,
        NO_AGENT_TEMPLATE,
        ide2="proxy-seeds:iso/proxy-v-seed.iso,media=cdrom",
    )
    assert agent_error(pve_timed, 100712) == "QEMU guest agent is not running"
    pve_timed.control("advance", seconds=60)
    assert ipv4(pve_timed, 100712) is not None


def test_a_seed_without_vendor_data_gives_no_agent(pve_timed: Pve) -> None:
    ok(pve_timed, upload(pve_timed, "proxy-n-seed.iso", seed_iso(None)).json()["data"])
    start_clone(
        pve_timed,
        100713,
        NO_AGENT_TEMPLATE,
        ide2="proxy-seeds:iso/proxy-n-seed.iso,media=cdrom",
    )
    pve_timed.control("advance", seconds=3600)
    assert agent_error(pve_timed, 100713) == "QEMU guest agent is not running"


# --- nodes going offline (§1.4) --------------------------------------------------------------


def test_an_offline_node_answers_595_and_its_guests_read_unknown(pve: Pve) -> None:
    pve.control("node_offline", node="pve3")
    answer = pve.request("GET", "/nodes/pve3/status")
    assert (answer.status_code, answer.content) == (595, b"")
    assert answer.reason == "No route to host"
    on_pve3 = [e for e in resources(pve).values() if e["node"] == "pve3"]
    assert on_pve3 and all(e["status"] == "unknown" for e in on_pve3)
    nodes = {n["node"]: n["status"] for n in pve.data("GET", "/nodes")}
    assert nodes["pve3"] != "online"
    pve.control("node_online", node="pve3")
    assert pve.request("GET", "/nodes/pve3/status").status_code == 200


# --- fault injection under /_sim/ -------------------------------------------------------------


def test_a_scripted_failure_hits_exactly_the_nth_call(pve: Pve) -> None:
    pve.control("fail_call", method="GET", path="/version", nth=2, kind="596")
    assert pve.request("GET", "/version").status_code == 200
    second = pve.request("GET", "/version")
    assert (second.status_code, second.reason, second.content) == (
        596,
        "Connection timed out",
        b"",
    )
    assert pve.request("GET", "/version").status_code == 200


def test_a_dropped_reply_resets_the_connection_after_the_clone_happened(pve: Pve) -> None:
    pve.control("drop_reply", method="POST", path="/nodes/{node}/qemu/{vmid}/clone")
    with pytest.raises(requests.ConnectionError):
        clone(pve, 100800)
    # The mutation was applied: a retry must find the VM, not create a second one.
    assert 100800 in resources(pve)


def test_the_ledger_counts_what_reached_the_simulator(pve: Pve) -> None:
    pve.request("GET", "/version")
    pve.request("GET", "/nodes")
    answer = pve.session.get(
        f"{pve.server.url}/_sim/ledger", params={"method": "GET"}, verify=pve.ca, timeout=10
    )
    assert answer.status_code == 200
    keys = [entry["key"] for entry in answer.json()["data"]]
    assert keys[-2:] == ["GET /version", "GET /nodes"]


def test_the_control_surface_refuses_unknown_calls(pve: Pve) -> None:
    answer = pve.session.post(f"{pve.server.url}/_sim/explode", json={}, verify=pve.ca)
    assert answer.status_code == 404


def test_download_url_over_https_fetches_from_loopback_and_checks_the_checksum(pve: Pve) -> None:
    """Issue 14, pve-reference §7.8 and §3.7: the node (the HTTPS simulator) fetches the URL
    itself; a good checksum stores the file, a wrong one fails the ``download`` task."""
    with image_server(b"image-over-https" * 64) as served:
        digest = hashlib.sha256(served.data).hexdigest()
        form = {
            "url": served.url("cloud.qcow2"),
            "filename": "cloud-https.img",
            "content": "iso",
            "checksum-algorithm": "sha256",
        }
        path = "/nodes/pve1/storage/local/download-url"
        good = pve.data("POST", path, data={**form, "checksum": digest})
        bad = pve.data("POST", path, data={**form, "checksum": "0" * 64})
        assert pve.wait(good)["exitstatus"] == "OK"
        assert (
            pve.wait(bad)["exitstatus"]
            == f"checksum mismatch: got '{digest}' != expect '{'0' * 64}'"
        )
        assert served.requests == ["/cloud.qcow2", "/cloud.qcow2"]
    volids = [i["volid"] for i in pve.data("GET", "/nodes/pve1/storage/local/content")]
    assert "local:iso/cloud-https.img" in volids
