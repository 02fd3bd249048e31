"""What the benchmarks watch while a run goes on: the journal as it changes, and the worker log.

The journal's final rows say how an operation ended, not what happened on the way: a step that
failed and waited out a backoff leaves ``attempts`` back at 0 once it succeeds. So
``JournalWatch`` reads the operations (and the clusters' circuit breakers) straight from the
stack's PostgreSQL database every ``interval`` seconds, with one cheap query each, and keeps what
changed. Every delivery that ran or deferred a step gives the operation a new dispatch token, so
each new token seen is one delivery, classified by what it left behind:

* ``deferred``: the cluster's breaker was open (``last_error`` starts with ``deferred:``);
* ``backoff``: the step failed transiently and waits ``next_step_at - dispatched_at`` (the
  backoff the policy drew) before it runs again;
* ``step``: the step ran and the operation goes on (a task or boot still running, or the next
  stage); ``finished``: it ended.

A delivery whose token was replaced again within one interval is missed, so counts are lower
bounds; backoffs and deferrals last at least half a second and are not missed at the default
0.25 s. The watch reads; it never writes.

``worker_log`` reads the worker's JSON log lines (proxyhub.logging.JsonFormatter): each line a
task logs carries its ``task_id``, each Proxmox call its cluster, and Celery's own line for
every finished delivery its run time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

_OPERATIONS = """
    SELECT o.id::text, o.proxy_name, o.kind, o.state, o.attempts, o.faults, o.dispatch_token,
           o.dispatched_at, o.next_step_at, o.last_error, c.name
    FROM provisioning_operation o LEFT JOIN provisioning_cluster c ON c.id = o.cluster_id
    WHERE o.proxy_name LIKE ANY(%s)
"""
_BREAKERS = """
    SELECT c.name, b.state, b.failures, b.open_seconds, b.retry_at, b.times_opened, b.last_error
    FROM provisioning_circuitbreaker b JOIN provisioning_cluster c ON c.id = b.cluster_id
