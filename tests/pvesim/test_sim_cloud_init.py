"""``agent/file-read`` and cloud-init's result file (schema all-endpoints.json; seed 003's
readiness, issue 14): the agent's checks first, then the file, written after the address and
the profile's cloud-init time, or as ``/_sim/set_cloud_init`` scripted it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.agent import CLOUD_INIT_RESULT
from pvesim.protocol import SimRequest
from pvesim.simulator import Simulator

MISSING = (
    f"Agent error: failed to open file '{CLOUD_INIT_RESULT}' (mode: 'r'): No such file or directory"
)


def _read_error(api: Api, vmid: int, path: str = CLOUD_INIT_RESULT, node: str = "pve1") -> ApiError:
    with pytest.raises(ApiError) as caught:
        api.agent_file_read(node, vmid, path)
    assert caught.value.status == 500
    return caught.value


def _booted_clone(timed: Any, vmid: int, template: int = 9000) -> None:
    api = timed.api
    timed.wait(api.clone("pve1", template, newid=vmid, name=f"proxy-c{vmid}"))
    assert timed.wait(api.start("pve1", vmid))["exitstatus"] == "OK"


def test_the_agents_checks_come_before_the_file(engine: Simulator, api: Api) -> None:
    assert _read_error(api, 101, node="pve2").message == "VM 101 is not running"
    engine.control.remove_agent(100)
    assert _read_error(api, 100).message == "No QEMU guest agent configured"


def test_the_result_appears_after_the_address_and_the_cloud_init_time(timed: Any) -> None:
    # fast profile: the address at 0.6 s after boot, cloud-init's final stage 0.3 s later.
    _booted_clone(timed, 101100)
    timed.advance(0.7)
    assert _read_error(timed.api, 101100).message == MISSING
    timed.advance(0.3)
    answer = timed.api.agent_file_read("pve1", 101100, CLOUD_INIT_RESULT)
    assert "truncated" not in answer
    assert json.loads(answer["content"])["v1"]["errors"] == []


def test_no_other_file_exists(timed: Any) -> None:
    _booted_clone(timed, 101101)
    timed.advance(60)
    message = _read_error(timed.api, 101101, "/etc/shadow").message
    assert message.endswith("No such file or directory") and "/etc/shadow" in message


def test_a_scripted_outcome_is_inherited_by_clones(timed: Any) -> None:
    timed.engine.control.set_cloud_init(9000, outcome="errors", after=5)
    _booted_clone(timed, 101102)
    timed.advance(0.6 + 4.9)
    assert _read_error(timed.api, 101102).message == MISSING
    timed.advance(0.2)
    errors = json.loads(timed.api.agent_file_read("pve1", 101102, CLOUD_INIT_RESULT)["content"])
    assert errors["v1"]["errors"] and "scripts_user" in errors["v1"]["errors"][0]
    timed.engine.control.set_cloud_init(101102, outcome="never")
    assert _read_error(timed.api, 101102).message == MISSING


def test_offset_count_and_decode_follow_the_schema(api: Api, raw: Any) -> None:
    whole = api.agent_file_read("pve1", 100, CLOUD_INIT_RESULT)["content"]
    query = {"file": CLOUD_INIT_RESULT, "offset": "2", "count": "5", "decode": "0"}
    data = raw.json("GET", "/api2/json/nodes/pve1/qemu/100/agent/file-read", query=query)["data"]
    assert data["truncated"] == 1
    assert base64.b64decode(data["content"]).decode() == whole[2:7]


def test_set_cloud_init_over_http_and_its_refusals(engine: Simulator) -> None:
    def post(**args: Any) -> Any:
        answer = engine.handle(SimRequest("POST", "/_sim/set_cloud_init", json_body=args))
        return answer.status, json.loads(answer.body or b"")

    assert post(vmid=100, outcome="never") == (200, {"data": None})
    assert post(vmid=100, outcome="maybe")[0] == 400
    assert post(vmid=100, outcome="done", after=-1)[0] == 400
    assert post(vmid=100, outcome="errors", errors=[1])[0] == 400
    assert post(vmid=100999, outcome="done")[0] == 400
