"""Fleet create benchmark: N proxies to Running with ONE worker process, against the floor.

For each N (default 20 and 200) a fresh stack is started exactly as the integration tier
starts it (tests/integration/itstack.py): the HTTPS simulator on the ``fast`` profile, a
PostgreSQL database of its own, a Redis database of its own, and one
``celery -A proxyhub worker --concurrency 1``. Settings are production's
(``proxyhub.settings.production``) with only the poll intervals given on the command line. Then:

* ``manage.py proxies create --count N`` is run;
* ``manage.py proxies wait --phase Running`` waits (every proxy Running with an address);
* the journal gives the exact span: from the first create operation's ``created_at`` (the
  proxies are written) to the last one's ``finished_at`` (the last address known);
* the simulator's ledger gives every request made meanwhile.

Reported per N: wall time, the floor (benchmarks/floor.py), their ratio, requests per proxy
(total, mutations, polls, other reads), the rate at which the simulator answered during the
run, its busy fraction, and a separate measure of how fast it can answer at all (so one can
see it was not the bottleneck).

    .venv/bin/python benchmarks/fleet.py                       # product defaults
    .venv/bin/python benchmarks/fleet.py --poll-interval 0.2 --address-poll 0.2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.floor import fleet_floor  # noqa: E402
from benchmarks.record import (  # noqa: E402
    Figure,
    append_report,
    git_commit,
    load_average,
    now_iso,
    record_latest,
    shown,
    variant,
)
from tests.integration.itstack import Services, Simulator, Stack, running_stack  # noqa: E402

PREFIX = "bench"
# The targets (README): ratio to the floor with one worker process, by fleet size.
TARGETS = {20: 3.0, 200: 4.0}

# Reads repeated while something runs: task status, VM status, the guest agent.
POLL_SUFFIXES = ("/tasks/{upid}/status", "/status/current")


def classify_request(entry: dict[str, Any]) -> str:
    key = str(entry.get("key") or "")
    if entry.get("mutation") or entry.get("method") in ("POST", "PUT", "DELETE"):
        return "mutations"
    if key.endswith(POLL_SUFFIXES) or "/agent/" in key:
        return "polls"
    return "other_reads"


def simulator_capacity(sim: Simulator, *, seconds: float = 2.0, threads: int = 4) -> float:
    """Requests per second the simulator answers for a cheap authenticated GET, from this
    process with ``threads`` keep-alive connections (its own ceiling, not proxyhub's)."""
    import requests

    count = 0
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def hammer() -> None:
        nonlocal count
        with requests.Session() as session:
            session.headers.update(sim.session.headers)
            done = 0
            while time.monotonic() < stop:
                session.get(f"{sim.url}/api2/json/version", verify=str(sim.ca_file), timeout=10)
                done += 1
        with lock:
            count += done

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return count / (time.monotonic() - started)


def run_one(
    stack: Stack, n: int, *, concurrency: int, timeout: float, time_scale: float
) -> dict[str, Any]:
    stack.worker("bench", concurrency=concurrency)
    template = stack.sim.info()["templateVmid"]
    template_node = next(str(v["node"]) for v in stack.sim.vms() if int(v["vmid"]) == int(template))
    before = stack.sim.last_seq()
    started = time.time()
    stack.create_proxies("--count", str(n), "--prefix", PREFIX, timeout=600)
    requested = time.time()
    stack.wait_phase(
        [f"{PREFIX}-{i:0{len(str(n))}d}" for i in range(1, n + 1)], "Running", timeout=timeout
    )
    timing = stack.probe("timing", f"{PREFIX}-")
    # From the moment the proxies were written (the first operation's creation) to the last
    # create's end; the CLI's own start-up is reported apart (createCommandSeconds).
    wall = float(timing["lastFinished"]) - float(timing["firstCreated"])
    entries = stack.sim.ledger(after=before)
    rows = stack.proxies(f"{PREFIX}-")
    placement = Counter(str(r["node"]) for r in rows)
    floor = fleet_floor(placement, template_node=template_node, time_scale=time_scale)
    kinds = Counter(classify_request(e) for e in entries)
    engine_span = (entries[-1]["time"] - entries[0]["time"]) if entries else 0.0
    busy = sum(float(e["duration"]) for e in entries)
    capacity = simulator_capacity(stack.sim)
    return {
        "proxies": n,
        "wallSeconds": round(wall, 3),
        "createCommandSeconds": round(requested - started, 3),
        "wallFromCommandStartSeconds": round(float(timing["lastFinished"]) - started, 3),
        "floorSeconds": round(floor.seconds, 3),
        "ratio": round(wall / floor.seconds, 2),
        "floor": {
            "criticalPath": round(floor.critical_path, 3),
            "templateNodeBound": round(floor.template_node_bound, 3),
            "otherNodeBound": round(floor.other_node_bound, 3),
            "formula": floor.formula,
            "templateNode": template_node,
            "placement": dict(sorted(placement.items())),
        },
        "journal": timing["states"],
        "requests": {
            "total": len(entries),
            "perProxy": round(len(entries) / n, 2),
            "mutationsPerProxy": round(kinds["mutations"] / n, 2),
            "pollsPerProxy": round(kinds["polls"] / n, 2),
            "otherReadsPerProxy": round(kinds["other_reads"] / n, 2),
            "byEndpoint": dict(Counter(str(e["key"]) for e in entries).most_common()),
        },
        "simulator": {
            "requestsPerSecondDuringRun": round(len(entries) / engine_span, 1)
            if engine_span
            else None,
            "busyFraction": round(busy / wall, 4) if wall else None,
            "capacityRequestsPerSecond": round(capacity, 1),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes (prefork)")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="PROXYHUB_POLL_INTERVAL_SECONDS (product default 1.0)",
    )
    parser.add_argument(
        "--address-poll",
        type=float,
        default=3.0,
        help="PROXYHUB_ADDRESS_POLL_SECONDS (product default 3.0)",
    )
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator --time-scale")
    parser.add_argument("--timeout", type=float, default=900, help="per N, seconds")
    parser.add_argument("--out", type=Path, default=None, help="results file (JSON)")
    parser.add_argument(
        "--no-latest", action="store_true", help="do not merge the figures into latest.json"
    )
    args = parser.parse_args(argv)

    services = Services.from_env()
    why = services.unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    env = {
        "PROXYHUB_POLL_INTERVAL_SECONDS": str(args.poll_interval),
        "PROXYHUB_ADDRESS_POLL_SECONDS": str(args.address_poll),
    }
    runs = []
    load_before = load_average()
    started = now_iso()
    # The code that runs is the checkout's at the start; files edited meanwhile are not in it.
    commit = git_commit()
    for n in args.counts:
        with (
            tempfile.TemporaryDirectory(prefix="proxyhub-bench-") as tmp,
            running_stack(
                Path(tmp),
                services=services,
                database=f"proxyhub_bench_{os.getpid()}",
                profile="fast",
                time_scale=args.time_scale,
                settings_module="proxyhub.settings.production",
                extra_env=env,
            ) as stack,
        ):
            result = run_one(
                stack,
                n,
                concurrency=args.concurrency,
                timeout=args.timeout,
                time_scale=args.time_scale,
            )
        runs.append(result)
        r, q, s = result, result["requests"], result["simulator"]
        print(
            f"{n:>4} proxies: {r['wallSeconds']:7.2f} s to Running, floor "
            f"{r['floorSeconds']:.2f} s, ratio {r['ratio']:.2f}x | requests/proxy "
            f"{q['perProxy']:.1f} (mutations {q['mutationsPerProxy']:.1f}, polls "
            f"{q['pollsPerProxy']:.1f}, other reads {q['otherReadsPerProxy']:.1f}) | simulator "
            f"{s['requestsPerSecondDuringRun']} req/s during the run, busy "
            f"{100 * (s['busyFraction'] or 0):.1f} %, capacity "
            f"{s['capacityRequestsPerSecond']:.0f} req/s"
        )
    report = {
        "benchmark": "fleet",
        "date": started,
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "loadAverage": {"before": load_before, "after": load_average()},
        "profile": "fast",
        "timeScale": args.time_scale,
        "workerConcurrency": args.concurrency,
        "pollIntervalSeconds": args.poll_interval,
        "addressPollSeconds": args.address_poll,
        "runs": runs,
    }
    out = append_report("fleet", report, args.out)
    # The headline figures are at the product's defaults; a run with other knobs records its
    # own names beside them rather than replacing them.
    knobs = variant(
        poll=(args.poll_interval, 1.0),
        address=(args.address_poll, 3.0),
        concurrency=(args.concurrency, 1),
        scale=(args.time_scale, 1.0),
    )
    if not args.no_latest:
        record_latest(
            {
                f"fleet_ratio_{r['proxies']}{knobs}": Figure(
                    r["ratio"],
                    TARGETS.get(r["proxies"]),
                    "x floor",
                    {
                        "wallSeconds": r["wallSeconds"],
                        "floorSeconds": r["floorSeconds"],
                        "requestsPerProxy": r["requests"]["perProxy"],
                        "workerConcurrency": args.concurrency,
                        "pollIntervalSeconds": args.poll_interval,
                        "addressPollSeconds": args.address_poll,
                        "timeScale": args.time_scale,
                        "loadAverage": load_before,
                    },
                )
                for r in runs
            },
            measured_at=started,
            commit=commit,
        )
    print(f"results appended to {shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