"""
_FINISHED = ("succeeded", "failed")


@dataclass
class Delivery:
    """One delivery of one operation's step, as the journal showed it afterwards."""

    time: float  # when the watch first saw it (time.time())
    operation: str
    proxy: str
    kind: str
    cluster: str | None
    outcome: str  # deferred | backoff | step | finished
    attempts: int
    faults: int
    delay: float | None  # seconds until the next delivery is due
    error: str

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class BreakerChange:
    time: float
    cluster: str
    state: str
    failures: int
    open_seconds: float
    retry_in: float | None  # seconds from ``time`` until a probe may go
    times_opened: int
    last_error: str

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class JournalWatch:
    """Polls the journal of the operations whose proxy names start with ``prefixes``."""

    database_url: str
    prefixes: Sequence[str]
    interval: float = 0.25
    deliveries: list[Delivery] = field(default_factory=list)
    breakers: list[BreakerChange] = field(default_factory=list)
    max_attempts: dict[str, int] = field(default_factory=dict)
    polls: int = 0
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _last_breaker: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    error: str | None = None

    def __enter__(self) -> JournalWatch:
        self._thread = threading.Thread(target=self._run, name="journal-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def between(self, start: float, end: float, prefix: str = "") -> list[Delivery]:
        with self._lock:
            return [
                d for d in self.deliveries if start <= d.time <= end and d.proxy.startswith(prefix)
            ]

    def _run(self) -> None:
        import psycopg

        patterns = [f"{p}%" for p in self.prefixes]
        try:
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                while not self._stop.is_set():
                    started = time.monotonic()
                    now = time.time()
                    rows = conn.execute(_OPERATIONS, (patterns,)).fetchall()
                    breakers = conn.execute(_BREAKERS).fetchall()
                    with self._lock:
                        self._operations(rows, now)
                        self._breakers(breakers, now)
                        self.polls += 1
                    self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
        except Exception as err:  # the run goes on; the report says the watch stopped
            self.error = f"{type(err).__name__}: {err}"

    def _operations(self, rows: Iterable[tuple[Any, ...]], now: float) -> None:
        for (
            op_id,
            proxy,
            kind,
            state,
            attempts,
            faults,
            token,
            dispatched,
            due,
            error,
            cluster,
        ) in rows:
            self.max_attempts[op_id] = max(self.max_attempts.get(op_id, 0), attempts)
            key = (op_id, token if state not in _FINISHED else "finished")
            if not token or key in self._seen:
                continue
            self._seen.add(key)
            error = error or ""
            delay = (due - dispatched).total_seconds() if due and dispatched else None
            if state in _FINISHED:
                outcome = "finished"
            elif error.startswith("deferred:"):
                outcome = "deferred"
            elif attempts > 0:
                outcome = "backoff"
            else:
                outcome = "step"
            self.deliveries.append(
                Delivery(now, op_id, proxy, kind, cluster, outcome, attempts, faults, delay, error)
            )

    def _breakers(self, rows: Iterable[tuple[Any, ...]], now: float) -> None:
        for cluster, state, failures, open_seconds, retry_at, opened, error in rows:
            key = (state, failures, open_seconds, retry_at, opened)
            if self._last_breaker.get(cluster) == key:
                continue
            self._last_breaker[cluster] = key
            retry_in = (retry_at.timestamp() - now) if retry_at is not None else None
            self.breakers.append(
                BreakerChange(
                    now,
                    cluster,
                    state,
                    failures,
                    float(open_seconds),
                    round(retry_in, 2) if retry_in is not None else None,
                    opened,
                    (error or "")[:200],
                )
            )


def backoff_summary(deliveries: Sequence[Delivery]) -> dict[str, Any]:
    """How many deliveries failed and waited, and how long the waits were."""
    waits = [d.delay or 0.0 for d in deliveries if d.outcome == "backoff"]
    per_op: Counter[str] = Counter()
    seconds: defaultdict[str, float] = defaultdict(float)
    for d in deliveries:
        if d.outcome == "backoff":
            per_op[d.proxy] += 1
            seconds[d.proxy] += d.delay or 0.0
    return {
        "failedDeliveries": len(waits),
        "backoffSecondsTotal": round(sum(waits), 2),
        "backoffSecondsMax": round(max(waits), 2) if waits else 0.0,
        "backoffSecondsMean": round(sum(waits) / len(waits), 2) if waits else 0.0,
        "mostFailedDeliveriesOneOperation": max(per_op.values(), default=0),
        "mostBackoffSecondsOneOperation": round(max(seconds.values(), default=0.0), 2),
        "errors": dict(
            Counter(_error_shape(d.error) for d in deliveries if d.outcome == "backoff")
        ),
    }


def _error_shape(error: str) -> str:
    """An error text without its ids, so equal failures count together."""
    text = re.sub(r"UPID:\S+", "UPID:…", error)
    text = re.sub(r"\b\d{3,}\b", "N", text)
    return text[:160]


# --- the worker log ------------------------------------------------------------------------

# provisioning.services.driver.IN_PLACE_PAUSE_SECONDS (not imported: it needs Django set up).
IN_PLACE_PAUSE_SECONDS = 0.1
_SUCCEEDED = re.compile(r"succeeded in ([0-9.]+)s")
# Celery's "succeeded" line carries the task's kwargs as their repr.
_OPERATION_ARG = re.compile(r"'operation_id': '([0-9a-f-]+)'")


def worker_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a worker log, each with ``t`` (epoch seconds) added; other lines (a
    traceback Celery printed itself) are skipped."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        try:
            line["t"] = datetime.fromisoformat(str(line["ts"])).timestamp()
        except (KeyError, ValueError):
            continue
        out.append(line)
    return out


def deliveries_from_log(lines: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """task id → {"operation", "runtime" (seconds), "end" (epoch), "clusters" ({name: Proxmox
    calls}), "calls" (the calls' names in order, a failed one marked ``!``), "failed" (calls
    that got no answer), "failedSeconds"}, for every step delivery that finished in the log.
    Celery's line for a finished delivery carries its arguments, so every delivery is
    attributed to its operation, those that only deferred included."""
    tasks: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "operation": None,
            "runtime": None,
            "end": None,
            "clusters": Counter(),
            "calls": [],
            "failed": 0,
            "failedSeconds": 0.0,
        }
    )
    for line in lines:
        task = line.get("task_id")
        if not task or line.get("task_name") != "proxyhub.provisioning.step":
            continue
        entry = tasks[task]
        message = str(line.get("message", ""))
        cluster = line.get("cluster")
        if cluster and message.startswith("proxmox api call"):
            entry["clusters"][cluster] += 1
            failed = message == "proxmox api call failed"
            entry["calls"].append(f"{line.get('call') or '?'}{'!' if failed else ''}")
            if failed:
                entry["failed"] += 1
                entry["failedSeconds"] += float(line.get("duration") or 0.0)
        found = _SUCCEEDED.search(message)
        if found:
            entry["runtime"] = float(found.group(1))
            entry["end"] = line["t"]
            data = line.get("data")
            kwargs = str(data.get("kwargs", "")) if isinstance(data, dict) else ""
            op = _OPERATION_ARG.search(kwargs)
            entry["operation"] = op.group(1) if op else None
    return {k: v for k, v in tasks.items() if v["runtime"] is not None}


