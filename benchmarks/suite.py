"""Issue 12's benchmark: nine figures, each beside its goal, its floor and its spread.

``make bench`` runs it at the issue's sizes, ``make bench-smoke`` at small ones (a check that the
harness works, not a measurement). Every figure runs the path a user runs: ``manage.py proxies
create``, real ``celery -A proxyhub worker`` processes taking messages from the real Redis broker,
the HTTPS simulator, PostgreSQL (tests/integration/itstack.py starts them as the integration
tier does, with production settings and the product's default polls). Only a starting state
that would take hours through that path (2,000 Running proxies on a 10,000-VM cluster, 100,000
proxies for the admin) is written straight into the database and the simulator; the measured
work never is. benchmarks/README.md says how to read the results.

    .venv/bin/python benchmarks/suite.py                  # full sizes
    .venv/bin/python benchmarks/suite.py --size smoke     # small sizes
    .venv/bin/python benchmarks/suite.py --only latency makespan
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import speed, spy  # noqa: E402
from benchmarks.fleet import classify_request, simulator_capacity  # noqa: E402
from benchmarks.floor import create_floor, create_stages, fleet_floor  # noqa: E402
from benchmarks.observe import deliveries_by_calls, log_counts, worker_log  # noqa: E402
from benchmarks.record import (  # noqa: E402
    Figure,
    append_report,
    git_commit,
    load_average,
    now_iso,
    record_suite,
    shown,
)
from benchmarks.stats import (  # noqa: E402
    end_noticed,
    inflight,
    lanes_used,
    max_overlap,
    median,
    over_floor_by_stage,
    percentile,
    spread,
)
from tests.integration.itstack import Services, Stack, running_stack, wait_until  # noqa: E402

INSIDE = REPO / "benchmarks" / "inside.py"
PROFILE = "realistic"
TIME_SCALE = 0.1
CAP = 3  # the makespan figure's per-node task limit, the simulator's and (once built) proxyhub's
TWO_NODES = ("pve1", "pve2")


@dataclass(frozen=True)
class Sizes:
    repeats: int  # runs of each timed figure (median and range)
    makespan_proxies: int
    concurrent_proxies: int
    reconcile_proxies: int
    cluster_vms: int
    changelist_proxies: int
    changelist_loads: int
    pings: int


SIZES = {
    "full": Sizes(3, 60, 500, 2000, 10000, 100000, 20, 200),
    "smoke": Sizes(2, 12, 20, 100, 600, 2000, 5, 20),
}

# Figure → (goal, unit, the way the goal reads). ``None``: context only, no goal.
GOALS: dict[str, tuple[float | None, str, str]] = {
    "create_latency_ratio": (1.05, "x floor", "at most"),
    "makespan_ratio": (1.05, "x floor", "at most"),
    "requests_per_create": (15, "requests", "at most"),
    "requests_per_create_with_release": (None, "requests", ""),
    "concurrent_creates_one_worker": (500, "creates", "at least"),
    "worker_peak_rss_mib": (200, "MiB", "at most"),
    "reconcile_requests_per_proxy": (0.1, "requests", "at most"),
    "reconcile_seconds": (None, "s", ""),
    "gc_sweep_requests": (None, "requests", ""),
    "gc_sweep_seconds": (10, "s", "at most"),
    "admin_changelist_queries": (8, "queries", "at most"),
    "admin_changelist_ms": (100, "ms", "at most"),
    "celery_roundtrip_ms_p95": (None, "ms", ""),
}


# --- plumbing ---------------------------------------------------------------------------------


def inside(stack: Stack, *args: str, timeout: float = 1800) -> Any:
    """``benchmarks/inside.py ARGS`` with the stack's environment; its JSON output."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(INSIDE), *args],
        cwd=REPO,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"inside.py {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    # Django logs JSON lines to stdout too (a request's warning); the document is the last.
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker_name(name: str) -> str:
    return f"{name}@{socket.gethostname()}"


def task_runtime(stack: Stack, log_name: str, task_id: str, timeout: float) -> float:
    """Wait for the worker to log ``task_id`` as succeeded; Celery's own run time of it."""
    path = stack.logdir / f"worker-{log_name}.log"

    def finished() -> float | None:
        for line in worker_log(path):
            message = str(line.get("message", ""))
            if line.get("task_id") == task_id and " succeeded in " in message:
                return float(message.split(" succeeded in ", 1)[1].split("s", 1)[0])
        return None

    return wait_until(finished, timeout=timeout, interval=0.2, what=f"task {task_id}")


