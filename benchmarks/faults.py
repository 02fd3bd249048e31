"""Fault storm benchmark (issue 16): a fleet's create and delete with 20 % transient faults.

One stack as the integration tier starts it (tests/integration/itstack.py): the HTTPS simulator
on ``fast``, a PostgreSQL database and a Redis database of its own, and **one**
``celery -A proxyhub worker --concurrency 1`` with production settings; retries, backoffs and
ceilings are the product's defaults (nothing ``PROXYHUB_*`` is set but fleet.py's two poll
intervals). In that one run:

1. **calm**: ``proxies create --count 30`` to Running, then ``proxies delete`` until gone;
2. **storm**: the same with fresh names while the simulator fails 20 % of every endpoint's
   calls with transient faults (``READ_MIX`` and ``MUTATION_MIX``, below), the faults cleared
   only between the create and the delete to count the VMs, and after the delete.

``fault_create_ratio`` and ``fault_delete_ratio`` are the storm's convergence time over the calm
one (goal ≤ 2.0 each), each from the journal: the first operation's ``created_at`` to the last
one's ``finished_at``. Besides them: duplicate VMs (VMs per ``proxyhub-uid`` mark, read from the
simulator: 0), what is left after the delete (the fleet's VMs and seed ISOs: 0), requests per
proxy with and without faults, the faults the simulator injected (ledger entries with a fault),
``attempts``/``faults`` from the journal, and where the storm's time went (backoffs seen by
``observe.JournalWatch``, reads and steps retried in place from the worker log, the slowest
operations' steps).

    .venv/bin/python benchmarks/faults.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fleet import classify_request  # noqa: E402
from benchmarks.observe import (  # noqa: E402
    JournalWatch,
    backoff_summary,
    log_counts,
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
from tests.integration.itstack import (  # noqa: E402
    CLONE,
    Services,
    Simulator,
    Stack,
    StackError,
    running_stack,
)

TARGET_RATIO = 2.0  # issue 16
CALM, STORM = "calm", "storm"
FAULT_RATE = 0.20
MUTATIONS = ("POST", "PUT", "DELETE")
# The storm: (kind, share of the method's calls, applied). Each method's shares add up to 20 %;
# every rule has path=None, so every endpoint meets them. No "stall": that is a request timeout,
# not a transient fault, and would measure the timeout instead.
#   500    "can't lock file '...' - got timeout", the handler does not run
#   595    "Connection refused" from pveproxy, nothing done
#   596    "Connection timed out"; on mutations *after the work was applied*
#   reset  the connection closes before any answer, nothing done
#   drop   the work is applied, then the connection closes: the reply is lost
READ_MIX: tuple[tuple[str, float, bool], ...] = (
    ("500", 0.06, False),
    ("595", 0.04, False),
    ("596", 0.05, False),
    ("reset", 0.05, False),
)
MUTATION_MIX: tuple[tuple[str, float, bool], ...] = (
    ("500", 0.05, False),
    ("595", 0.03, False),
    ("reset", 0.03, False),
    ("596", 0.05, True),
    ("drop", 0.04, True),
)


def storm_rules() -> list[dict[str, Any]]:
    """The ``error_rate`` calls that make the storm.

    The simulator tries a call's rules in order and stops at the first that fires, so a rule
    after others only draws for calls they let through; its rate is its share divided by what
    is left, which makes every share exact and the total exactly ``FAULT_RATE``."""
    rules: list[dict[str, Any]] = []
    for methods, mix in ((("GET",), READ_MIX), (MUTATIONS, MUTATION_MIX)):
        for method in methods:
            left = 1.0
            for kind, share, applied in mix:
                rules.append(
                    {
                        "method": method,
                        "path": None,
                        "kind": kind,
                        "rate": share / left,
                        "applied": applied,
                    }
                )
                left -= share
    return rules


def storm_on(sim: Simulator) -> None:
    for rule in storm_rules():
        sim.control("error_rate", **rule)


def fleet_names(prefix: str, n: int) -> list[str]:
    width = len(str(n))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, n + 1)]


def _wait(stack: Stack, names: Sequence[str], phase: str, timeout: float) -> str | None:
    """``proxies wait``; the error's tail when the fleet did not get there."""
    try:
        stack.wait_phase(names, phase, timeout=timeout)
    except StackError as err:
        return str(err)[-2000:]
    return None


