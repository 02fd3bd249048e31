"""Tasks: UPIDs, status, logs and the per-node queue (pve-reference §4)."""

from __future__ import annotations

import re
import threading
from typing import Any
from urllib.parse import quote

from provisioning.proxmox.api import Api
from pvesim.protocol import SimRequest
from pvesim.simtasks import UPID_RE
from pvesim.simulator import Simulator
from tests.pvesim.conftest import Raw
from tests.support.simtransport import SimTransport


def test_upids_follow_proxmoxs_format(api: Api, engine: Simulator) -> None:
    upid = api.start("pve2", 101)
    found = UPID_RE.fullmatch(upid)
    assert found is not None
    assert found["node"] == "pve2" and found["type"] == "qmstart" and found["id"] == "101"
    assert found["user"] == "proxyhub@pve!sim"
    assert re.fullmatch(r"[0-9A-F]{8}", found["pid"]) and re.fullmatch(
        r"[0-9A-F]{8}", found["pstart"]
    )
    started = int(found["starttime"], 16)
    assert abs(started - engine.cluster.wall(engine.now())) <= 1
    assert upid.endswith(":")
    assert api.start("pve2", 101) != upid  # every task has its own pid


def test_task_status_splits_the_token_identity(api: Api) -> None:
    upid = api.stop("pve2", 101)
    status = api.task_status("pve2", upid)
    found = UPID_RE.fullmatch(upid)
    assert found is not None
    assert status == {
        "exitstatus": "OK",
        "id": "101",
        "node": "pve2",
        "pid": int(found["pid"], 16),
        "pstart": int(found["pstart"], 16),
        "starttime": int(found["starttime"], 16),
        "status": "stopped",
        "tokenid": "sim",
        "type": "qmstop",
        "upid": upid,
        "user": "proxyhub@pve",
    }


def test_an_unknown_upid_and_the_wrong_node_are_no_such_task(api: Api, api_error: Any) -> None:
    upid = api.stop("pve2", 101)
    err = api_error(lambda: api.task_status("pve1", upid))
    assert (err.status, err.errors) == (400, {"upid": "no such task"})
    other = upid.replace(":qmstop:", ":qmstart:")
    assert api_error(lambda: api.task_status("pve2", other)).errors == {"upid": "no such task"}


def test_a_garbage_upid_cannot_be_parsed(api: Api, api_error: Any) -> None:
    err = api_error(lambda: api.task_status("pve1", "garbage"))
    assert err.errors == {"upid": "unable to parse worker upid"}


def test_the_log_pages_fifty_lines_by_default_and_reports_the_total(api: Api, raw: Any) -> None:
    upid = api.clone("pve1", 9000, newid=100600, name="proxy-a")
    body = raw.json("GET", f"/api2/json/nodes/pve1/tasks/{upid}/log")
    assert body["total"] == 7 and len(body["data"]) == 7
    page = raw.json(
        "GET", f"/api2/json/nodes/pve1/tasks/{upid}/log", query={"start": "2", "limit": "2"}
    )
    assert page == {
        "data": [
            {"n": 3, "t": "allocated target volume 'vmstore:vm-100600-disk-0'"},
            {"n": 4, "t": "transferred 0.0 B of 3.0 GiB (0.00%)"},
        ],
        "total": 7,
    }


def test_a_task_with_more_than_fifty_lines(engine: Simulator, raw: Any) -> None:
    upid = raw.json("POST", "/api2/json/nodes/pve1/qemu/100/status/stop")["data"]
    task = engine.scheduler.tasks[upid]
    task.log[:0] = [f"line {i}" for i in range(60)]
    body = raw.json("GET", f"/api2/json/nodes/pve1/tasks/{upid}/log")
    assert body["total"] == 61 and len(body["data"]) == 50
    everything = raw.json("GET", f"/api2/json/nodes/pve1/tasks/{upid}/log", query={"limit": "0"})
    assert len(everything["data"]) == 61 and everything["data"][-1] == {"n": 61, "t": "TASK OK"}


def test_a_node_runs_at_most_four_tasks_and_queues_the_rest(timed: Any) -> None:
    api = timed.api
    upids = [api.clone("pve1", 9000, newid=100700 + i, name=f"proxy-q{i}") for i in range(6)]
    states = [api.task_status("pve1", u)["status"] for u in upids]
    assert states == ["running"] * 6
    queued = upids[4]
    assert api.task_log("pve1", queued) == [{"n": 1, "t": "no content"}]
    assert timed.engine.scheduler.running_on("pve1") == 4
    assert timed.engine.scheduler.queued_on("pve1") == 2
    # Another node is not held up by pve1's queue.
    assert api.task_status("pve2", api.stop("pve2", 101))["status"] == "running"
    timed.advance(0.31)  # the first four clones end, the last two begin
    assert [api.task_status("pve1", u)["status"] for u in upids] == ["stopped"] * 4 + [
        "running"
    ] * 2
    assert api.task_log("pve1", queued)[0]["t"].startswith("creating a clone of VM 9000")
    timed.advance(0.31)
    assert all(api.task_status("pve1", u)["exitstatus"] == "OK" for u in upids)


def test_a_queued_clone_still_reserves_its_vmid(timed: Any, api_error: Any) -> None:
    api = timed.api
    for i in range(5):
        api.clone("pve1", 9000, newid=100800 + i, name=f"proxy-r{i}")
    err = api_error(lambda: api.clone("pve1", 9000, newid=100804, name="proxy-late"))
    assert err.message == "unable to create VM 100804: config file already exists"


