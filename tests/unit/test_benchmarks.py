"""The benchmarks' own arithmetic and tools, checked fast (the benchmarks themselves take minutes
and run with ``make bench``, never in the test suite; STYLE.md: timing belongs in benchmarks/).

What a benchmark reports is only as good as what it computes and injects: the floor, the fault
storm's rates, the results file it merges into, and the black hole standing in for a dead
cluster. Each is checked here without starting a stack.
"""

from __future__ import annotations

import json
import math
import random
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trustme

from benchmarks import ab, faults, isolation, speed, spy  # noqa: F401  (importable without a stack)
from benchmarks.blackhole import BlackHole
from benchmarks.floor import create_floor, create_stages, fleet_floor
from benchmarks.observe import (
    JournalWatch,
    backoff_summary,
    deliveries_by_calls,
    deliveries_from_log,
    log_counts,
    worker_log,
)
from benchmarks.record import Figure, record_latest, record_suite, variant
from benchmarks.stats import (
    BEFORE_FIRST_STEP,
    end_noticed,
    inflight,
    lanes_used,
    matched_difference,
    max_overlap,
    median,
    over_floor_by_stage,
    percentile,
    spread,
)
from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import RequestTimeout, classify
from provisioning.proxmox.http import HttpTransport
from pvesim.engine import Engine
from pvesim.faults import Faults
from pvesim.profiles import get_profile
from pvesim.protocol import SimRequest
from pvesim.simulator import Simulator


def test_the_floor_of_twenty_proxies_is_the_template_nodes_work() -> None:
    # README: 7/7/6 with the template on pve1 -> W_T = 20 * 0.3 + 7 * 0.3 = 8.1 s.
    floor = fleet_floor({"pve1": 7, "pve2": 7, "pve3": 6}, template_node="pve1")
    assert floor.seconds == pytest.approx(8.1 / 4 + 0.6)
    assert floor.critical_path == pytest.approx(1.2)
    assert floor.seconds == floor.template_node_bound


def test_the_storm_fails_exactly_the_share_it_documents_on_every_method() -> None:
    rules = faults.storm_rules()
    for method in ("GET", "POST", "PUT", "DELETE"):
        mine = [r for r in rules if r["method"] == method]
        assert all(r["path"] is None for r in mine), "every endpoint meets the storm"
        mix = faults.READ_MIX if method == "GET" else faults.MUTATION_MIX
        # The simulator stops at the first rule that fires, so rule i fails a call with
        # probability rate_i * prod(1 - rate_j, j < i): that must be its documented share.
        passed = 1.0
        for rule, (kind, share, applied) in zip(mine, mix, strict=True):
            assert (rule["kind"], rule["applied"]) == (kind, applied)
            assert passed * rule["rate"] == pytest.approx(share)
            passed *= 1 - rule["rate"]
        assert 1 - passed == pytest.approx(faults.FAULT_RATE)
    assert not any(r["kind"] == "stall" for r in rules), "a stall measures timeouts, not faults"


def test_the_simulator_takes_the_storm_and_fails_a_fifth_of_the_calls() -> None:
    engine_faults = Faults(random.Random(7))
    for rule in faults.storm_rules():
        engine_faults.add(**rule)
    calls = 20000
    for method, key in (
        ("GET", "GET /cluster/resources"),
        ("POST", "POST /nodes/{node}/qemu/{vmid}/clone"),
    ):
        hits = sum(1 for _ in range(calls) if engine_faults.pick(method, key) is not None)
        # Binomial(20000, 0.2): four standard deviations are 0.011.
        assert math.isclose(hits / calls, faults.FAULT_RATE, abs_tol=0.012)


