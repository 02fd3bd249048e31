"""The control surface over HTTP (``/_sim/``) and the Python calls behind it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.protocol import SimRequest, SimResponse
from pvesim.simulator import Simulator


def _control(engine: Simulator, name: str, verb: str = "POST", **args: Any) -> SimResponse:
    if verb == "GET":
        return engine.handle(SimRequest("GET", f"/_sim/{name}", query=args))
    return engine.handle(SimRequest("POST", f"/_sim/{name}", json_body=args))


def test_control_calls_need_no_token_and_answer_json(engine: Simulator, api: Api) -> None:
    answer = _control(engine, "node_offline", node="pve3")
    assert (answer.status, json.loads(answer.body or b"")) == (200, {"data": None})
    entry = next(e for e in api.cluster_resources() if e["vmid"] == 102)
    assert entry["status"] == "unknown"


def test_the_ledger_over_http(engine: Simulator, api: Api) -> None:
    api.vm_config("pve1", 100)
    answer = _control(engine, "ledger", verb="GET", key="/nodes/{node}/qemu/{vmid}/config")
    [entry] = json.loads(answer.body or b"")["data"]
    assert entry["path_params"] == {"node": "pve1", "vmid": "100"}
    assert entry["status"] == 200


def test_control_calls_are_not_in_the_ledger(engine: Simulator) -> None:
    _control(engine, "info", verb="GET")
    assert engine.ledger.count() == 0


def test_a_scripted_failure_over_http(engine: Simulator, api: Api) -> None:
    answer = _control(engine, "fail_call", method="GET", path="/version", kind="596", bogus=1)
    assert answer.status == 400  # an unknown argument is refused, not ignored
    answer = _control(engine, "fail_call", method="GET", path="/version", kind="596")
    assert answer.status == 200
    with pytest.raises(ApiError) as caught:
        api.version()
    assert caught.value.status == 596


def test_unknown_calls_and_bad_arguments(engine: Simulator) -> None:
    assert _control(engine, "nonsense").status == 404
    assert _control(engine, "volume_data", node="pve1", volid="x").status == 404
    answer = _control(engine, "set_lock", vmid=424242)
    assert answer.status == 400
    assert json.loads(answer.body or b"") == {"error": "no guest 424242"}


def test_advance_needs_the_manual_clock() -> None:
    engine = Simulator(token_secret="s")
    answer = _control(engine, "advance", seconds=1)
    assert answer.status == 400
    assert b"manual clock" in (answer.body or b"")


def test_advance_moves_the_manual_clock(timed: Any) -> None:
    upid = timed.api.clone("pve1", 9000, newid=101200, name="proxy-c")
    answer = _control(timed.engine, "advance", seconds=1)
    assert answer.status == 200
    assert timed.api.task_status("pve1", upid)["status"] == "stopped"


def test_create_vms_in_bulk(engine: Simulator, api: Api) -> None:
    answer = _control(
        engine,
        "create_vms",
        count=3,
        start_vmid=100000,
        node="pve2",
        description="proxyhub-managed=true\nproxyhub-uid={vmid}",
    )
    assert json.loads(answer.body or b"")["data"] == [100000, 100001, 100002]
    config = api.vm_config("pve2", 100001)
    assert config["name"] == "proxy-bench-100001"
    assert config["description"] == "proxyhub-managed=true\nproxyhub-uid=100001"


def test_reset_returns_to_the_starting_state(engine: Simulator, api: Api) -> None:
    api.clone("pve1", 9000, newid=101201, name="proxy-r")
    engine.control.deny("/", "VM.Audit")
    engine.control.error_rate(1.0, kind="595", path="/version")
    _control(engine, "reset")
    vmids = {e["vmid"] for e in api.cluster_resources()}
    assert vmids == {100, 101, 102, 200, 9000, 9001, 9002}
    assert api.version()["version"]
    assert engine.ledger.count() == 2


def test_info_describes_the_simulator(engine: Simulator) -> None:
    info = json.loads(_control(engine, "info", verb="GET").body or b"")["data"]
    assert info["nodes"] == ["pve1", "pve2", "pve3"]
    assert info["templateVmid"] == engine.default_template_vmid() == 9000
    assert info["tokenId"] == "proxyhub@pve!sim"
    assert "secret" not in json.dumps(info).lower()