def group_rss_kib(pgid: int) -> tuple[int, int]:
    """(sum, largest) resident set of every process in process group ``pgid``, in KiB."""
    total = largest = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            # Field 5 is the process group; the command (field 2) may hold spaces: skip it.
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kib = int(line.split()[1])
                    total += kib
                    largest = max(largest, kib)
        except (OSError, ValueError, IndexError):
            continue
    return total, largest


def group_pss_kib(pgid: int) -> int:
    """Proportional set size of process group ``pgid``, summed, in KiB: each page shared by
    n of its processes counts 1/n in each. Reported beside the RSS sum (never instead of it):
    a prefork pool process shares its parent's pages, which the RSS sum counts twice."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in Path(f"/proc/{entry}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total


@contextmanager
def rss_watch(pgid: int, interval: float = 0.5) -> Iterator[dict[str, int]]:
    """Peak resident memory of a worker (parent and pool processes) while the block runs."""
    peak = {"sumKiB": 0, "largestKiB": 0, "pssSumKiB": 0, "samples": 0}
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            total, largest = group_rss_kib(pgid)
            peak["sumKiB"] = max(peak["sumKiB"], total)
            peak["largestKiB"] = max(peak["largestKiB"], largest)
            peak["pssSumKiB"] = max(peak["pssSumKiB"], group_pss_kib(pgid))
            peak["samples"] += 1
            stop.wait(interval)

    thread = threading.Thread(target=run, name="rss-watch", daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join(timeout=5)


def requests_summary(entries: Sequence[dict[str, Any]], proxies: int) -> dict[str, Any]:
    kinds = Counter(classify_request(e) for e in entries)
    span = (entries[-1]["time"] - entries[0]["time"]) if len(entries) > 1 else 0.0
    return {
        "total": len(entries),
        "perProxy": round(len(entries) / proxies, 2) if proxies else None,
        "mutationsPerProxy": round(kinds["mutations"] / proxies, 2) if proxies else None,
        "pollsPerProxy": round(kinds["polls"] / proxies, 2) if proxies else None,
        "otherReadsPerProxy": round(kinds["other_reads"] / proxies, 2) if proxies else None,
        "simulatorRequestsPerSecond": round(len(entries) / span, 1) if span else None,
        "simulatorBusySeconds": round(sum(float(e["duration"]) for e in entries), 3),
        "byEndpoint": dict(Counter(str(e["key"]) for e in entries).most_common()),
    }


def create_fleet(stack: Stack, prefix: str, n: int, timeout: float) -> dict[str, Any]:
    """``proxies create --count n`` then ``proxies wait --phase Running``: the journal's span
    from the first create's ``created_at`` to the last ``address`` step's end (Running with an
    address), the ledger's requests of the whole creates (the seed's release included), the
    placement and the operations' own spans; and the machine's speed just before and after
    (``speed.py``: a slow run can then be told from a slow machine)."""
    probe_before = speed.probe_ms()
    template = stack.sim.info()["templateVmid"]
    template_node = next(str(v["node"]) for v in stack.sim.vms() if int(v["vmid"]) == template)
    before = stack.sim.last_seq()
    started = time.time()
    stack.create_proxies("--count", str(n), "--prefix", prefix, timeout=600)
    command = time.time() - started
    width = len(str(n))
    stack.wait_phase([f"{prefix}-{i:0{width}d}" for i in range(1, n + 1)], "Running", timeout)

    def ended() -> list[dict[str, Any]] | None:
        # The seed's release runs after Running; its requests are the create's too.
        found = stack.probe("operations", f"{prefix}-", "--kind", "create")
        return found if all(op["finishedAt"] for op in found) else None

    ops = wait_until(ended, timeout=timeout, interval=1.0, what=f"{prefix}'s creates to end")
    probe = speed.around(probe_before, speed.probe_ms())
    entries = stack.sim.ledger(after=before)
    rows = stack.proxies(f"{prefix}-")
    # Running with an address is the end of the ``address`` step; the seed's release comes
    # after it, off the user's path (the operation's ``finished_at`` includes it).
    addressed = [
        step["finishedAt"] for op in ops for step in op["steps"] if step["name"] == "address"
    ]
    if len(ops) != n or len(addressed) != n or None in addressed:
        raise RuntimeError(f"{prefix}: {len(ops)} create operations, {len(addressed)} addressed")
    first = min(float(op["createdAt"]) for op in ops)
    # Issue 12 counts a create to Running: the requests up to the last guest agent read, the
    # one that found the address (the ledger's time is the simulator's monotonic
    # clock, not the journal's); the seed's release that follows is counted apart.
    last_agent = max((int(e["seq"]) for e in entries if "/agent/" in str(e["key"])), default=0)
    to_running = [e for e in entries if int(e["seq"]) <= last_agent]
    last_address = max(float(a) for a in addressed)
    return {
        "entriesToRunning": to_running,
        "startedAt": first,
        "addressedAt": last_address,
        "wall": last_address - first,
        "wallToFinished": max(float(op["finishedAt"] or 0) for op in ops) - first,
        "createCommandSeconds": round(command, 3),
        "speedProbeMs": probe,
        "states": dict(Counter(str(op["state"]) for op in ops)),
        "templateNode": template_node,
        "placement": dict(sorted(Counter(str(r["node"]) for r in rows).items())),
        "entries": entries,
        "operations": [(float(o["startedAt"] or o["createdAt"]), o["finishedAt"]) for o in ops],
        "slotWaits": slot_waits(ops),
        "timeline": step_timeline(ops[0], first) if n == 1 else [],
    }


def step_timeline(op: dict[str, Any], first: float) -> list[tuple[str, float, float | None]]:
    """One create's journal steps as (name, start, end) in seconds from its request: where a
    lone create's time over the floor goes (each task's end noticed late, each step's turn)."""
    out = []
    for step in op["steps"]:
        if step["startedAt"] is None:
            continue
        end = step["finishedAt"]
        out.append(
            (
                str(step["name"]),
                round(float(step["startedAt"]) - first, 3),
                None if end is None else round(float(end) - first, 3),
            )
        )
    return out


