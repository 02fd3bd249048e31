"""Cluster isolation benchmark (issue 10): an unreachable cluster must not slow another's creates.

Issue 10's target: one cluster unreachable for 5 minutes does not slow another cluster's creates
by more than 10 % (``isolation_ratio`` ≤ 1.10).

One stack as the integration tier starts it (tests/integration/itstack.py): the HTTPS simulator
on ``fast`` (cluster ``pvesim``, the good one), PostgreSQL, Redis and **one**
``celery -A proxyhub worker --concurrency 1`` (the hard case: every slot a dead cluster takes is
the only slot) with production settings and the product's defaults for timeouts, retries and
the circuit breaker. The second cluster, ``blackhole``, is a copy of the simulator's catalogue
whose ``url`` is a loopback black hole (benchmarks/blackhole.py): it accepts TCP, completes TLS
with the simulator's certificate and never answers, so each request to it waits out
``requestTimeoutSeconds`` (30 s by default), the expensive kind of unreachable.

1. **(a) baseline**: ``--baseline-rounds`` rounds of a good fleet (``proxies create --count 20``
   on ``pvesim`` to Running, then deleted), the bad cluster idle;
2. **(b) outage**: ``proxies create --count 10`` on ``blackhole`` at the start of a 5-minute
   window, then good rounds back to back, as many as start inside the window.

A round's create time is fleet.py's: from the first create operation's ``created_at`` to the
last one's ``finished_at``, from the journal. ``isolation_ratio`` = a round's time in (b) over
the mean of (a), per round and overall (mean of (b) over mean of (a)). Also reported: the bad
cluster's circuit breaker over time (``observe.JournalWatch`` reads
``provisioning_circuitbreaker``), the deliveries that went to the bad cluster (from the journal
watch, the worker log and the black hole's own count of connections), and the worker seconds
they held.

    .venv/bin/python benchmarks/isolation.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.blackhole import BlackHole  # noqa: E402
from benchmarks.faults import fleet_names  # noqa: E402
from benchmarks.observe import (  # noqa: E402
    JournalWatch,
    deliveries_from_log,
    worker_log,
)
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
from tests.integration.itstack import Services, Stack, StackError, running_stack  # noqa: E402

TARGET_RATIO = 1.10  # issue 10
GOOD, BAD = "pvesim", "blackhole"
BAD_PREFIX = "dark"


def bad_catalogue(source: Path, url: str, out: Path) -> Path:
    """The simulator's catalogue under another name and the black hole's URL; token and CA
    stay the simulator's (the black hole presents the simulator's certificate)."""
    document = yaml.safe_load(source.read_text())
    document["name"] = BAD
    document["url"] = url
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def _create(stack: Stack, prefix: str, n: int, cluster: str) -> None:
    stack.create_proxies("--count", str(n), "--prefix", prefix, cluster=cluster, timeout=600)


def good_round(stack: Stack, prefix: str, n: int, *, timeout: float, t_zero: float) -> dict:
    """One good fleet: created to Running (timed from the journal), then deleted."""
    names = fleet_names(prefix, n)
    seq0, started = stack.sim.last_seq(), time.time()
    _create(stack, prefix, n, GOOD)
    error = None
    try:
        stack.wait_phase(names, "Running", timeout=timeout)
    except StackError as err:
        error = str(err)[-2000:]
    timing = stack.probe("timing", f"{prefix}-")
    requests = len(stack.sim.ledger(after=seq0))
    seconds = None
    if error is None and timing["firstCreated"] and timing["lastFinished"]:
        seconds = round(float(timing["lastFinished"]) - float(timing["firstCreated"]), 3)
    stack.manage("proxies", "delete", *names, timeout=600)
    delete_error = None
    try:
        stack.wait_phase(names, "Deleted", timeout=timeout)
    except StackError as err:
        delete_error = str(err)[-2000:]
    return {
        "prefix": prefix,
        "proxies": n,
        "startOffsetSeconds": round(started - t_zero, 1),
        "createdOffsetSeconds": round(float(timing["firstCreated"]) - t_zero, 1)
        if timing["firstCreated"]
        else None,
        "createSeconds": seconds,
        "createStates": timing["states"],
        "createError": error,
        "createSpan": [timing["firstCreated"], timing["lastFinished"]],
        "requestsPerProxy": round(requests / n, 2),
        "deleteError": delete_error,
        "roundSeconds": round(time.time() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--proxies", type=int, default=20, help="good fleet size per round")
    parser.add_argument(
        "--bad-proxies",
        type=int,
        default=10,
        help="creates on the bad cluster; 0 makes a control run without an outage, which shows "
        "how far the rounds drift over the window by themselves",
    )
    parser.add_argument("--baseline-rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=300.0, help="outage window, seconds")
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes (prefork)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="as fleet.py")
    parser.add_argument("--address-poll", type=float, default=3.0, help="as fleet.py")
    parser.add_argument("--timeout", type=float, default=900, help="per round, seconds")
    parser.add_argument(
        "--tcp-only",
        action="store_true",
        help="the black hole never answers the TLS handshake either (fails at the 10 s connect "
        "timeout instead of the 30 s request timeout)",
    )
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
    load_before = load_average()
    started = now_iso()
    # The code that runs is the checkout's at the start; files edited meanwhile are not in it.
    commit = git_commit()
    baseline: list[dict[str, Any]] = []
    outage: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="proxyhub-isolation-") as tmp,
        running_stack(
            Path(tmp),
            services=services,
            database=f"proxyhub_bench_isolation_{os.getpid()}",
            profile="fast",
            settings_module="proxyhub.settings.production",
            extra_env=env,
        ) as stack,
    ):
        workdir = stack.sim.ca_file.parent
        # The simulator's server certificate is issued for 127.0.0.1 by the CA the catalogue
        # trusts, so the black hole's TLS handshake succeeds and the request itself hangs.
        cert = None if args.tcp_only else workdir / "server.pem"
        key = None if args.tcp_only else workdir / "server-key.pem"
        with BlackHole(cert_file=cert, key_file=key) as hole:
            catalogue = bad_catalogue(
                stack.sim.catalogue, f"https://{hole.host}:{hole.port}", Path(tmp) / "bad.yaml"
            )
            stack.manage("import_catalogue", str(catalogue))
            worker = stack.worker("isolation", concurrency=args.concurrency)
            with JournalWatch(stack.env["DATABASE_URL"], ["base", "out", BAD_PREFIX]) as watch:
                t_run = time.time()
                for k in range(1, args.baseline_rounds + 1):
                    baseline.append(
                        good_round(
                            stack, f"base{k}", args.proxies, timeout=args.timeout, t_zero=t_run
                        )
                    )
                    _progress("baseline", baseline[-1])
                t_out = time.time()
                if args.bad_proxies:  # 0: a control run, the same rounds with no outage
                    _create(stack, BAD_PREFIX, args.bad_proxies, BAD)
                k = 0
                while time.time() < t_out + args.window:
                    k += 1
                    outage.append(
                        good_round(
                            stack, f"out{k}", args.proxies, timeout=args.timeout, t_zero=t_out
                        )
                    )
                    _progress("outage", outage[-1])
                t_end = time.time()
                bad_ops = stack.probe("operations", f"{BAD_PREFIX}-")
            connections = hole.snapshot()
            log = worker_log(worker.log)
        watch_error = watch.error
    load_after = load_average()

    base_times = [r["createSeconds"] for r in baseline if r["createSeconds"] is not None]
    out_times = [r["createSeconds"] for r in outage if r["createSeconds"] is not None]
    base_mean = statistics.mean(base_times) if base_times else None
    for r in outage:
        r["isolationRatio"] = (
            round(r["createSeconds"] / base_mean, 2)
            if base_mean and r["createSeconds"] is not None
            else None
        )
    overall = (
        round(statistics.mean(out_times) / base_mean, 2)
        if base_mean and out_times and len(out_times) == len(outage)
        else None
    )
    worst = max((r["isolationRatio"] for r in outage if r["isolationRatio"]), default=None)

    # Deliveries to the bad cluster, three ways.
    dark = [d for d in watch.deliveries if d.proxy.startswith(f"{BAD_PREFIX}-")]
    bad_ids = {op["id"] for op in bad_ops}
    by_task = deliveries_from_log([line for line in log if t_out <= line["t"] <= t_end])
    bad_tasks = [t for t in by_task.values() if t["operation"] in bad_ids]
    called = [t for t in bad_tasks if t["clusters"].get(BAD)]
    good_tasks = [t for t in by_task.values() if t["operation"] not in bad_ids]
    every_task = deliveries_from_log(log)
    good_ops = {t["operation"] for t in every_task.values()} - bad_ids - {None}
    for r in baseline + outage:
        # What the one worker did while this round's fleet was created: the good fleet's
        # deliveries (their mean time shows a machine busy with other work), and the seconds
        # the bad cluster's deliveries took, which the good fleet could not have.
        first, last = r.pop("createSpan")
        if not (first and last):
            continue
        mine = [t for t in every_task.values() if t["operation"] in good_ops]
        busy = [t for t in mine if _overlap(t, first, last) > 0]
        r["goodDeliveriesDuringCreate"] = len(busy)
        r["goodDeliveryMsMean"] = (
            round(1000 * statistics.mean(t["runtime"] for t in busy), 1) if busy else None
        )
        r["badClusterWorkerSecondsDuringCreate"] = round(
            sum(_overlap(t, first, last) for t in every_task.values() if t["operation"] in bad_ids),
            1,
        )
    outage_span = t_end - t_out
    breaker = [
        {**b.as_dict(), "offsetSeconds": round(b.time - t_out, 1)}
        for b in watch.breakers
        if b.cluster == BAD
    ]
    bad_summary = {
        "proxies": args.bad_proxies,
        "blackHole": "tcp only (no TLS handshake)" if args.tcp_only else "TLS, then silence",
        "connections": len([c for c in connections if c.accepted >= t_out]),
        "connectionHeldSecondsMean": round(
            statistics.mean(c.held_seconds for c in connections if c.held_seconds), 1
        )
        if any(c.held_seconds for c in connections)
        else None,
        "deliveriesSeenByJournalWatch": dict(Counter(d.outcome for d in dark)),
        "deliveries": len(bad_tasks),
        "deliveriesThatCalledIt": len(called),
        "deliveriesDeferredWithoutCalling": len(bad_tasks) - len(called),
        "workerSecondsHeldByIt": round(sum(t["runtime"] for t in bad_tasks), 1),
        "workerSecondsOtherDeliveries": round(sum(t["runtime"] for t in good_tasks), 1),
        "deliveriesInOutage": len(by_task),
        "outageSeconds": round(outage_span, 1),
        "operations": dict(Counter(op["state"] for op in bad_ops)),
        "operationLastErrors": dict(Counter(op["lastError"][:160] for op in bad_ops)),
        "breaker": breaker,
    }
    report = {
        "benchmark": "isolation",
        "date": started,
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "loadAverage": {"before": load_before, "after": load_after},
        "profile": "fast",
        "workerConcurrency": args.concurrency,
        "pollIntervalSeconds": args.poll_interval,
        "addressPollSeconds": args.address_poll,
        "windowSeconds": args.window,
        "isolationRatio": overall,
        "isolationRatioWorstRound": worst,
        "target": TARGET_RATIO,
        "baselineMeanSeconds": round(base_mean, 3) if base_mean else None,
        "baseline": baseline,
        "outage": outage,
        "badCluster": bad_summary,
        "journalWatchError": watch_error,
    }
    out = append_report("isolation", report, args.out)
    details = {
        "proxies": args.proxies,
        "badProxies": args.bad_proxies,
        "workerConcurrency": args.concurrency,
        "windowSeconds": args.window,
        "baselineMeanSeconds": report["baselineMeanSeconds"],
        "outageRounds": [r["createSeconds"] for r in outage],
        "loadAverage": load_before,
    }
    knobs = variant(
        n=(args.proxies, 20),
        bad=(args.bad_proxies, 10),
        window=(args.window, 300.0),
        concurrency=(args.concurrency, 1),
        poll=(args.poll_interval, 1.0),
        address=(args.address_poll, 3.0),
        tcp=(int(args.tcp_only), 0),
    )
    if not args.no_latest:
        record_latest(
            {
                f"isolation_ratio{knobs}": Figure(overall, TARGET_RATIO, "x", details),
                f"isolation_ratio_worst_round{knobs}": Figure(worst, TARGET_RATIO, "x", details),
            },
            measured_at=started,
            commit=commit,
        )

    print(
        f"baseline {base_times} s (mean {base_mean and round(base_mean, 2)} s, good delivery ms "
        f"{[r.get('goodDeliveryMsMean') for r in baseline]}); outage rounds "
        f"(start, create s, ratio, bad cluster's worker s meanwhile, good delivery ms) "
        f"{[_row(r) for r in outage]}"
    )
    print(
        f"isolation_ratio {overall} (target <= {TARGET_RATIO}), worst round {worst}; bad cluster: "
        f"{bad_summary['connections']} connections to the black hole, "
        f"{bad_summary['deliveries']} deliveries of its operations, "
        f"{bad_summary['deliveriesThatCalledIt']} called it; they held the worker "
        f"{bad_summary['workerSecondsHeldByIt']} s of {bad_summary['outageSeconds']} s; journal "
        f"watch saw {bad_summary['deliveriesSeenByJournalWatch']}"
    )
    for b in breaker:
        print(
            f"  t+{b['offsetSeconds']:>6} s breaker {b['state']:<9} failures {b['failures']} "
            f"open {b['open_seconds']:g} s retry in {b['retry_in']} s"
        )
    print(f"load average {load_before} -> {load_after}; results appended to {shown(out)}")
    return 0


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        r["startOffsetSeconds"],
        r["createSeconds"],
        r["isolationRatio"],
        r["badClusterWorkerSecondsDuringCreate"],
        r["goodDeliveryMsMean"],
    )


def _overlap(task: dict[str, Any], first: float, last: float) -> float:
    end = float(task["end"])
    start = end - float(task["runtime"])
    return max(0.0, min(end, last) - max(start, first))


def _progress(phase: str, result: dict[str, Any]) -> None:
    print(
        f"  {phase} {result['prefix']}: start t+{result['startOffsetSeconds']} s, create "
        f"{result['createSeconds']} s{'' if not result['createError'] else ' (did not converge)'}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