def vm_census(sim: Simulator, uids: set[str], prefix: str) -> dict[str, Any]:
    """The fleet's VMs (by mark uid or name) and seed ISOs, as the simulator holds them."""
    by_uid: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for vm in sim.vms():
        name = str(vm.get("name") or "")
        description = str(sim.vm_config(str(vm["node"]), int(vm["vmid"])).get("description", ""))
        uid = next(
            (
                line.split("=", 1)[1].strip()
                for line in description.splitlines()
                if line.startswith("proxyhub-uid=")
            ),
            "",
        )
        if uid in uids or name.startswith(f"proxy-{prefix}-"):
            by_uid[uid or f"unmarked:{name}"].append(
                {"vmid": int(vm["vmid"]), "node": vm["node"], "name": name}
            )
    seeds = [volid for _, volid in sim.seeds() if f"proxy-{prefix}-" in volid]
    return {
        "vms": sum(len(v) for v in by_uid.values()),
        "marks": len(by_uid),
        "duplicateVms": sum(len(v) - 1 for v in by_uid.values()),
        "duplicates": {uid: vms for uid, vms in by_uid.items() if len(vms) > 1},
        "seedIsos": len(seeds),
    }


def ledger_summary(entries: Sequence[dict[str, Any]], n: int) -> dict[str, Any]:
    kinds = Counter(classify_request(e) for e in entries)
    faulted = [e for e in entries if e.get("fault")]
    clones = Counter(
        str(e["params"].get("name")) for e in entries if e["key"] == CLONE and e["mutation"]
    )
    return {
        "total": len(entries),
        "perProxy": round(len(entries) / n, 2),
        "mutationsPerProxy": round(kinds["mutations"] / n, 2),
        "pollsPerProxy": round(kinds["polls"] / n, 2),
        "otherReadsPerProxy": round(kinds["other_reads"] / n, 2),
        "faultsInjected": len(faulted),
        "faultedShare": round(len(faulted) / len(entries), 3) if entries else None,
        "faultsByKind": dict(
            Counter(
                f"{e['fault']}{' (applied)' if e['mutation'] else ''} on {e['method']}"
                for e in faulted
            ).most_common()
        ),
        "perProxyWithoutFaulted": round((len(entries) - len(faulted)) / n, 2),
        "clonesAppliedMaxPerVm": max(clones.values(), default=0),
        "byEndpoint": dict(Counter(str(e["key"]) for e in entries).most_common()),
    }


def journal_summary(
    ops: Sequence[dict[str, Any]], watch: JournalWatch, start: float, end: float, prefix: str
) -> dict[str, Any]:
    """attempts and faults per operation, step durations, and the slowest operations."""
    faults = [int(op["faults"]) for op in ops]
    seen_attempts = [watch.max_attempts.get(op["id"], 0) for op in ops]
    durations = [
        op["finishedAt"] - op["createdAt"] for op in ops if op["finishedAt"] and op["createdAt"]
    ]
    steps: defaultdict[str, list[float]] = defaultdict(list)
    for op in ops:
        for step in op["steps"]:
            if step["finishedAt"] and step["startedAt"]:
                steps[step["name"]].append(step["finishedAt"] - step["startedAt"])
    deliveries = watch.between(start, end, prefix)
    waits: defaultdict[str, float] = defaultdict(float)
    for d in deliveries:
        if d.outcome == "backoff":
            waits[d.operation] += d.delay or 0.0
    slowest = sorted(
        ops, key=lambda op: (op["finishedAt"] or float("inf")) - op["createdAt"], reverse=True
    )[:5]
    return {
        "states": dict(Counter(op["state"] for op in ops)),
        "faultsMax": max(faults, default=0),
        "faultsMean": round(statistics.mean(faults), 2) if faults else 0.0,
        "faultsTotal": sum(faults),
        # ``attempts`` is failures in a row and returns to 0 when a step succeeds: its value at
        # the end says nothing, so the most the watch saw while the run went on is reported.
        "attemptsAtEndMax": max((int(op["attempts"]) for op in ops), default=0),
        "attemptsSeenMax": max(seen_attempts, default=0),
        "attemptsSeenMean": round(statistics.mean(seen_attempts), 2) if seen_attempts else 0.0,
        "operationSeconds": {
            "min": round(min(durations), 2) if durations else None,
            "median": round(statistics.median(durations), 2) if durations else None,
            "max": round(max(durations), 2) if durations else None,
        },
        "stepSecondsMean": {
            name: round(statistics.mean(values), 3) for name, values in sorted(steps.items())
        },
        "deliveriesSeen": dict(Counter(d.outcome for d in deliveries)),
        "backoffs": backoff_summary(deliveries),
        "slowest": [
            {
                "proxy": op["proxyName"],
                "state": op["state"],
                "seconds": round(op["finishedAt"] - op["createdAt"], 2)
                if op["finishedAt"]
                else None,
                "faults": op["faults"],
                "attemptsSeenMax": watch.max_attempts.get(op["id"], 0),
                "backoffSeconds": round(waits.get(op["id"], 0.0), 2),
                "lastError": op["lastError"][:300],
                "steps": [
                    [
                        s["name"],
                        s["state"],
                        round(s["finishedAt"] - s["startedAt"], 2) if s["finishedAt"] else None,
                        s["message"][:200] if s["state"] not in ("succeeded",) else "",
                    ]
                    for s in op["steps"]
                ],
            }
            for op in slowest
        ],
    }