def slot_waits(ops: Sequence[dict[str, Any]]) -> list[tuple[str, float, float | None]]:
    """The journal's ``slot_wait`` steps (services/slots.py: a step that found its node's
    slots taken, until it got one) as (node, start, end) on the simulator's clock: the work
    proxyhub held back itself, which the simulator's task timeline cannot show. The simulator
    runs on this host's monotonic clock and the journal on the wall clock."""
    offset = time.time() - time.monotonic()
    out: list[tuple[str, float, float | None]] = []
    for op in ops:
        for step in op["steps"]:
            if step["name"] != "slot_wait":
                continue
            node = str(step["message"]).rsplit(" node ", 1)[-1].split()[0]
            end = step["finishedAt"]
            out.append(
                (node, float(step["startedAt"]) - offset, None if end is None else end - offset)
            )
    return out


def measure_latency(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """One proxy alone, ``repeats`` times: request to Running with an address, over the
    critical path; its requests per create."""
    floor = create_floor(profile=PROFILE, time_scale=TIME_SCALE)
    stages = create_stages(profile=PROFILE, time_scale=TIME_SCALE)
    runs = []
    for r in range(sizes.repeats):
        run = create_fleet(stack, f"lat{r}", 1, timeout=300)
        entries = run.pop("entries")
        to_running = run.pop("entriesToRunning")
        run.pop("operations")
        run.pop("slotWaits")
        run.pop("startedAt")
        run.pop("addressedAt")
        run["steps"] = run.pop("timeline")
        run["overFloorMs"] = over_floor_by_stage(run["steps"], stages)
        run["ratio"] = run["wall"] / floor.seconds
        run["requests"] = requests_summary(entries, 1)
        run["requestsToRunning"] = requests_summary(to_running, 1)
        runs.append(run)
    ratios = [r["ratio"] for r in runs]
    requests = [float(r["requestsToRunning"]["total"]) for r in runs]
    with_release = [float(r["requests"]["total"]) for r in runs]
    return {
        "floorSeconds": floor.seconds,
        "floor": asdict(floor),
        "wallSeconds": spread([r["wall"] for r in runs]),
        "ratio": spread(ratios, digits=3),
        "requestsPerCreate": spread(requests, digits=1),
        "requestsPerCreateWithRelease": spread(with_release, digits=1),
        "speedProbeMs": spread([r["speedProbeMs"] for r in runs], digits=2),
        # Where the time over the floor went, stage by stage (median of the runs, ms).
        "overFloorMsByStage": {
            stage: median([r["overFloorMs"].get(stage, 0.0) for r in runs])
            for stage in dict.fromkeys(k for r in runs for k in r["overFloorMs"])
        },
        "runs": runs,
    }


def measure_makespan(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """``makespan_proxies`` at once on two nodes that run at most CAP tasks each, over the
    floor for that limit; the per-node in-flight series from the simulator's task timeline."""
    runs = []
    n = sizes.makespan_proxies
    for r in range(sizes.repeats):
        run = create_fleet(stack, f"mk{r}", n, timeout=1800)
        entries = run.pop("entries")
        run.pop("entriesToRunning")
        ops = run.pop("operations")
        waits = run.pop("slotWaits")
        run.pop("timeline")
        upids = {str(e["upid"]) for e in entries if e.get("upid")}
        tasks = [t for t in stack.sim.tasks() if t["upid"] in upids]
        floor = fleet_floor(
            run["placement"],
            template_node=run["templateNode"],
            profile=PROFILE,
            time_scale=TIME_SCALE,
            node_task_limit=CAP,
        )
        series = inflight(tasks, cap=CAP, held_back=waits)
        # How full the template node's slots were while it had clones to run, and what the
        # one worker process did from the first request to the last address (README, "The
        # worker's side": a busy share near 1 alone does not say the worker sets the pace).
        lanes = lanes_used(tasks, node=str(run["templateNode"]), cap=CAP)
        noticed = end_noticed(tasks, entries)
        lines = worker_log(stack.logdir / "worker-bench.log")
        span = (run.pop("startedAt"), run.pop("addressedAt"))
        worker = log_counts(lines, *span)
        worker["deliveriesPerCreate"] = round(worker["deliveries"] / n, 2)
        worker["byCalls"] = deliveries_by_calls(lines, *span)
        run.update(
            {
                "worker": worker,
                "templateNodeLanes": lanes,
                "taskEndNoticed": noticed,
                "floorSeconds": floor.seconds,
                "floor": asdict(floor),
                "ratio": run["wall"] / floor.seconds,
                "requests": requests_summary(entries, n),
                "maxConcurrentCreates": max_overlap((a, b) for a, b in ops),
                "nodes": {k: v.as_dict() for k, v in series.items()},
            }
        )
        runs.append(run)
    last = runs[-1]["nodes"]
    return {
        "proxies": n,
        "nodeTaskLimit": CAP,
        "proxyhubPerNodeCap": CAP,
        "proxyhubPerNodeCapNote": "PROXYHUB_NODE_TASK_LIMIT: a step takes a slot of its "
        "task's node before it submits and waits in the journal (slot_wait) when none is free; "
        "work waited while the simulator queued a task of ours or a step of ours waited for a "
        "slot",
        "floorSeconds": spread([r["floorSeconds"] for r in runs]),
        "wallSeconds": spread([r["wall"] for r in runs]),
        "ratio": spread([r["ratio"] for r in runs], digits=3),
        "speedProbeMs": spread([r["speedProbeMs"] for r in runs], digits=2),
        "exceededCap": any(node["exceededCap"] for r in runs for node in r["nodes"].values()),
        "maxInflightPerNode": {k: v["maxInflight"] for k, v in last.items()},
        "secondsWaitingBelowCap": round(
            sum(node["secondsWaitingBelowCap"] for r in runs for node in r["nodes"].values()), 3
        ),
        # How much of the makespan each node ran at the cap (last run): 1.0 is a node kept full.
        "shareAtCapPerNode": {
            k: round(v["secondsAtCap"] / runs[-1]["wall"], 3) for k, v in last.items()
        },
        # The worker's side of the same runs (above).
        "workerBusyShare": spread([r["worker"]["busyShare"] for r in runs]),
        "deliveriesPerCreate": spread([r["worker"]["deliveriesPerCreate"] for r in runs], digits=2),
        "msPerDelivery": spread([r["worker"]["msPerDelivery"] for r in runs], digits=1),
        "templateNodeUtilisation": spread(
            [r["templateNodeLanes"]["utilisation"] or 0.0 for r in runs]
        ),
        "templateNodeIdleMsPerTaskEnd": spread(
            [r["templateNodeLanes"]["idleMsPerTaskEnd"] or 0.0 for r in runs], digits=1
        ),
        # How late a task's end was first looked at (all task types, median of each run).
        "taskEndNoticedMs": spread(
            [(r["taskEndNoticed"].get("all") or {}).get("medianMs", 0.0) for r in runs], digits=1
        ),
        "runs": runs,
    }


def measure_concurrency(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """``concurrent_proxies`` creates at once with one worker process: how many it drove at
    the same moment (operations started and not finished, from the journal) and its peak
    resident memory (parent and pool process, sampled every 0.5 s)."""
    worker = stack.workers[0]
    assert worker.process is not None
    n = sizes.concurrent_proxies
    with rss_watch(worker.process.pid) as peak:
        run = create_fleet(stack, "conc", n, timeout=3600)
    entries = run.pop("entries")
    run.pop("entriesToRunning")
    ops = run.pop("operations")
    run.pop("timeline")
    floor = fleet_floor(
        run["placement"], template_node=run["templateNode"], profile=PROFILE, time_scale=TIME_SCALE
    )
    return {
        "proxies": n,
        "maxConcurrentCreates": max_overlap((a, b) for a, b in ops),
        "peakRssMiB": round(peak["sumKiB"] / 1024, 1),
        "peakRssLargestProcessMiB": round(peak["largestKiB"] / 1024, 1),
        "peakPssMiB": round(peak["pssSumKiB"] / 1024, 1),
        "rssSamples": peak["samples"],
        "wallSeconds": round(run["wall"], 3),
        "floorSeconds": floor.seconds,
        "ratio": round(run["wall"] / floor.seconds, 3),
        "requests": requests_summary(entries, n),
        "placement": run["placement"],
        "states": run["states"],
    }


def seed_cluster(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """The starting state of reconcile and GC, written directly (README): ``cluster_vms`` VMs
    of which ``reconcile_proxies`` are running proxies of ours (marked, with Proxy rows
    Running with an address) and the rest other workloads (not ``proxy-*``, untagged)."""
    mark = inside(stack, "installation-id")["mark"]
    started = time.monotonic()
    ours = stack.sim.control(
        "create_vms",
        count=sizes.reconcile_proxies,
        start_vmid=100000,
        name_prefix="proxy-rec-",
        running=True,
        description=mark,
        tags="proxyhub",
    )
    others = stack.sim.control(
        "create_vms",
        count=sizes.cluster_vms - sizes.reconcile_proxies,
        start_vmid=300000,
        name_prefix="other-",
        running=True,
        tags=None,
    )
    by_vmid = {int(v["vmid"]): v for v in stack.sim.vms()}
    spec = {
        "cluster": "pvesim",
        "vms": [
            {"index": i, "vmid": vmid, "name": by_vmid[vmid]["name"], "node": by_vmid[vmid]["node"]}
            for i, vmid in enumerate(ours)
        ],
    }
    spec_file = stack.logdir / "seed.json"
    spec_file.write_text(json.dumps(spec))
    inside(stack, "seed-proxies", str(spec_file))
    return {
        "ourVms": len(ours),
        "otherVms": len(others),
        "clusterVms": len(by_vmid),
        "seedSeconds": round(time.monotonic() - started, 1),
    }


def measure_round(stack: Stack, task: str, proxies: int, sizes: Sizes) -> dict[str, Any]:
    """``task`` sent through the broker ``repeats`` times; each run's Celery run time, its
    requests, and the simulator's own time answering them (the floor)."""
    runs = []
    for _ in range(sizes.repeats):
        before = stack.sim.last_seq()
        sent = inside(stack, "send", task)
        seconds = task_runtime(stack, "bench", sent["taskId"], timeout=900)
        entries = stack.sim.ledger(after=before)
        summary = requests_summary(entries, proxies)
        runs.append(
            {
                "seconds": seconds,
                "requests": len(entries),
                "requestsPerProxy": len(entries) / proxies,
                "floorSeconds": summary["simulatorBusySeconds"],
                "byEndpoint": dict(Counter(str(e["key"]) for e in entries).most_common(8)),
            }
        )
    return {
        "seconds": spread([r["seconds"] for r in runs]),
        "requests": spread([float(r["requests"]) for r in runs], digits=1),
        "requestsPerProxy": spread([r["requestsPerProxy"] for r in runs], digits=4),
        "floorSeconds": spread([r["floorSeconds"] for r in runs]),
        "runs": runs,
    }


def measure_pings(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    out = inside(stack, "ping", worker_name("bench"), "--count", str(sizes.pings))
    times = out["roundTripsMs"]
    return {
        "p95Ms": round(percentile(times, 95), 2) if times else None,
        "medianMs": round(median(times), 2) if times else None,
        "pings": len(times),
        "missed": out["missed"],
    }


def measure_changelist(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    out = inside(
        stack,
        "changelist",
        "--proxies",
        str(sizes.changelist_proxies),
        "--repeat",
        str(sizes.changelist_loads),
        timeout=3600,
    )
    loads = out.pop("loads")
    out["ms"] = spread([float(load["ms"]) for load in loads], digits=2)
    out["queries"] = spread([float(load["queries"]) for load in loads], digits=0)
    return out


# --- running it -------------------------------------------------------------------------------


STAGES = ("latency", "makespan", "concurrency", "cluster", "changelist")


def stack_for(
    root: Path, services: Services, name: str, **kwargs: Any
) -> AbstractContextManager[Stack]:
    return running_stack(
        root / name,
        services=services,
        database=f"proxyhub_suite_{name}_{os.getpid()}",
        profile=PROFILE,
        time_scale=TIME_SCALE,
        settings_module="proxyhub.settings.production",
        **kwargs,
    )


def profile_makespan(stack: Stack, sizes: Sizes) -> dict[str, Any]:
    """One more makespan run with py-spy sampling the worker (``benchmarks/spy.py``): where a
    delivery's time goes. Its wall clock is not a figure (sampling slows the worker)."""
    worker = stack.workers[0]
    assert worker.process is not None
    with spy.recording(worker.process.pid, stack.logdir / "worker.spy") as summary:
        create_fleet(stack, "spy", sizes.makespan_proxies, timeout=1800)
    return summary


def run_suite(
    sizes: Sizes,
    only: Sequence[str],
    log: Callable[[str], None],
    *,
    profile: bool = False,
    py_spy: bool = False,
) -> dict[str, Any]:
    services = Services.from_env()
    why = services.unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="proxyhub-suite-") as tmp:
        root = Path(tmp)
        if {"latency", "makespan"} & set(only):
            # Two nodes, each running at most CAP tasks: the makespan's cluster; one proxy
            # alone (the latency) never meets the limit, so it shares the stack.
            with stack_for(
                root,
                services,
                "two",
                sim_args=["--node-task-limit", str(CAP)],
                nodes=TWO_NODES,
                extra_env={"PROXYHUB_NODE_TASK_LIMIT": str(CAP)},
            ) as stack:
                stack.worker("bench", concurrency=1)
                out["simulatorCapacityRequestsPerSecond"] = round(simulator_capacity(stack.sim), 1)
                out["celery"] = measure_pings(stack, sizes)
                log(f"celery round trip p95 {out['celery']['p95Ms']} ms")
                if "latency" in only:
                    out["latency"] = measure_latency(stack, sizes)
                    log(f"latency: ratio {out['latency']['ratio']}")
                    log(f"latency: speed probe ms {out['latency']['speedProbeMs']}")
                    over = out["latency"]["overFloorMsByStage"]
                    log(
                        "latency: ms over the floor by stage (medians): "
                        + ", ".join(f"{stage} {ms:g}" for stage, ms in over.items())
                    )
                if "makespan" in only:
                    out["makespan"] = measure_makespan(stack, sizes)
                    log(f"makespan: ratio {out['makespan']['ratio']}")
                    log(f"makespan: speed probe ms {out['makespan']['speedProbeMs']}")
                    mk = out["makespan"]
                    log(
                        f"makespan: the worker ran step deliveries "
                        f"{mk['workerBusyShare']['median']} of the span, "
                        f"{mk['deliveriesPerCreate']['median']} per create, "
                        f"{mk['msPerDelivery']['median']} ms each (medians)"
                    )
                    log(
                        f"makespan: the template node's slots were "
                        f"{mk['templateNodeUtilisation']['median']} full until its last clone, "
                        f"{mk['templateNodeIdleMsPerTaskEnd']['median']} ms idle per task end, "
                        f"an end first looked at {mk['taskEndNoticedMs']['median']} ms after it "
                        f"(medians)"
                    )
                    # What the last run's deliveries did, the costliest kinds first.
                    for group in mk["runs"][-1]["worker"]["byCalls"][:5]:
                        log(
                            f"makespan: {group['deliveries']} deliveries, {group['seconds']} s "
                            f"({group['share']:.0%}): {group['calls']}"
                        )
                    if py_spy:
                        out.setdefault("profiles", {})
                        out["profiles"]["makespanWorker"] = profile_makespan(stack, sizes)
                        log("makespan: worker profiled (py-spy)")
        if "concurrency" in only:
            with stack_for(root, services, "conc") as stack:
                stack.worker("bench", concurrency=1)
                out["concurrency"] = measure_concurrency(stack, sizes)
                log(f"concurrency: {out['concurrency']['maxConcurrentCreates']} at once")
        if {"cluster", "changelist"} & set(only):
            with stack_for(root, services, "big") as stack:
                if "cluster" in only:
                    out["seed"] = seed_cluster(stack, sizes)
                    stack.worker("bench", concurrency=1)
                    out["reconcile"] = measure_round(
                        stack, "proxyhub.provisioning.reconcile", sizes.reconcile_proxies, sizes
                    )
                    log(f"reconcile: {out['reconcile']['seconds']}")
                    out["gc"] = measure_round(
                        stack, "proxyhub.provisioning.gc", sizes.reconcile_proxies, sizes
                    )
                    log(f"gc: {out['gc']['seconds']}")
                    if profile:
                        out.setdefault("profiles", {})
                        for target in ("reconcile", "gc"):
                            out["profiles"][target] = inside(stack, "profile", target)
                if "changelist" in only:
                    out["changelist"] = measure_changelist(stack, sizes)
                    log(f"changelist: {out['changelist']['ms']}")
                    if profile:
                        out.setdefault("profiles", {})
                        out["profiles"]["changelist"] = inside(stack, "profile", "changelist")
    return out


def figures(result: dict[str, Any], details: dict[str, Any]) -> dict[str, Figure]:
    """The issue's figures from a run's result (those whose part ran)."""
    values: dict[str, tuple[float | int | None, dict[str, Any]]] = {}
    if "latency" in result:
        lat = result["latency"]
        values["create_latency_ratio"] = (
            lat["ratio"]["median"],
            {
                "spread": lat["ratio"],
                "floorSeconds": lat["floorSeconds"],
                "wall": lat["wallSeconds"],
                "speedProbeMs": lat["speedProbeMs"],
            },
        )
        values["requests_per_create"] = (
            lat["requestsPerCreate"]["median"],
            {
                "spread": lat["requestsPerCreate"],
                "from": "the one-proxy latency runs, request to Running with an address",
            },
        )
        values["requests_per_create_with_release"] = (
            lat["requestsPerCreateWithRelease"]["median"],
            {
                "spread": lat["requestsPerCreateWithRelease"],
                "from": "the one-proxy latency runs, the seed's release after boot included",
            },
        )
    if "makespan" in result:
        mk = result["makespan"]
        values["makespan_ratio"] = (
            mk["ratio"]["median"],
            {
                "spread": mk["ratio"],
                "floorSeconds": mk["floorSeconds"],
                "wall": mk["wallSeconds"],
                "proxies": mk["proxies"],
                "nodeTaskLimit": mk["nodeTaskLimit"],
                "proxyhubPerNodeCap": mk["proxyhubPerNodeCapNote"],
                "exceededCap": mk["exceededCap"],
                "maxInflightPerNode": mk["maxInflightPerNode"],
                "secondsWaitingBelowCap": mk["secondsWaitingBelowCap"],
                "shareAtCapPerNode": mk["shareAtCapPerNode"],
                "workerBusyShare": mk["workerBusyShare"],
                "deliveriesPerCreate": mk["deliveriesPerCreate"],
                "msPerDelivery": mk["msPerDelivery"],
                "speedProbeMs": mk["speedProbeMs"],
            },
        )
    if "concurrency" in result:
        cc = result["concurrency"]
        values["concurrent_creates_one_worker"] = (
            cc["maxConcurrentCreates"],
            {"proxies": cc["proxies"], "wallSeconds": cc["wallSeconds"], "ratio": cc["ratio"]},
        )
        values["worker_peak_rss_mib"] = (
            cc["peakRssMiB"],
            {
                "largestProcessMiB": cc["peakRssLargestProcessMiB"],
                "pssMiB": cc.get("peakPssMiB"),
                "proxies": cc["proxies"],
            },
        )
    if "reconcile" in result:
        rc, seed = result["reconcile"], result["seed"]
        values["reconcile_requests_per_proxy"] = (
            rc["requestsPerProxy"]["median"],
            {"spread": rc["requestsPerProxy"], **seed},
        )
        values["reconcile_seconds"] = (
            rc["seconds"]["median"],
            {"spread": rc["seconds"], "floorSeconds": rc["floorSeconds"], **seed},
        )
    if "gc" in result:
        gc, seed = result["gc"], result["seed"]
        values["gc_sweep_requests"] = (gc["requests"]["median"], {"spread": gc["requests"], **seed})
        values["gc_sweep_seconds"] = (
            gc["seconds"]["median"],
            {"spread": gc["seconds"], "floorSeconds": gc["floorSeconds"], **seed},
        )
    if "changelist" in result:
        cl = result["changelist"]
        values["admin_changelist_queries"] = (
            cl["queries"]["median"],
            {"spread": cl["queries"], "proxies": cl["proxies"], "vendor": cl["vendor"]},
        )
        values["admin_changelist_ms"] = (
            cl["ms"]["median"],
            {"spread": cl["ms"], "proxies": cl["proxies"], "vendor": cl["vendor"]},
        )
    if "celery" in result and result["celery"]["p95Ms"] is not None:
        values["celery_roundtrip_ms_p95"] = (result["celery"]["p95Ms"], dict(result["celery"]))
    out = {}
    for name, (value, extra) in values.items():
        goal, unit, _ = GOALS[name]
        out[name] = Figure(value, goal, unit, {**details, **extra})
    return out


def meets(name: str, value: float | None) -> str:
    goal, _, how = GOALS[name]
    if goal is None or value is None:
        return ""
    ok = value <= goal if how == "at most" else value >= goal
    return "yes" if ok else "NO"


def table(figs: dict[str, Figure]) -> str:
    rows = [("figure", "value", "goal", "met", "median [min-max] of runs", "floor")]
    for name in GOALS:
        fig = figs.get(name)
        if fig is None:
            continue
        goal, unit, how = GOALS[name]
        spread_ = fig.details.get("spread")
        spread_text = (
            f"{spread_['median']:g} [{spread_['min']:g}-{spread_['max']:g}] x{spread_['runs']}"
            if isinstance(spread_, dict)
            else ""
        )
        floor = fig.details.get("floorSeconds")
        if isinstance(floor, dict):
            floor_text = f"{floor['median']:g} s"
        elif floor is not None:
            floor_text = f"{floor:g} s"
        else:
            floor_text = ""
        goal_text = f"{'<=' if how == 'at most' else '>='} {goal:g}" if goal is not None else "-"
        rows.append(
            (
                name,
                f"{fig.value:g} {unit}",
                goal_text,
                meets(name, fig.value),
                spread_text,
                floor_text,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one reconcile round, one GC plan and one changelist load (cProfile, "
        "in a child process) into the run's file",
    )
    parser.add_argument(
        "--py-spy",
        action="store_true",
        help="after the makespan runs, one more with py-spy sampling the worker: the share of "
        "its busy time in each of proxyhub's functions, into the run's file (needs ptrace)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results file (JSON)")
    parser.add_argument(
        "--no-latest", action="store_true", help="do not merge the figures into latest.json"
    )
    args = parser.parse_args(argv)
    why = spy.available() if args.py_spy else None
    if why is not None:
        parser.error(why)
    sizes = SIZES[args.size]
    started_at, commit, load_before = now_iso(), git_commit(), load_average()
    clock = time.monotonic()

    def log(text: str) -> None:
        print(f"[{time.monotonic() - clock:7.1f} s] {text}", flush=True)

    result = run_suite(sizes, args.only, log, profile=args.profile, py_spy=args.py_spy)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    details = {
        "size": args.size,
        "profile": PROFILE,
        "timeScale": TIME_SCALE,
        "cores": os.cpu_count(),
        "simulatorCapacityRequestsPerSecond": result.get("simulatorCapacityRequestsPerSecond"),
        "loadAverage": load_before,
    }
    figs = figures(result, details)
    report = {
        "benchmark": "suite",
        "size": args.size,
        "sizes": asdict(sizes),
        "date": started_at,
        "commit": commit,
        "machine": machine,
        "loadAverage": {"before": load_before, "after": load_average()},
        "seconds": round(time.monotonic() - clock, 1),
        "figures": {name: fig.value for name, fig in figs.items()},
        "result": result,
    }
    out = append_report(f"suite-{args.size}", report, args.out)
    print()
    print(table(figs))
    print(
        f"\n{os.cpu_count()} cores, load average {load_before} before, "
        f"simulator answers {result.get('simulatorCapacityRequestsPerSecond')} req/s alone; "
        f"took {report['seconds']} s"
    )
    if not args.no_latest:
        # Smoke sizes say the harness works; they are recorded apart from the real figures.
        full = args.size == "full"
        record_suite(
            figs,
            section="suite" if full else f"suite_{args.size}",
            flat=full,
            measured_at=started_at,
            commit=commit,
        )
    print(f"results appended to {shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