def deliveries_by_calls(
    lines: Sequence[dict[str, Any]], start: float, end: float, top: int = 12
) -> list[dict[str, Any]]:
    """The step deliveries that ended between ``start`` and ``end``, grouped by the Proxmox
    calls each made (``"node_tasks,start"``; ``"(none)"`` for one that made none: a deferral, a
    slot wait, a stale message), the groups that took most of the worker's time first: what a
    makespan's worker spent its span on, by what the deliveries did (README, "The worker's
    side"). Each group: ``calls``, ``deliveries``, ``seconds``, ``share`` of all those
    deliveries' seconds."""
    ended = [
        d
        for d in deliveries_from_log(lines).values()
        if d["end"] is not None and start <= d["end"] <= end
    ]
    total = sum(d["runtime"] for d in ended)
    groups: dict[str, list[float]] = defaultdict(list)
    for d in ended:
        groups[",".join(d["calls"]) or "(none)"].append(d["runtime"])
    ranked = sorted(groups.items(), key=lambda item: (-sum(item[1]), item[0]))
    return [
        {
            "calls": calls,
            "deliveries": len(runtimes),
            "seconds": round(sum(runtimes), 2),
            "share": round(sum(runtimes) / total, 3) if total else None,
        }
        for calls, runtimes in ranked[:top]
    ]


def log_counts(lines: Sequence[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """What the worker logged between ``start`` and ``end``: step deliveries and the seconds
    they ran (``busyShare``: that over the window; near 1, one worker process was rarely idle,
    which alone does not say its throughput set the pace: README, "The worker's side"), Proxmox
    calls (and those that failed), reads the seam sent again and the pauses it slept before
    them, steps run again in the same delivery."""
    window = [line for line in lines if start <= line["t"] <= end]
    messages = Counter(str(line.get("message", "")) for line in window)
    pauses = [
        float(line.get("pause") or 0.0)
        for line in window
        if line.get("message") == "proxmox api read retried"
    ]
    # The driver sleeps IN_PLACE_PAUSE_SECONDS * (n + 1) * uniform(0.5, 1.5) before the n-th
    # run again of a step in one delivery (n from 0); the pause is not logged, so its expected
    # value is summed, counting the retries of each delivery in order.
    in_place: Counter[str] = Counter(
        str(line.get("task_id"))
        for line in window
        if line.get("message") == "step retried in place"
    )
    in_place_pause = sum(IN_PLACE_PAUSE_SECONDS * k * (k + 1) / 2 for k in in_place.values())
    runtimes = [
        float(found.group(1))
        for line in window
        if line.get("task_name") == "proxyhub.provisioning.step"
        and (found := _SUCCEEDED.search(str(line.get("message", ""))))
    ]
    return {
        "deliveries": len(runtimes),
        "deliverySeconds": round(sum(runtimes), 2),
        "busyShare": round(sum(runtimes) / (end - start), 3) if end > start else None,
        "msPerDelivery": round(1000 * sum(runtimes) / len(runtimes), 1) if runtimes else None,
        "proxmoxCalls": messages["proxmox api call"] + messages["proxmox api call failed"],
        "proxmoxCallsFailed": messages["proxmox api call failed"],
        "readsRetried": messages["proxmox api read retried"],
        "readRetryPauseSeconds": round(sum(pauses), 2),
        "stepsRetriedInPlace": messages["step retried in place"],
        "inPlacePauseSecondsExpected": round(in_place_pause, 2),
    }
