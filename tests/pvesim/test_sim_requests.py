"""The request pipeline: authentication, routing, bodies, permissions, forwarding, validation,
and the JSON envelope (pve-reference §1-§2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.protocol import SimRequest
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport


def test_no_token_is_401_no_ticket_with_an_empty_body(raw: Any) -> None:
    answer = raw("GET", "/api2/json/version", token=None)
    assert (answer.status, answer.reason, answer.body) == (401, "No ticket", None)


def test_a_wrong_secret_is_401_authentication_failed(
    engine: Simulator, api: Api, api_error: Any, secret: Any
) -> None:
    api = Api(SimTransport(engine, token="proxyhub@pve!sim=not-the-secret"))
    err = api_error(api.version)
    assert (err.status, err.message) == (401, "Authentication failed!")
    assert "not-the-secret" not in str(err)


def test_a_wrong_token_id_is_refused_even_with_the_right_secret(
    engine: Simulator, api_error: Any, secret: str
) -> None:
    api = Api(SimTransport(engine, token=f"root@pam!sim={secret}"))
    assert api_error(api.version).status == 401


def test_the_realistic_profile_holds_every_401_for_three_seconds(secret: str) -> None:
    engine = Simulator(profile="realistic", token_secret=secret)
    answer = engine.handle(
        SimRequest("GET", "/api2/json/version", headers={"authorization": "PVEAPIToken=a@pve!b=c"})
    )
    assert answer.status == 401
    assert answer.delay == pytest.approx(3.0)


def test_a_rotated_token_is_used_by_default_transports(
    engine: Simulator, api: Api, api_error: Any, secret: str
) -> None:
    new = engine.set_token_secret("9d1e3f5a-0000-4000-8000-000000000001")
    assert new.endswith("=9d1e3f5a-0000-4000-8000-000000000001")
    assert api.version()["version"]
    stale = Api(SimTransport(engine, token=f"proxyhub@pve!sim={secret}"))
    assert api_error(stale.version).status == 401


def test_an_unknown_path_is_501_not_implemented(raw: Any) -> None:
    answer = raw("GET", "/api2/json/nodes/pve1/qemu/100/foo")
    assert answer.status == 501
    assert answer.reason == "Method 'GET /nodes/pve1/qemu/100/foo' not implemented"
    assert json.loads(answer.body or b"") == {
        "data": None,
        "message": "Method 'GET /nodes/pve1/qemu/100/foo' not implemented",
    }


def test_a_delete_with_a_body_is_501_in_plain_text(raw: Any) -> None:
    answer = raw("DELETE", "/api2/json/nodes/pve1/qemu/100", body_length=7)
    assert (answer.status, answer.reason) == (501, "Unexpected content for method 'DELETE'")
    assert answer.body == b"Unexpected content for method 'DELETE'"
    assert answer.content_type.startswith("text/plain")


def test_parameter_errors_are_400_with_proxmoxs_texts(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.clone("pve1", 9000, newid=50, name="proxy-x"))
    assert err.status == 400
    assert err.message == "Parameter verification failed."
    assert err.errors == {"newid": "invalid format - value does not look like a valid VM ID"}
    err = api_error(lambda: api.clone("pve1", 9000, newid=100500, name="proxy_x"))
    assert err.errors == {"name": "invalid format - value does not look like a valid DNS name"}


def test_a_path_parameter_repeated_with_another_value_in_the_body_is_400(raw: Any) -> None:
    answer = raw("PUT", "/api2/json/nodes/pve1/qemu/100/config", form={"vmid": "101", "name": "x"})
    body = json.loads(answer.body or b"")
    assert answer.status == 400
    assert body["errors"] == {
        "vmid": "duplicate parameter (already defined in URI) with conflicting values!"
    }


def test_json_bodies_may_carry_real_booleans(raw: Any) -> None:
    answer = raw("PUT", "/api2/json/nodes/pve2/qemu/101/config", json_body={"protection": True})
    assert answer.status == 200
    config = raw.json("GET", "/api2/json/nodes/pve2/qemu/101/config")["data"]
    assert config["protection"] == 1


def test_an_unknown_node_fails_its_hostname_lookup(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.node_status("pve9"))
    assert err.status == 500
    assert err.message == (
        "hostname lookup 'pve9' failed - failed to get address info for: pve9: "
        "Name or service not known"
    )


def test_an_offline_node_answers_595_with_an_empty_body(engine: Simulator, raw: Any) -> None:
    engine.control.node_offline("pve3")
    answer = raw("GET", "/api2/json/nodes/pve3/qemu/102/status/current")
    assert (answer.status, answer.reason, answer.body) == (595, "No route to host", None)
    engine.control.node_online("pve3")
    assert raw("GET", "/api2/json/nodes/pve3/qemu/102/status/current").status == 200


def test_a_denied_privilege_is_403_naming_path_and_privilege(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.control.deny("/vms", "VM.PowerMgmt")
    err = api_error(lambda: api.start("pve1", 100))
    assert (err.status, err.message) == (403, "Permission check failed (/vms/100, VM.PowerMgmt)")
    engine.control.allow()
    assert api.start("pve1", 100).startswith("UPID:pve1:")


def test_a_denied_any_of_check_lists_every_alternative(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    for priv in ("Disk", "CDROM", "CPU", "Memory", "Network", "HWType", "Options", "Cloudinit"):
        engine.control.deny("/vms/101", f"VM.Config.{priv}")
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"name": "x"}))
    assert err.message == (
        "Permission check failed (/vms/101, VM.Config.Disk|VM.Config.CDROM|VM.Config.CPU|"
        "VM.Config.Memory|VM.Config.Network|VM.Config.HWType|VM.Config.Options|"
        "VM.Config.Cloudinit)"
    )


def test_a_failed_or_combination_says_only_permission_check_failed(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.control.deny("/vms/100777", "VM.Allocate")
    err = api_error(lambda: api.clone("pve1", 9000, newid=100777, name="proxy-x"))
    assert (err.status, err.message) == (403, "Permission check failed")


def test_a_key_level_privilege_is_checked_by_the_handler(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.control.deny("/", "VM.Config.CPU")
    err = api_error(lambda: api.set_vm_config("pve2", 101, {"cores": 2}))
    assert err.message == "Permission check failed (/vms/101, VM.Config.CPU)"
    api.set_vm_config("pve2", 101, {"name": "renamed"})


def test_volume_delete_needs_datastore_allocate(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.control.deny("/storage/proxy-seeds", "Datastore.Allocate")
    err = api_error(lambda: api.delete_volume("pve1", "proxy-seeds", "proxy-seeds:iso/x.iso"))
    assert err.message == "Permission check failed (/storage/proxy-seeds, Datastore.Allocate)"


def test_denied_guests_are_filtered_from_the_listing(engine: Simulator, api: Api) -> None:
    engine.control.deny("/vms/101", "VM.Audit")
    assert 101 not in {e["vmid"] for e in api.cluster_resources()}


def test_config_values_keep_proxmoxs_json_types(raw: Any) -> None:
    config = raw.json("GET", "/api2/json/nodes/pve1/qemu/9000/config")["data"]
    assert config["cores"] == 1 and config["template"] == 1 and config["numa"] == 0
    assert config["memory"] == "1024"
    assert config["agent"] == "1"
    assert len(config["digest"]) == 40


def test_every_error_body_ends_its_message_with_a_newline(raw: Any) -> None:
    body = raw.json("GET", "/api2/json/nodes/pve1/qemu/999/config")
    assert body == {
        "data": None,
        "message": "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n",
    }


def test_the_transport_strips_the_newline_and_keeps_the_status(api: Api) -> None:
    with pytest.raises(ApiError) as caught:
        api.vm_config("pve1", 999)
    assert caught.value.status == 500
    assert (
        caught.value.message
        == "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist"
    )
