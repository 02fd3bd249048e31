"""Tasks and UPIDs (pve-reference §4): parsing, one status read, the bounded wait, the log tail.

Task states are driven on the in-process simulator with a manual clock (tasks end when the test
moves time); Proxmox's captured answers (``tests/fixtures/pve/task_*.json``) are also served over
the real HTTP client with ``responses``, so the decoding is checked against the real thing.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses

from provisioning.proxmox.api import Api
from provisioning.proxmox.deadline import Cancelled, Deadline
from provisioning.proxmox.errors import TaskFailed, TransientError, classify
from provisioning.proxmox.http import http_api
from provisioning.proxmox.tasks import parse_upid, read_task, task_log_tail, wait_task
from pvesim.clock import ManualClock
from pvesim.simulator import Simulator
from tests.support.simtransport import sim_api

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pve"
BASE = "https://pve.test:8006/api2/json"
CLONE_UPID = "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc-provision@pve!django:"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


STARTED = fixture("task_start_responses.json")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    token = tmp_path / "token"
    token.write_text("svc-provision@pve!django=7c1e4d2a-0000-4000-8000-000000000001\n")
    api = http_api("https://pve.test:8006", str(token))
    yield api
    api.transport.close()  # type: ignore[attr-defined]


def status_url(upid: str) -> re.Pattern[str]:
    node = upid.split(":")[1]
    return re.compile(re.escape(f"{BASE}/nodes/{node}/tasks/") + r"[^/]+/status$")


# --- parse_upid -----------------------------------------------------------------------------


@pytest.mark.parametrize("request_line", sorted(STARTED))
def test_every_captured_upid_parses(request_line: str) -> None:
    text = STARTED[request_line]["data"]
    upid = parse_upid(text)
    assert str(upid) == text
    assert upid.node == request_line.split("/")[2]
    assert upid.user == "svc-provision@pve!django"


def test_upid_fields_match_what_task_status_reports() -> None:
    status = fixture("task_status_running.json")["data"]
    upid = parse_upid(status["upid"])
    assert (upid.node, upid.pid, upid.pstart, upid.starttime) == (
        status["node"],
        status["pid"],
        status["pstart"],
        status["starttime"],
    )
    assert (upid.type, upid.id) == (status["type"], status["id"])
    # Proxmox splits a token identity into user and tokenid in the status answer.
    assert upid.user == f"{status['user']}!{status['tokenid']}"


def test_clone_upid_carries_the_source_vmid() -> None:
    upid = parse_upid(STARTED["POST /nodes/pve1/qemu/9000/clone"]["data"])
    assert (upid.type, upid.id) == ("qmclone", "9000")


def test_upload_upid_has_an_empty_id() -> None:
    upid = parse_upid(STARTED["POST /nodes/pve1/storage/local/upload"]["data"])
    assert (upid.type, upid.id) == ("imgcopy", "")


def test_lower_case_hex_and_a_nine_digit_pstart_parse() -> None:
    upid = parse_upid("UPID:pv1-1:001f3a2c:10a1b2c3d:6968baa0:qmstart:123:root@pam:")
    assert upid.node == "pv1-1"
    assert upid.pstart == 0x10A1B2C3D
    assert upid.user == "root@pam"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc@pve!django",  # no trailing colon
        "UPID:pve1:1F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc@pve:",  # pid not 8 digits
        "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000::",  # no user
        "UPID:pve_1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:root@pam:",  # bad node name
        "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qm clone:9000:root@pam:",  # space in the type
        "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:imgdel:a/b:root@pam:",  # slash in the id
        "UPID:pve1:001F3A2G:0A1B2C3D:6968BAA0:qmclone:9000:root@pam:",  # not hex
        "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:root@pam:extra:",
    ],
)
def test_malformed_upids_are_refused_clearly(text: str) -> None:
    with pytest.raises(ValueError, match="not a Proxmox UPID"):
        parse_upid(text)


# --- read_task on the simulator -------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sim(clock: ManualClock) -> tuple[Api, Simulator]:
    return sim_api(profile="fast", clock=clock)


def test_a_submitted_clone_reads_running_then_ok(sim: tuple[Api, Simulator]) -> None:
    api, engine = sim
    upid = api.clone("pve1", 9000, newid=100042, name="proxy-a")
    assert parse_upid(upid).type == "qmclone"
    running = read_task(api, upid)
    assert (running.state, running.exitstatus, running.finished) == ("running", "", False)
    engine.control.advance(5)
    done = read_task(api, upid)
    assert (done.state, done.exitstatus, done.succeeded) == ("ok", "OK", True)
    # One status read per call, and nothing was submitted again.
    assert len(engine.control.ledger(key="POST /nodes/{node}/qemu/{vmid}/clone")) == 1


def test_a_failed_task_reads_failed_with_proxmox_text(sim: tuple[Api, Simulator]) -> None:
    api, engine = sim
    engine.control.fail_next_task("qmclone", "lvcreate 'pve/vm-100042-disk-0' error")
    upid = api.clone("pve1", 9000, newid=100042, name="proxy-a")
    engine.control.advance(5)
    outcome = read_task(api, upid)
    assert outcome.state == "failed"
    assert outcome.exitstatus == "clone failed: lvcreate 'pve/vm-100042-disk-0' error"
    assert not outcome.succeeded


def test_a_task_with_warnings_is_a_success(
    sim: tuple[Api, Simulator], caplog: pytest.LogCaptureFixture
) -> None:
    api, engine = sim
    engine.control.pause_vm(100)  # a forced shutdown of a paused VM stops it with a warning
    upid = api.shutdown("pve1", 100, force_stop=True)
    engine.control.advance(5)
    with caplog.at_level(logging.INFO, logger="proxyhub.proxmox.tasks"):
        outcome = read_task(api, upid)
    assert (outcome.state, outcome.succeeded) == ("warnings", True)
    assert re.fullmatch(r"WARNINGS: [1-9][0-9]*", outcome.exitstatus)
    assert any(r.getMessage() == "proxmox task finished with warnings" for r in caplog.records)


def test_wait_task_on_the_simulator_returns_when_the_task_ends(sim: tuple[Api, Simulator]) -> None:
    api, engine = sim
    upid = api.clone("pve1", 9000, newid=100043, name="proxy-b")
    # Time moves on Proxmox while the wait polls.
    threading.Timer(0.05, engine.control.advance, args=(5,)).start()
    assert wait_task(api, upid, budget=5.0, poll_interval=0.01).state == "ok"
    polls = engine.control.ledger(key="GET /nodes/{node}/tasks/{upid}/status")
    assert len(polls) >= 2


# --- read_task on Proxmox's captured answers ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "state", "exitstatus"),
    [
        ("task_status_running.json", "running", ""),
        ("task_status_stopped_ok.json", "ok", "OK"),
        ("task_status_stopped_warnings.json", "warnings", "WARNINGS: 1"),
        ("task_status_stopped_error_locked.json", "failed", "VM is locked (backup)"),
        ("task_status_stopped_error_shrink.json", "failed", "shrinking disks is not supported"),
    ],
)
@responses.activate
def test_read_task_reports_the_state_proxmox_gives(
    api: Api, name: str, state: str, exitstatus: str
) -> None:
    body = fixture(name)
    upid = body["data"]["upid"]
    responses.get(status_url(upid), json=body)
    outcome = read_task(api, upid)
    assert (outcome.state, outcome.exitstatus, outcome.upid) == (state, exitstatus, upid)
    assert outcome.succeeded == (state in ("ok", "warnings"))
    assert outcome.finished == (state != "running")


@responses.activate
def test_read_task_asks_the_node_named_in_the_upid(api: Api) -> None:
    upid = STARTED["POST /nodes/pve2/lxc/201/status/start"]["data"]
    responses.get(status_url(upid), json={"data": {"status": "stopped", "exitstatus": "OK"}})
    assert read_task(api, upid).state == "ok"
    assert "/nodes/pve2/tasks/UPID%3Apve2%3A" in str(responses.calls[0].request.url)


@responses.activate
def test_warnings_are_success_and_logged(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    body = fixture("task_status_stopped_warnings.json")
    responses.get(status_url(body["data"]["upid"]), json=body)
    with caplog.at_level(logging.INFO, logger="proxyhub.proxmox"):
        outcome = wait_task(api, body["data"]["upid"], budget=1.0)
    assert outcome.state == "warnings"
    lines = [r for r in caplog.records if r.getMessage() == "proxmox task finished with warnings"]
    assert len(lines) == 1
    assert lines[0].exitstatus == "WARNINGS: 1"  # type: ignore[attr-defined]
    assert lines[0].upid == body["data"]["upid"]  # type: ignore[attr-defined]


# --- wait_task ------------------------------------------------------------------------------


@responses.activate
def test_wait_task_polls_until_the_task_ends(api: Api) -> None:
    running = fixture("task_status_running.json")
    done = fixture("task_status_stopped_ok.json")
    url = status_url(CLONE_UPID)
    responses.get(url, json=running)
    responses.get(url, json=running)
    responses.get(url, json=done)
    outcome = wait_task(api, CLONE_UPID, budget=5.0, poll_interval=0.01)
    assert outcome.state == "ok"
    assert len(responses.calls) == 3


@responses.activate
def test_wait_task_raises_task_failed_with_proxmox_text(api: Api) -> None:
    body = fixture("task_status_stopped_error_clone_failed.json")
    responses.get(status_url(CLONE_UPID), json=body)
    with pytest.raises(TaskFailed) as raised:
        wait_task(api, CLONE_UPID, budget=1.0)
    assert raised.value.exitstatus == body["data"]["exitstatus"]
    assert "insufficient free space" in str(classify("create", raised.value))


@responses.activate
def test_wait_task_budget_exhausted_is_transient_and_names_the_upid(api: Api) -> None:
    responses.get(status_url(CLONE_UPID), json=fixture("task_status_running.json"))
    started = time.monotonic()
    with pytest.raises(TransientError) as raised:
        wait_task(api, CLONE_UPID, budget=0.05, poll_interval=0.01, op="create")
    assert time.monotonic() - started < 2.0
    assert CLONE_UPID in str(raised.value)
    assert raised.value.op == "create"
    # It did poll, and it did not submit anything. How many polls fit in the budget depends
    # on the machine: under load one read took 1.4 s (a CI run), longer than the whole budget.
    assert responses.calls
    assert all(
        c.request.method == "GET" and status_url(CLONE_UPID).match(str(c.request.url))
        for c in responses.calls
    )


@responses.activate
def test_wait_task_returns_at_once_when_cancelled(api: Api) -> None:
    responses.get(status_url(CLONE_UPID), json=fixture("task_status_running.json"))
    deadline = Deadline(30)
    threading.Timer(0.1, deadline.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        wait_task(api, CLONE_UPID, budget=30.0, poll_interval=10.0, deadline=deadline)
    assert time.monotonic() - started < 2.0


# --- task_log_tail --------------------------------------------------------------------------


@responses.activate
def test_task_log_tail_returns_the_last_lines(api: Api) -> None:
    body = fixture("task_log_clone_ok.json")
    responses.get(re.compile(re.escape(f"{BASE}/nodes/pve1/tasks/") + r"[^/]+/log\?.*"), json=body)
    tail = task_log_tail(api, CLONE_UPID, lines=2)
    assert tail == ["transferred 8.0 GiB of 8.0 GiB (100.00%)", "TASK OK"]
    # The whole log was asked for: the seam gets no line count to page from the end.
    assert "limit=0" in str(responses.calls[0].request.url)


@responses.activate
def test_task_log_tail_of_a_failed_start(api: Api) -> None:
    body = fixture("task_log_start_error.json")
    responses.get(re.compile(re.escape(f"{BASE}/nodes/pve1/tasks/") + r"[^/]+/log\?.*"), json=body)
    upid = STARTED["POST /nodes/pve1/qemu/123/status/start"]["data"]
    assert task_log_tail(api, upid) == ["TASK ERROR: VM is locked (backup)"]