def lifecycle(
    stack: Stack,
    prefix: str,
    n: int,
    *,
    storm: bool,
    timeout: float,
    watch: JournalWatch,
    worker_log_path: Path,
) -> dict[str, Any]:
    """Create ``n`` proxies to Running and delete them, the storm on or not; see the module
    docstring for what is measured."""
    names = fleet_names(prefix, n)
    if storm:
        storm_on(stack.sim)
    seq0, t0 = stack.sim.last_seq(), time.time()
    stack.create_proxies("--count", str(n), "--prefix", prefix, timeout=600)
    create_error = _wait(stack, names, "Running", timeout)
    seq1, t1 = stack.sim.last_seq(), time.time()
    if storm:
        stack.sim.control("clear_faults")  # the census below reads the truth, unfaulted
    create_timing = stack.probe("timing", f"{prefix}-")
    create_ops = stack.probe("operations", f"{prefix}-", "--kind", "create")
    rows = stack.proxies(f"{prefix}-")
    uids = {str(r["uid"]) for r in rows}
    after_create = vm_census(stack.sim, uids, prefix)

    if storm:
        storm_on(stack.sim)
    seq2, t2 = stack.sim.last_seq(), time.time()
    stack.manage("proxies", "delete", *[r["name"] for r in rows], timeout=600)
    delete_error = _wait(stack, names, "Deleted", timeout)
    seq3, t3 = stack.sim.last_seq(), time.time()
    if storm:
        stack.sim.control("clear_faults")
    delete_timing = stack.probe("timing", f"{prefix}-", "--kind", "delete")
    delete_ops = stack.probe("operations", f"{prefix}-", "--kind", "delete")
    after_delete = vm_census(stack.sim, uids, prefix)

    entries = stack.sim.ledger(after=seq0)
    log = worker_log(worker_log_path)

    def span(timing: dict[str, Any]) -> float | None:
        if timing["firstCreated"] is None or timing["lastFinished"] is None:
            return None
        return round(float(timing["lastFinished"]) - float(timing["firstCreated"]), 3)

    def window(timing: dict[str, Any], start: float, end: float) -> tuple[float, float]:
        """The journal's span when there is one: the commands' start-up and the wait's last
        poll are not the worker's time."""
        if timing["firstCreated"] is None or timing["lastFinished"] is None:
            return start, end
        return float(timing["firstCreated"]), float(timing["lastFinished"])

    return {
        "prefix": prefix,
        "storm": storm,
        "proxies": n,
        "create": {
            "seconds": span(create_timing) if create_error is None else None,
            "converged": create_error is None,
            "error": create_error,
            "journal": journal_summary(create_ops, watch, t0, t1, f"{prefix}-"),
            "requests": ledger_summary([e for e in entries if seq0 < e["seq"] <= seq1], n),
            "workerLog": log_counts(log, *window(create_timing, t0, t1)),
            "census": after_create,
        },
        "delete": {
            "seconds": span(delete_timing) if delete_error is None else None,
            "converged": delete_error is None,
            "error": delete_error,
            "journal": journal_summary(delete_ops, watch, t2, t3, f"{prefix}-"),
            "requests": ledger_summary([e for e in entries if seq2 < e["seq"] <= seq3], n),
            "workerLog": log_counts(log, *window(delete_timing, t2, t3)),
            "leftovers": after_delete,
        },
    }