def test_latest_keeps_other_benchmarks_figures_and_replaces_its_own(tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    record_latest({"fleet_ratio_20": Figure(2.7, 3.0, "x floor")}, commit="a", path=latest)
    record_latest(
        {"fault_create_ratio": Figure(1.4, 2.0, "x", {"proxies": 30})},
        measured_at="2026-12-01T00:00:00+00:00",
        commit="b",
        path=latest,
    )
    record_latest({"fleet_ratio_20": Figure(2.6, 3.0, "x floor")}, commit="c", path=latest)
    document = json.loads(latest.read_text())
    assert set(document) == {"fleet_ratio_20", "fault_create_ratio"}
    assert document["fault_create_ratio"] == {
        "value": 1.4,
        "target": 2.0,
        "unit": "x",
        "measured_at": "2026-12-01T00:00:00+00:00",
        "commit": "b",
        "details": {"proxies": 30},
    }
    assert (document["fleet_ratio_20"]["value"], document["fleet_ratio_20"]["commit"]) == (
        2.6,
        "c",
    )


def test_a_run_off_the_defaults_records_under_its_own_name() -> None:
    assert variant(concurrency=(1, 1), poll=(1.0, 1.0)) == ""
    assert variant(concurrency=(4, 1), poll=(0.2, 1.0)) == "_concurrency4_poll0.2"


def test_the_black_hole_completes_tls_and_holds_a_request_until_its_timeout(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_file, token = (tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem", "token"))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    token.write_text("bench@pve!hole=00000000-0000-0000-0000-000000000000\n")
    with BlackHole(cert_file=cert, key_file=key) as hole:
        transport = HttpTransport(hole.url, str(token), ca_file=str(ca_file), request_timeout=0.5)
        started = time.monotonic()
        with pytest.raises(RequestTimeout) as caught:
            Api(transport).version()
        waited = time.monotonic() - started
        transport.close()
        error = classify("version", caught.value)
        assert (error.kind, error.unreachable) == ("transient", True)
        assert waited >= 0.5
        connections = hole.snapshot()
    assert len(connections) == 1
    assert connections[0].handshake and connections[0].received > 0


def test_the_plain_black_hole_accepts_and_never_answers() -> None:
    with BlackHole() as hole, socket.create_connection((hole.host, hole.port), timeout=2) as sock:
        sock.sendall(b"GET /api2/json/version HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(1)
    assert hole.url.startswith("http://")


def test_the_journal_watch_counts_each_delivery_once_and_reads_its_backoff() -> None:
    watch = JournalWatch("postgres://unused", ["storm-"])
    at = datetime(2026, 12, 1, tzinfo=UTC)

    def row(token: str, state: str, attempts: int, delay: float, error: str = "") -> tuple:
        due = at + timedelta(seconds=delay)
        return ("op1", "storm-01", "create", state, attempts, attempts, token, at, due, error, "c")

    watch._operations([row("t1", "running", 0, 0.0)], 1.0)
    watch._operations([row("t1", "running", 0, 0.0)], 1.25)  # the same delivery, seen again
    watch._operations([row("t2", "running", 1, 0.8, "500 got timeout")], 1.5)
    watch._operations([row("t3", "running", 2, 1.6, "deferred: cluster c is unreachable")], 2.0)
    watch._operations([row("t4", "succeeded", 0, 0.0)], 3.0)
    assert [d.outcome for d in watch.deliveries] == ["step", "backoff", "deferred", "finished"]
    assert watch.max_attempts == {"op1": 2}
    summary = backoff_summary(watch.deliveries)
    assert (summary["failedDeliveries"], summary["backoffSecondsTotal"]) == (1, 0.8)


def test_the_worker_log_gives_each_delivery_its_operation_cluster_and_run_time(
    tmp_path: Path,
) -> None:
    step = {"task_name": "proxyhub.provisioning.step"}
    lines = [
        # A delivery of the dead cluster's operation: one call that got no answer.
        {
            "ts": "2026-12-01T23:27:33.626+00:00",
            "task_id": "t1",
            **step,
            "message": "proxmox api call failed",
            "cluster": "blackhole",
            "duration": 30.0,
        },
        {
            "ts": "2026-12-01T23:27:33.647+00:00",
            "task_id": "t1",
            **step,
            "message": "Task proxyhub.provisioning.step[t1] succeeded in 30.04s: None",
            "data": {"kwargs": "{'operation_id': 'aa-1', 'token': 'x'}"},
        },
        # A delivery of a good operation that met a fault, read again and ran a step again.
        {
            "ts": "2026-12-01T23:27:34.000+00:00",
            "task_id": "t2",
            **step,
            "message": "proxmox api read retried",
            "pause": 0.15,
        },
        {
            "ts": "2026-12-01T23:27:34.100+00:00",
            "task_id": "t2",
            **step,
            "message": "step retried in place",
        },
        {
            "ts": "2026-12-01T23:27:34.300+00:00",
            "task_id": "t2",
            **step,
            "message": "step retried in place",
        },
        {
            "ts": "2026-12-01T23:27:34.400+00:00",
            "task_id": "t2",
            **step,
            "message": "proxmox api call",
            "cluster": "pvesim",
        },
        {
            "ts": "2026-12-01T23:27:34.500+00:00",
            "task_id": "t2",
            **step,
            "message": "Task proxyhub.provisioning.step[t2] succeeded in 0.5s: None",
            "data": {"kwargs": "{'operation_id': 'bb-2', 'token': 'y'}"},
        },
    ]
    path = tmp_path / "worker.log"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    parsed = worker_log(path)
    tasks = deliveries_from_log(parsed)
    assert {k: (v["operation"], v["runtime"], dict(v["clusters"])) for k, v in tasks.items()} == {
        "t1": ("aa-1", 30.04, {"blackhole": 1}),
        "t2": ("bb-2", 0.5, {"pvesim": 1}),
    }
    counts = log_counts(parsed, parsed[0]["t"], parsed[-1]["t"])
    assert counts["deliveries"] == 2 and counts["deliverySeconds"] == pytest.approx(30.54)
    assert (counts["readsRetried"], counts["stepsRetriedInPlace"]) == (1, 2)
    # Two runs again in one delivery: pauses of 0.1 and 0.2 s expected.
    assert counts["inPlacePauseSecondsExpected"] == pytest.approx(0.3)


def test_a_makespans_worker_counts_only_the_deliveries_that_ended_in_its_span() -> None:
    def delivery(t: float, task: str, runtime: float) -> dict[str, Any]:
        return {
            "t": t,
            "task_id": task,
            "task_name": "proxyhub.provisioning.step",
            "message": f"Task proxyhub.provisioning.step[{task}] succeeded in {runtime}s: None",
        }

    lines = [
        delivery(99.0, "before", 0.5),  # ended before the first request: not this run's
        delivery(100.2, "a", 0.02),
        delivery(100.5, "b", 0.03),
        delivery(101.0, "c", 0.025),
        delivery(103.0, "after", 0.5),  # the seed's release after the last address
    ]
    load = log_counts(lines, 100.0, 102.0)
    assert load["deliveries"] == 3
    assert load["msPerDelivery"] == 25.0
    assert load["busyShare"] == pytest.approx(0.075 / 2.0, abs=0.001)
    assert log_counts([], 100.0, 102.0)["msPerDelivery"] is None


def test_a_makespans_deliveries_are_grouped_by_the_proxmox_calls_they_made() -> None:
    def line(t: float, task: str, message: str, **extra: Any) -> dict[str, Any]:
        return {
            "t": t,
            "task_id": task,
            "task_name": "proxyhub.provisioning.step",
            "message": message,
            **extra,
        }

    def call(t: float, task: str, name: str, *, failed: bool = False) -> dict[str, Any]:
        message = "proxmox api call failed" if failed else "proxmox api call"
        return line(t, task, message, call=name, cluster="pvesim")

    def done(t: float, task: str, runtime: float) -> dict[str, Any]:
        return line(
            t, task, f"Task proxyhub.provisioning.step[{task}] succeeded in {runtime}s: None"
        )

    lines = [
        call(99.9, "early", "clone"),
        done(99.95, "early", 0.5),  # ended before the span: not counted
        call(100.1, "a", "node_tasks"),
        call(100.11, "a", "start"),
        done(100.12, "a", 0.03),
        call(100.2, "b", "node_tasks"),
        call(100.21, "b", "start"),
        done(100.22, "b", 0.02),
        call(100.3, "c", "agent_network_interfaces", failed=True),
        done(100.31, "c", 0.01),
        done(100.4, "d", 0.04),  # a slot wait: no call
        call(100.5, "e", "agent_network_interfaces"),  # still running at the span's end
    ]
    groups = deliveries_by_calls(lines, 100.0, 101.0)
    assert groups == [
        {"calls": "node_tasks,start", "deliveries": 2, "seconds": 0.05, "share": 0.5},
        {"calls": "(none)", "deliveries": 1, "seconds": 0.04, "share": 0.4},
        {"calls": "agent_network_interfaces!", "deliveries": 1, "seconds": 0.01, "share": 0.1},
    ]
    assert deliveries_by_calls(lines, 100.0, 101.0, top=1)[0]["calls"] == "node_tasks,start"
    assert deliveries_by_calls([], 100.0, 101.0) == []


# --- issue 12's suite (benchmarks/suite.py): its floors, statistics and results --------------


def test_one_proxy_alone_meets_no_queue_so_its_floor_is_its_critical_path() -> None:
    # realistic at time scale 0.1: clone 0.2 + upload 0.05 + resize 0.1 + start 0.1, then the
    # baked agent's boot max(1.5, 2.0) = 2.0.
    floor = create_floor(profile="realistic", time_scale=0.1)
    assert floor.seconds == pytest.approx(2.45)
    assert floor.seconds == floor.critical_path


def test_the_capped_makespan_floor_divides_the_template_nodes_work_by_the_cap() -> None:
    # 60 proxies on two nodes that run 3 tasks each, template on pve1, 30/30:
    # W_T = 60 * 0.2 + 30 * 0.25 = 19.5 s -> 19.5 / 3 + 2.0 = 8.5 s.
    floor = fleet_floor(
        {"pve1": 30, "pve2": 30},
        template_node="pve1",
        profile="realistic",
        time_scale=0.1,
        node_task_limit=3,
    )
    assert floor.seconds == pytest.approx(8.5)
    assert floor.template_node_bound == pytest.approx(8.5)
    # The same fleet where nodes take the profile's 4 tasks at once is bound lower.
    four = fleet_floor(
        {"pve1": 30, "pve2": 30}, template_node="pve1", profile="realistic", time_scale=0.1
    )
    assert four.seconds == pytest.approx(19.5 / 4 + 2.0)


def test_the_simulators_task_limit_is_the_one_given_and_never_below_one() -> None:
    assert get_profile("realistic").with_task_limit(3).node_task_limit == 3
    assert Engine(profile="fast", node_task_limit=2).profile.node_task_limit == 2
    with pytest.raises(ValueError, match="at least 1"):
        get_profile("fast").with_task_limit(0)


def test_the_spread_of_repeated_runs_is_their_median_and_range() -> None:
    assert spread([3.0, 1.0, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "range": 2.0,
        "runs": 3,
        "values": [3.0, 1.0, 2.0],
    }
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        spread([])


def test_the_speed_probe_times_its_work_and_a_run_counts_the_probes_around_it() -> None:
    # The probe is what tells a slow run from a slow machine (benchmarks/speed.py): it must
    # grow with the work it times. Twenty times the work against the same machine moment;
    # both are medians of five rounds, so one interrupted round does not decide.
    small = speed.probe_ms(items=5_000)
    large = speed.probe_ms(items=100_000)
    assert 0 < small < large
    assert large > 4 * small
    assert speed.around(10.0, 14.0) == 12.0
    with pytest.raises(ValueError, match="at least one"):
        speed.probe_ms(items=0)
    with pytest.raises(ValueError, match="at least one"):
        speed.probe_ms(rounds=0)


def _line(
    probes: list[float], *, at_zero: float, slope: float, noise: list[float]
) -> list[tuple[float, float]]:
    return [(p, at_zero + slope * p + e) for p, e in zip(probes, noise, strict=True)]


def test_two_commits_are_compared_at_the_same_machine_speed() -> None:
    # The same code, but the base's runs fell on slow minutes: its median is worse for that
    # alone (2026-12-08: one commit's makespan went from 1.28 to 2.02 as the probe doubled).
    noise = [0.01, -0.01, 0.0, 0.005, -0.005]
    base = _line([20.0, 22.0, 24.0, 26.0, 25.0], at_zero=1.0, slope=0.02, noise=noise)
    same = _line([13.0, 14.0, 15.0, 16.0, 14.5], at_zero=1.0, slope=0.02, noise=noise[::-1])
    assert median([r for _, r in same]) < median([r for _, r in base]) - 0.15
    matched = matched_difference(base, same)
    assert abs(matched.difference) < 2 * matched.error
    assert matched.slope == pytest.approx(0.02, abs=0.002)
    # A change that costs 0.1 of the floor at every speed is found, whatever the speeds.
    worse = _line([13.0, 14.0, 15.0, 16.0, 14.5], at_zero=1.1, slope=0.02, noise=noise[::-1])
    found = matched_difference(base, worse)
    assert found.difference == pytest.approx(0.1, abs=0.02)
    assert found.difference > 3 * found.error
    assert found.as_dict()["baseRuns"] == 5
    with pytest.raises(ValueError, match="two runs a side"):
        matched_difference(base[:1], worse)


def test_the_ab_runner_reads_the_probe_and_ratio_of_each_run_of_a_suite_file() -> None:
    reports = [
        {"result": {"makespan": {"runs": [{"speedProbeMs": 14.0, "ratio": 1.3}]}}},
        # A run recorded before the probe existed cannot be matched: left out.
        {"result": {"makespan": {"runs": [{"ratio": 1.9}, {"speedProbeMs": 21.0, "ratio": 1.6}]}}},
        {"result": {"latency": {"runs": [{"speedProbeMs": 15.0, "ratio": 1.1}]}}},
    ]
    assert ab.runs_of(reports, "makespan") == [(14.0, 1.3), (21.0, 1.6)]
    assert ab.runs_of(reports, "latency") == [(15.0, 1.1)]
    both = ab.summary([(14.0, 1.3), (21.0, 1.6)], [(15.0, 1.35), (20.0, 1.55)])
    assert both["base"]["ratio"]["runs"] == 2
    assert set(both["matched"]) == {"difference", "error", "slope", "baseRuns", "newRuns"}


def test_p95_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(values, 95) == 19.0
    assert percentile(values, 100) == 20.0
    assert percentile([5.0], 95) == 5.0
    assert percentile(list(reversed(values)), 50) == 10.0


def test_the_most_creates_open_at_once_counts_touching_spans_apart() -> None:
    assert max_overlap([(0, 2), (1, 3), (2, 4)]) == 2  # the first ends as the third starts
    assert max_overlap([(0, 10), (1, 2), (1.5, None)]) == 3
    assert max_overlap([]) == 0


def test_the_inflight_series_shows_a_node_over_its_cap_and_never_idle_while_work_waits() -> None:
    # Five tasks submitted at once to a node that runs two at a time, each 1 s: the client
    # exceeded a cap of 2 (5 in flight), and the node ran 2 whenever work queued.
    tasks = [
        {"node": "pve1", "submitted": 0.0, "startedAt": s, "endedAt": s + 1.0}
        for s in (0.0, 0.0, 1.0, 1.0, 2.0)
    ]
    tasks.append({"node": "pve2", "submitted": 0.5, "startedAt": 0.5, "endedAt": 1.5})
    nodes = inflight(tasks, cap=2)
    pve1 = nodes["pve1"]
    assert (pve1.max_inflight, pve1.max_running, pve1.exceeded_cap) == (5, 2, True)
    assert pve1.seconds_waiting == pytest.approx(2.0)  # queued from 0 to 2
    assert pve1.seconds_waiting_below_cap == 0.0
    assert pve1.seconds_over_cap == pytest.approx(2.0)  # 5, then 3 in flight until t=2
    assert (pve1.seconds_at_cap, pve1.seconds_busy, pve1.seconds) == (2.0, 3.0, 3.0)
    assert pve1.series[0] == (0.0, 5, 2)
    assert pve1.series[-1] == (3.0, 0, 0)
    assert nodes["pve2"].exceeded_cap is False
    # A node that idles a slot while a task of ours waits is caught.
    idle = inflight(
        [
            {"node": "pve1", "submitted": 0.0, "startedAt": 0.0, "endedAt": 1.0},
            {"node": "pve1", "submitted": 0.0, "startedAt": 0.5, "endedAt": 1.5},
        ],
        cap=2,
    )["pve1"]
    assert idle.seconds_waiting_below_cap == pytest.approx(0.5)


def test_steps_proxyhub_held_back_count_as_waiting_work_not_as_tasks_in_flight() -> None:
    # A cap of 2 kept by proxyhub: two tasks run 0..1 and 1..2; a third step waited for a slot
    # from 0 to 1.2 (journal), so from 1.0 to 1.2 work waited while only one task ran.
    tasks = [
        {"node": "pve1", "submitted": 0.0, "startedAt": 0.0, "endedAt": 1.0},
        {"node": "pve1", "submitted": 0.0, "startedAt": 0.0, "endedAt": 2.0},
        {"node": "pve1", "submitted": 1.2, "startedAt": 1.2, "endedAt": 2.0},
    ]
    pve1 = inflight(tasks, cap=2, held_back=[("pve1", 0.0, 1.2), ("pve2", 0.0, 5.0)])["pve1"]
    assert (pve1.max_inflight, pve1.exceeded_cap) == (2, False)
    assert pve1.seconds_waiting == pytest.approx(1.2)
    assert pve1.seconds_waiting_below_cap == pytest.approx(0.2)
    assert inflight(tasks, cap=2)["pve1"].seconds_waiting == 0.0


def test_the_simulator_lists_every_task_with_its_node_and_times() -> None:
    engine = Simulator(profile="instant", node_task_limit=1)
    api = engine.control
    vmid = api.create_vms(1, start_vmid=5000, node="pve2", tags=None)[0]
    token = {"authorization": f"PVEAPIToken={engine.token}"}
    reply = engine.handle(
        SimRequest("POST", f"/api2/json/nodes/pve2/qemu/{vmid}/status/start", headers=token)
    )
    assert reply.status == 200
    tasks = api.tasks()
    assert [(t["node"], t["type"]) for t in tasks] == [("pve2", "qmstart")]
    assert tasks[0]["startedAt"] is not None and tasks[0]["endedAt"] is not None


def test_the_suite_writes_its_figures_as_numbers_and_keeps_the_records(tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    record_latest({"fleet_ratio_20": Figure(2.7, 3.0, "x floor")}, commit="a", path=latest)
    record_suite(
        {"makespan_ratio": Figure(3.2, 1.05, "x floor", {"exceededCap": True})},
        commit="b",
        path=latest,
    )
    record_suite(
        {"makespan_ratio": Figure(9.9, 1.05, "x floor")},
        section="suite_smoke",
        flat=False,
        commit="c",
        path=latest,
    )
    document = json.loads(latest.read_text())
    assert document["makespan_ratio"] == 3.2  # the smoke run did not replace the real figure
    assert document["suite"]["makespan_ratio"]["details"] == {"exceededCap": True}
    assert document["suite"]["makespan_ratio"]["target"] == 1.05
    assert document["suite_smoke"]["makespan_ratio"]["value"] == 9.9
    assert document["fleet_ratio_20"]["value"] == 2.7  # older figures keep their records


# --- benchmarks/spy.py: the worker's profile, summed by proxyhub's own functions ---------------

_RAW = [
    'process 10:"celery worker";process 11:"celery worker";main (celery/bin.py:1);'
    "run_step (provisioning/tasks.py:58);_run_one (provisioning/services/driver.py:180);"
    "execute (django/db/backends/utils.py:79) 6",
    'process 10:"celery worker";process 11:"celery worker";main (celery/bin.py:1);'
    "run_step (provisioning/tasks.py:58);_run_one (provisioning/services/driver.py:240);"
    "_run_one (provisioning/services/driver.py:241) 3",
    'process 10:"celery worker";process 11:"celery worker";main (celery/bin.py:1);'
    "receive (billiard/pool.py:534) 1",
    'process 10:"celery worker";loop (kombu/asynchronous/hub.py:373) 7',
    # The pool's lease renewer, waiting: a thread the process started, not its main thread.
    'process 10:"celery worker";process 11:"celery worker";'
    "Thread._bootstrap (/usr/lib/python3.11/threading.py:995);"
    "_Renewer._run (provisioning/services/heartbeat.py:70);"
    "Condition.wait (/usr/lib/python3.11/threading.py:331) 20",
    "not a stack line",
]


def test_the_profile_counts_each_own_function_once_per_sample_in_the_pool_process() -> None:
    samples = spy.parse(_RAW)
    assert [(s.pid, s.count) for s in samples] == [(11, 6), (11, 3), (11, 1), (10, 7), (11, 20)]
    assert spy.busiest_child(samples, parent=10) == 11
    summary = spy.own_shares(samples, pid=11)
    # The renewer's waiting thread is counted apart: the shares are the main thread's, which
    # runs the steps (it was half of a latency profile's samples, all of them waits).
    assert summary["samples"] == 10
    assert summary["otherThreadSamples"] == 20
    # Two lines of _run_one in one stack count its samples once; Celery's and Django's frames
    # are not proxyhub's and are not listed.
    assert summary["shares"] == {
        "provisioning/tasks.py:run_step": 0.9,
        "provisioning/services/driver.py:_run_one": 0.9,
    }
    assert spy.own_shares(samples, pid=99) == {
        "samples": 0,
        "otherThreadSamples": 0,
        "shares": {},
        "steps": {"samples": 0, "parts": {}},
    }


def test_a_steps_time_is_told_by_the_function_the_step_called() -> None:
    """Below ``driver._run_one``: Django's read of the operation counts as itself, and a
    sample in the step's own lines as the step; samples outside any step are left out."""
    raw = [
        'process 11:"w";main (celery/bin.py:1);_run_one (provisioning/services/driver.py:180);'
        "get (django/db/models/query.py:611);execute (django/db/backends/utils.py:79) 3",
        'process 11:"w";main (celery/bin.py:1);_run_one (provisioning/services/driver.py:180);'
        "_persist (provisioning/services/driver.py:470);"
        "journal_step (provisioning/services/journal.py:30) 5",
        'process 11:"w";main (celery/bin.py:1);_run_one (provisioning/services/driver.py:190) 2',
        'process 11:"w";main (celery/bin.py:1);receive (billiard/pool.py:534) 10',
    ]
    steps = spy.step_parts(spy.parse(raw))
    assert steps == {
        "samples": 10,
        "parts": {
            "provisioning/services/driver.py:_persist": 0.5,
            "django/db/models/query.py:get": 0.3,
            "provisioning/services/driver.py:_run_one": 0.2,
        },
    }


def test_the_template_nodes_lanes_count_idle_slots_only_until_its_last_clone() -> None:
    def task(kind: str, start: float, end: float, node: str = "pve1") -> dict[str, Any]:
        return {"node": node, "type": kind, "submitted": start, "startedAt": start, "endedAt": end}

    # Two slots: one runs clones back to back; the other idles 0.1 s between a clone and the
    # upload after it. The last clone is submitted at 0.4 s; what comes after is not counted.
    tasks = [
        task("qmclone", 0.0, 0.2),
        task("qmclone", 0.2, 0.4),
        task("qmclone", 0.4, 0.6),
        task("qmclone", 0.0, 0.2),
        task("imgcopy", 0.3, 0.5),
        task("qmstart", 0.7, 0.8),
        task("qmclone", 0.0, 0.3, node="pve2"),  # another node: not counted
    ]
    lanes = lanes_used(tasks, node="pve1", cap=2)
    # Slot-seconds over [0, 0.4]: busy 0.4 + 0.3, idle 0.1 (0.2-0.3 on the second slot).
    assert lanes["seconds"] == 0.4
    assert lanes["utilisation"] == pytest.approx(0.7 / 0.8, abs=0.001)
    # Three tasks ended by 0.4 s (two clones at 0.2, one at 0.4): 100 ms / 3.
    assert lanes["taskEnds"] == 3
    assert lanes["idleMsPerTaskEnd"] == pytest.approx(33.3, abs=0.1)
    # A node kept full has no idle time; one without clones has nothing to say.
    full = lanes_used([task("qmclone", 0.0, 0.2), task("qmclone", 0.2, 0.4)], node="pve1", cap=1)
    assert (full["utilisation"], full["idleMsPerTaskEnd"]) == (1.0, 0.0)
    assert lanes_used(tasks, node="pve3", cap=2)["utilisation"] is None


def test_a_task_s_end_is_noticed_by_the_first_request_that_could_tell_it() -> None:
    def task(kind: str, end: float, vmid: int, node: str = "pve1") -> dict[str, Any]:
        upid = f"UPID:{node}:00000001:00000002:6B16EF0F:{kind}:{vmid}:proxyhub@pve!sim:"
        return {"node": node, "type": kind, "upid": upid, "submitted": 0.0, "endedAt": end}

    def look(key: str, at: float, **params: str) -> dict[str, Any]:
        return {"time": at, "key": key, "path_params": {"node": "pve1", **params}}

    clone, start = task("qmclone", 1.0, 101), task("qmstart", 2.0, 102)
    other = task("qmclone", 1.5, 103, node="pve2")
    entries = [
        look("GET /nodes/{node}/tasks", 0.9),  # before the end: tells nothing
        look("GET /nodes/{node}/tasks/{upid}/status", 1.03, upid=str(clone["upid"])),
        look("GET /nodes/{node}/tasks", 1.05),
        look("GET /nodes/{node}/qemu/{vmid}/status/current", 2.01, vmid="102"),
        look("GET /nodes/{node}/qemu/{vmid}/status/current", 1.9, vmid="999"),
        look("GET /version", 1.0),
    ]
    noticed = end_noticed([clone, start, other, {**clone, "endedAt": None}], entries)
    # The clone's own status read at +30 ms; the start's VM status at +10 ms; the task on
    # pve2 was never looked at after its end (pve1's list says nothing of it); the running
    # task has no end to notice.
    assert noticed["qmclone"] == {"n": 1, "medianMs": 30.0, "p90Ms": 30.0}
    assert noticed["qmstart"] == {"n": 1, "medianMs": 10.0, "p90Ms": 10.0}
    assert noticed["all"]["n"] == 2 and noticed["all"]["medianMs"] == pytest.approx(20.0)
    assert end_noticed([], entries) == {}


def test_a_lone_creates_stage_floors_add_up_to_its_floor() -> None:
    stages = create_stages(profile="realistic", time_scale=0.1)
    floor = create_floor(profile="realistic", time_scale=0.1)
    assert sum(stages.values()) == pytest.approx(floor.seconds)
    assert set(stages) == {"clone", "upload", "resize", "start", "address"}


def test_a_lone_creates_time_over_its_floor_is_split_by_journal_stage() -> None:
    floors = {"clone": 0.2, "upload": 0.05, "resize": 0.1, "start": 0.1, "address": 2.0}
    # A latency run's journal (seconds from the request), the seed's release after the address.
    steps = [
        ["lookup", 0.036, 0.056],
        ["clone", 0.056, 0.334],
        ["upload", 0.334, 0.406],
        ["configure", 0.406, 0.406],
        ["resize", 0.406, 0.519],
        ["start", 0.519, 0.628],
        ["running", 0.628, 0.628],
        ["address", 0.628, 2.651],
        ["seed_release", 2.674, 2.798],
    ]
    over = over_floor_by_stage(steps, floors)
    assert over == {
        BEFORE_FIRST_STEP: 36.0,
        "lookup": 20.0,
        "clone": 78.0,
        "upload": 22.0,
        "configure": 0.0,
        "resize": 13.0,
        "start": 9.0,
        "running": 0.0,
        "address": 23.0,
    }
    # The parts add up to the time over the floor: Running at 2.651 s against 2.45 s.
    assert sum(over.values()) == pytest.approx(1000 * (2.651 - 2.45), abs=0.5)
    # A stage journalled twice (run again) counts its floor once.
    again = over_floor_by_stage(
        [["clone", 0.0, 0.1], ["clone", 0.1, 0.3], ["address", 0.3, 2.3]], floors
    )
    assert again == {BEFORE_FIRST_STEP: 0.0, "clone": 100.0, "address": 0.0}
    assert over_floor_by_stage([], floors) == {}