def test_the_next_task_of_a_type_can_be_made_to_fail(
    engine: Simulator, api: Api, exitstatus: Any
) -> None:
    engine.control.fail_next_task("qmstart", "start failed: QEMU exited with code 1")
    vmid_upid = api.start("pve2", 101)
    assert exitstatus(vmid_upid, "pve2") == "start failed: QEMU exited with code 1"
    assert api.vm_status("pve2", 101)["status"] == "stopped"
    assert exitstatus(api.start("pve2", 101), "pve2") == "OK"


def test_a_failing_task_whose_effect_still_happens(
    engine: Simulator, api: Api, exitstatus: Any
) -> None:
    """``qmstart`` reporting failure although the VM runs (research/peers.md §6)."""
    engine.control.fail_next_task("qmstart", "got timeout", applied=True)
    assert exitstatus(api.start("pve2", 101), "pve2") == "got timeout"
    assert api.vm_status("pve2", 101)["status"] == "running"


def test_stopping_a_running_clone_task_removes_its_target(timed: Any) -> None:
    upid = timed.api.clone("pve1", 9000, newid=100900, name="proxy-x")
    answer = timed.engine.handle(
        SimRequest(
            "DELETE",
            f"/api2/json/nodes/pve1/tasks/{quote(upid, safe='')}",
            headers={"authorization": f"PVEAPIToken={timed.engine.token}"},
        )
    )
    assert answer.status == 200
    status = timed.api.task_status("pve1", upid)
    assert status["exitstatus"] == "clone failed: interrupted by signal"
    assert 100900 not in {e["vmid"] for e in timed.api.cluster_resources()}


def test_the_task_list_of_a_node(api: Api, raw: Any) -> None:
    upid = api.stop("pve2", 101)
    listed = raw.json("GET", "/api2/json/nodes/pve2/tasks")["data"]
    assert [t["upid"] for t in listed] == [upid]
    assert listed[0]["status"] == "OK" and "endtime" in listed[0]


def test_profiles_set_task_durations_and_time_scale_multiplies_them(
    clock: Any, secret: str
) -> None:
    realistic = Simulator(profile="realistic", clock=clock, token_secret=secret)
    halved = Simulator(profile="realistic", time_scale=0.5, clock=clock, token_secret=secret)
    assert (realistic.profile.clone, halved.profile.clone) == (2.0, 1.0)
    assert halved.profile.auth_fail_delay == 1.5
    api = Api(SimTransport(realistic))
    upid = api.clone("pve1", 9000, newid=101300, name="proxy-p")
    clock.advance(1.9)
    assert api.task_status("pve1", upid)["status"] == "running"
    clock.advance(0.2)
    assert api.task_status("pve1", upid)["exitstatus"] == "OK"


def test_concurrent_requests_from_many_threads(engine: Simulator, api: Api, finished: Any) -> None:
    errors: list[BaseException] = []

    def clone(i: int) -> None:
        try:
            finished(api.clone("pve1", 9000, newid=101400 + i, name=f"proxy-t{i}"))
            api.cluster_resources()
        except BaseException as exc:  # collected and re-raised by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=clone, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    created = {e["vmid"] for e in api.cluster_resources() if e["vmid"] >= 101400}
    assert created == {101400 + i for i in range(16)}
    volumes = [
        i["volid"] for i in api.storage_content("pve1", "vmstore") if i.get("vmid", 0) >= 101400
    ]
    assert len(volumes) == len(set(volumes)) == 16


def test_the_task_list_filters_as_proxmox_does(timed: Any) -> None:
    """``GET /nodes/{node}/tasks``'s filters (pve-reference §4.4, read from pve-manager
    ``PVE/API2/Tasks.pm``): ``typefilter`` is the exact type; ``since``/``until`` bound the
    task's start time; ``statusfilter`` takes the normalised status (``ok``, ``warning``,
    ``error``, ``unknown``; a task still running has none yet, so it is ``unknown``) and
    ``errors`` drops only ``ok``; ``userfilter`` matches part of the user, any case."""
    api, engine = timed.api, timed.engine
    raw = Raw(engine)

    def listed(**query: str) -> list[str]:
        body = raw.json("GET", "/api2/json/nodes/pve2/tasks", query={"source": "all", **query})
        return [t["upid"] for t in body["data"]]

    stopped = api.stop("pve2", 101)
    timed.wait(stopped, "pve2")
    timed.advance(2.0)  # starttime has a resolution of one second
    engine.control.fail_next_task("qmstart", "start failed: QEMU exited with code 1")
    failed = api.start("pve2", 101)
    timed.wait(failed, "pve2")
    timed.advance(2.0)
    running = api.start("pve2", 101)
    assert api.task_status("pve2", running)["status"] == "running"
    starts = {u: int(u.split(":")[4], 16) for u in (stopped, failed, running)}

    assert set(listed()) == {stopped, failed, running}
    assert listed(typefilter="qmst") == []  # not a part of the type: the type
    assert set(listed(typefilter="qmstart")) == {failed, running}
    assert set(listed(since=str(starts[failed]))) == {failed, running}
    assert set(listed(until=str(starts[failed]))) == {stopped, failed}
    assert listed(statusfilter="ok") == [stopped]
    assert listed(statusfilter="error") == [failed]
    assert listed(statusfilter="unknown") == [running]
    assert set(listed(statusfilter="ok,error")) == {stopped, failed}
    assert set(listed(errors="1")) == {failed, running}
    assert set(listed(userfilter="PROXYHUB")) == {stopped, failed, running}
    assert listed(userfilter="someone-else") == []
    # The envelope's total counts what the filters kept, before the page.
    body = raw.json(
        "GET", "/api2/json/nodes/pve2/tasks", query={"source": "all", "since": str(starts[failed])}
    )
    assert body["total"] == 2