def _ratio(storm: float | None, calm: float | None) -> float | None:
    if storm is None or not calm:
        return None
    return round(storm / calm, 2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--proxies", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes (prefork)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="as fleet.py")
    parser.add_argument("--address-poll", type=float, default=3.0, help="as fleet.py")
    parser.add_argument("--timeout", type=float, default=600, help="per create or delete, s")
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
    with (
        tempfile.TemporaryDirectory(prefix="proxyhub-faults-") as tmp,
        running_stack(
            Path(tmp),
            services=services,
            database=f"proxyhub_bench_faults_{os.getpid()}",
            profile="fast",
            settings_module="proxyhub.settings.production",
            extra_env=env,
        ) as stack,
    ):
        worker = stack.worker("faults", concurrency=args.concurrency)
        with JournalWatch(stack.env["DATABASE_URL"], [f"{CALM}-", f"{STORM}-"]) as watch:
            calm = lifecycle(
                stack,
                CALM,
                args.proxies,
                storm=False,
                timeout=args.timeout,
                watch=watch,
                worker_log_path=worker.log,
            )
            storm = lifecycle(
                stack,
                STORM,
                args.proxies,
                storm=True,
                timeout=args.timeout,
                watch=watch,
                worker_log_path=worker.log,
            )
        watch_error = watch.error
    load_after = load_average()

    create_ratio = _ratio(storm["create"]["seconds"], calm["create"]["seconds"])
    delete_ratio = _ratio(storm["delete"]["seconds"], calm["delete"]["seconds"])
    duplicates = (
        calm["create"]["census"]["duplicateVms"] + storm["create"]["census"]["duplicateVms"]
    )
    leftovers = sum(
        run["delete"]["leftovers"]["vms"] + run["delete"]["leftovers"]["seedIsos"]
        for run in (calm, storm)
    )
    report = {
        "benchmark": "faults",
        "date": started,
        "commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "loadAverage": {"before": load_before, "after": load_after},
        "profile": "fast",
        "workerConcurrency": args.concurrency,
        "pollIntervalSeconds": args.poll_interval,
        "addressPollSeconds": args.address_poll,
        "retrySettings": "product defaults (no PROXYHUB_* retry, backoff or ceiling set)",
        "storm": {
            "rate": FAULT_RATE,
            "reads": [list(m) for m in READ_MIX],
            "mutations": [list(m) for m in MUTATION_MIX],
            "rules": storm_rules(),
        },
        "faultCreateRatio": create_ratio,
        "faultDeleteRatio": delete_ratio,
        "target": TARGET_RATIO,
        "duplicateVms": duplicates,
        "leftoversAfterDelete": leftovers,
        "journalWatchError": watch_error,
        "calm": calm,
        "storm_run": storm,
    }
    out = append_report("faults", report, args.out)
    details = {
        "proxies": args.proxies,
        "workerConcurrency": args.concurrency,
        "loadAverage": load_before,
        "stormRate": FAULT_RATE,
    }
    knobs = variant(
        n=(args.proxies, 30),
        concurrency=(args.concurrency, 1),
        poll=(args.poll_interval, 1.0),
        address=(args.address_poll, 3.0),
    )
    if not args.no_latest:
        record_latest(
            {
                f"fault_create_ratio{knobs}": Figure(
                    create_ratio,
                    TARGET_RATIO,
                    "x",
                    {
                        **details,
                        "calmSeconds": calm["create"]["seconds"],
                        "stormSeconds": storm["create"]["seconds"],
                    },
                ),
                f"fault_delete_ratio{knobs}": Figure(
                    delete_ratio,
                    TARGET_RATIO,
                    "x",
                    {
                        **details,
                        "calmSeconds": calm["delete"]["seconds"],
                        "stormSeconds": storm["delete"]["seconds"],
                    },
                ),
                f"fault_duplicate_vms{knobs}": Figure(duplicates, 0, "VMs", details),
                f"fault_leftovers_after_delete{knobs}": Figure(
                    leftovers, 0, "VMs and seed ISOs", details
                ),
            },
            measured_at=started,
            commit=commit,
        )

    for run in (calm, storm):
        c, d = run["create"], run["delete"]
        w = c["workerLog"]
        print(
            f"{run['prefix']:>5}: create: worker busy {w['busyShare']} of the time, "
            f"{w['deliveries']} deliveries, slept {w['readRetryPauseSeconds']} s before reads "
            f"sent again and ~{w['inPlacePauseSecondsExpected']} s before "
            f"{w['stepsRetriedInPlace']} steps run again in place; "
            f"{c['journal']['backoffs']['failedDeliveries']} deliveries failed and backed off "
            f"{c['journal']['backoffs']['backoffSecondsTotal']} s in all"
        )
        print(
            f"{run['prefix']:>5}: create {c['seconds']} s ({c['requests']['perProxy']} req/proxy, "
            f"{c['requests']['faultsInjected']} faults injected, journal faults max "
            f"{c['journal']['faultsMax']} mean {c['journal']['faultsMean']}, attempts seen max "
            f"{c['journal']['attemptsSeenMax']}); delete {d['seconds']} s "
            f"({d['requests']['perProxy']} req/proxy, {d['requests']['faultsInjected']} faults "
            f"injected, journal faults max {d['journal']['faultsMax']} mean "
            f"{d['journal']['faultsMean']})"
        )
        for what in (c, d):
            if what["error"]:
                print(f"       did not converge: {what['error'][:500]}")
    print(
        f"fault_create_ratio {create_ratio} (goal <= {TARGET_RATIO}), fault_delete_ratio "
        f"{delete_ratio} (goal <= {TARGET_RATIO}); duplicate VMs {duplicates}; left after "
        f"delete {leftovers}; load average {load_before} -> {load_after}"
    )
    print(f"results appended to {shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
