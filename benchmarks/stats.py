"""The small statistics the suite reports (benchmarks/suite.py), kept apart so the fast tier can
check them (tests/unit/test_benchmarks.py) without a stack.

* ``spread``: median and range of repeated runs, so a reader can tell a change from noise;
* ``percentile``: nearest-rank percentile (p95 of the Celery round trips);
* ``max_overlap``: the most intervals open at one moment (creates one worker drove at once);
* ``inflight``: a node's tasks over time from the simulator's task timeline, against a cap;
* ``lanes_used``: how much of a node's cap its tasks filled while it still had clones to run;
* ``end_noticed``: how long after a task's end the first request that could tell it came;
* ``over_floor_by_stage``: where a lone create's time over its floor went, stage by stage;
* ``matched_difference``: two commits' runs compared at the same machine speed (``ab.py``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioning.proxmox.tasks import parse_upid


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of nothing")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def spread(values: Sequence[float], *, digits: int = 3) -> dict[str, Any]:
    """``{"median", "min", "max", "range", "runs", "values"}`` of repeated measurements."""
    if not values:
        raise ValueError("spread of nothing")
    low, high = min(values), max(values)
    return {
        "median": round(median(values), digits),
        "min": round(low, digits),
        "max": round(high, digits),
        "range": round(high - low, digits),
        "runs": len(values),
        "values": [round(v, digits) for v in values],
    }


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``pct`` % of values at or
    below it (p95 of 20 values is the 19th smallest)."""
    if not values:
        raise ValueError("percentile of nothing")
    if not 0 < pct <= 100:
        raise ValueError("pct must be in (0, 100]")
    ordered = sorted(values)
    rank = math.ceil(pct / 100 * len(ordered))
    return float(ordered[rank - 1])


def max_overlap(intervals: Iterable[tuple[float, float | None]]) -> int:
    """The most intervals ``[start, end)`` open at one moment (``end`` None: still open). An
    interval ending exactly when another starts does not overlap it."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        if end is not None:
            events.append((end, -1))
    # Ends before starts at the same instant.
    events.sort(key=lambda e: (e[0], e[1]))
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


@dataclass(frozen=True)
class NodeInflight:
    """One node's tasks over time: ``series`` is [(t, submitted and not ended, running)] at
    every change, ``t`` in seconds from the first task's submission."""

    node: str
    series: list[tuple[float, int, int]]
    max_inflight: int  # submitted to the node and not ended: what the client put on it
    max_running: int  # holding one of the node's slots
    exceeded_cap: bool  # more than ``cap`` submitted at once: the client did not hold back
    seconds_over_cap: float
    seconds_waiting: float  # some task of ours queued (in the client or the node)
    seconds_waiting_below_cap: float  # work waited while fewer than ``cap`` ran: a lost slot
    seconds_at_cap: float  # ``cap`` tasks (or more) ran: the node fully used
    seconds_busy: float  # at least one task ran
    seconds: float  # from ``origin`` to the end

    def running_seconds(self) -> float:
        """Task-seconds that ran on the node (the running count over ``series``, to the end)."""
        ends = [t for t, _, _ in self.series[1:]] + [self.seconds]
        return sum(r * (until - t) for (t, _, r), until in zip(self.series, ends, strict=True))

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "maxInflight": self.max_inflight,
            "maxRunning": self.max_running,
            "exceededCap": self.exceeded_cap,
            "secondsOverCap": round(self.seconds_over_cap, 3),
            "secondsWaiting": round(self.seconds_waiting, 3),
            "secondsWaitingBelowCap": round(self.seconds_waiting_below_cap, 3),
            "secondsAtCap": round(self.seconds_at_cap, 3),
            "secondsBusy": round(self.seconds_busy, 3),
            "seconds": round(self.seconds, 3),
            "series": [[round(t, 3), n, r] for t, n, r in self.series],
        }


def inflight(
    tasks: Sequence[Mapping[str, Any]],
    *,
    cap: int,
    origin: float | None = None,
    end: float | None = None,
    held_back: Sequence[tuple[str, float, float | None]] = (),
) -> dict[str, NodeInflight]:
    """Per node, from the simulator's task timeline (``/_sim/tasks``: ``node``, ``submitted``,
    ``startedAt``, ``endedAt``): how many tasks were on it and how many ran, over time.

    Work waited on a node when one of its tasks was submitted but not yet running (queued by
    the node), or when proxyhub held a step of it back: ``held_back`` lists (node, start, end)
    of those waits on the same clock (the journal's ``slot_wait`` steps); a held-back step
    counts as waiting, not as in flight. ``seconds_waiting_below_cap`` is the time work waited
    while fewer than ``cap`` tasks ran: zero means the node was at the cap whenever work
    waited. Steps proxyhub has not got to yet (a message still in the queue) are in neither:
    ``seconds_at_cap`` against the run's makespan shows how much of it the node was kept full.
    """
    if origin is None:
        origin = min((float(t["submitted"]) for t in tasks), default=0.0)
    out: dict[str, NodeInflight] = {}
    nodes = sorted({str(t["node"]) for t in tasks})
    for node in nodes:
        mine = [t for t in tasks if str(t["node"]) == node]
        stop = end if end is not None else max(_last_time(t) for t in mine)
        events: list[tuple[float, int, int, int]] = []  # time, d_inflight, d_running, d_queued
        for where, start, until in held_back:
            if where != node:
                continue
            events.append((float(start), 0, 0, 1))
            events.append((float(until) if until is not None else stop, 0, 0, -1))
        for t in mine:
            submitted = float(t["submitted"])
            started = t.get("startedAt")
            ended = t.get("endedAt")
            events.append((submitted, 1, 0, 1))
            if started is not None:
                events.append((float(started), 0, 1, -1))
            if ended is not None:
                events.append((float(ended), -1, -1 if started is not None else 0, 0))
        events.sort(key=lambda e: (e[0], e[1] + e[2]))
        series: list[tuple[float, int, int]] = []
        n = r = q = 0
        max_n = max_r = 0
        over = waiting = below = at_cap = busy = 0.0
        last = origin
        for at, dn, dr, dq in events:
            at = min(max(at, origin), stop)
            span = at - last
            if span > 0:
                if n > cap:
                    over += span
                if r >= cap:
                    at_cap += span
                if r > 0:
                    busy += span
                if q > 0:
                    waiting += span
                    if r < cap:
                        below += span
            last = at
            n, r, q = n + dn, r + dr, q + dq
            max_n, max_r = max(max_n, n), max(max_r, r)
            if series and series[-1][0] == at - origin:
                series[-1] = (at - origin, n, r)
            else:
                series.append((at - origin, n, r))
        out[node] = NodeInflight(
            node=node,
            series=series,
            max_inflight=max_n,
            max_running=max_r,
            exceeded_cap=max_n > cap,
            seconds_over_cap=over,
            seconds_waiting=waiting,
            seconds_waiting_below_cap=below,
            seconds_at_cap=at_cap,
            seconds_busy=busy,
            seconds=stop - origin,
        )
    return out


def _last_time(task: Mapping[str, Any]) -> float:
    return max(
        float(v)
        for v in (task.get("submitted"), task.get("startedAt"), task.get("endedAt"))
        if v is not None
    )


def lanes_used(
    tasks: Sequence[Mapping[str, Any]], *, node: str, cap: int, clone_type: str = "qmclone"
) -> dict[str, Any]:
    """How full ``node``'s ``cap`` task slots were from its first task to its last clone's
    submission, from the simulator's task timeline: in a capped fleet every create's clone runs
    on the template's node, so up to that moment there was always work for it and an empty slot
    is a transition proxyhub had not made yet (a task's end not noticed, the next one not yet
    submitted). ``utilisation``: task-seconds over slot-seconds; ``idleMsPerTaskEnd``: the idle
    slot time per task that ended in that window, what each transition cost on average."""
    mine = [t for t in tasks if str(t["node"]) == node and t.get("startedAt") is not None]
    clones = [float(t["submitted"]) for t in mine if t.get("type") == clone_type]
    if not mine or not clones:
        return {"seconds": 0.0, "utilisation": None, "idleMsPerTaskEnd": None, "taskEnds": 0}
    origin = min(float(t["startedAt"]) for t in mine)
    until = max(clones)
    window = inflight(mine, cap=cap, origin=origin, end=until)[node]
    busy, slots = window.running_seconds(), cap * window.seconds
    idle = max(0.0, slots - busy)
    ends = sum(1 for t in mine if t.get("endedAt") is not None and float(t["endedAt"]) <= until)
    return {
        "seconds": round(window.seconds, 3),
        "utilisation": round(busy / slots, 3) if slots > 0 else None,
        "idleMsPerTaskEnd": round(1000 * idle / ends, 1) if ends else None,
        "taskEnds": ends,
    }


# The requests that can tell proxyhub a task of ours ended (``end_noticed``): its node's task
# list, its own status, and for a start the VM's status (the start's end is its VM running).
_NODE_TASKS = "GET /nodes/{node}/tasks"
_TASK_STATUS = "GET /nodes/{node}/tasks/{upid}/status"
_VM_STATUS = "GET /nodes/{node}/qemu/{vmid}/status/current"


def end_noticed(
    tasks: Sequence[Mapping[str, Any]], entries: Sequence[Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """How long after each task's end the first request that could tell its end reached the
    simulator (its node's task list, its status, or for a ``qmstart`` its VM's status), by task
    type and for ``all``: ``n``, ``medianMs`` and ``p90Ms``. The other half of a slot's
    transition is the next submission; ``lanes_used`` gives the whole of it. ``entries``: the
    simulator's ledger of the run (``time``, ``key``, ``path_params``)."""
    looks: dict[str, list[float]] = defaultdict(list)
    for e in entries:
        key, params = e.get("key"), e.get("path_params") or {}
        node = str(params.get("node", ""))
        if key == _NODE_TASKS:
            looks[f"node:{node}"].append(float(e["time"]))
        elif key == _TASK_STATUS:
            looks[f"upid:{params.get('upid', '')}"].append(float(e["time"]))
        elif key == _VM_STATUS:
            looks[f"vm:{node}:{params.get('vmid', '')}"].append(float(e["time"]))
    for times in looks.values():
        times.sort()
    delays: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        if t.get("endedAt") is None:
            continue
        end, node, upid = float(t["endedAt"]), str(t["node"]), str(t["upid"])
        kinds = [f"node:{node}", f"upid:{upid}"]
        if t.get("type") == "qmstart":
            kinds.append(f"vm:{node}:{parse_upid(upid).id}")
        firsts = [_first_at_or_after(looks.get(kind, []), end) for kind in kinds]
        after = [f for f in firsts if f is not None]
        if after:
            delay = 1000 * (min(after) - end)
            delays[str(t.get("type", ""))].append(delay)
            delays["all"].append(delay)
    return {
        kind: {
            "n": len(values),
            "medianMs": round(median(values), 1),
            "p90Ms": round(percentile(values, 90), 1),
        }
        for kind, values in sorted(delays.items())
    }


def _first_at_or_after(ordered: Sequence[float], moment: float) -> float | None:
    at = bisect_left(ordered, moment)
    return ordered[at] if at < len(ordered) else None


# The time from the request to the first step's start, in ``over_floor_by_stage``.
BEFORE_FIRST_STEP = "before the first step"


def over_floor_by_stage(
    steps: Sequence[Sequence[Any]], floors: Mapping[str, float], *, until: str = "address"
) -> dict[str, float]:
    """Milliseconds each journal stage of one create took beyond its part of the floor
    (``floor.create_stages``; 0 for a stage with none), with the wait before the first step
    under ``BEFORE_FIRST_STEP``, up to and including stage ``until`` (the address: Running).
    ``steps``: ``[name, start, end]`` in seconds from the request (the suite's ``timeline``).
    The journal's stages follow one another, so the values add up to the create's time over
    its floor: what a latency run lost, and where."""
    if not steps:
        return {}
    spent: dict[str, float] = {BEFORE_FIRST_STEP: float(steps[0][1])}
    for name, start, end in steps:
        # A stage journalled twice (run again after a failure) counts its floor once.
        spent[str(name)] = spent.get(str(name), 0.0) + float(end) - float(start)
        if name == until:
            break
    return {name: round(1000 * (s - floors.get(name, 0.0)), 1) for name, s in spent.items()}


@dataclass(frozen=True)
class Matched:
    """Two sides' runs compared at one machine speed (``matched_difference``): ``difference`` is
    the new side's ratio minus the base's at the same speed probe, ``error`` its standard
    error; ``slope`` is how much a run's ratio grew per millisecond of probe on both sides."""

    difference: float
    error: float
    slope: float
    base_runs: int
    new_runs: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "difference": round(self.difference, 4),
            "error": round(self.error, 4),
            "slope": round(self.slope, 5),
            "baseRuns": self.base_runs,
            "newRuns": self.new_runs,
        }


def matched_difference(
    base: Sequence[tuple[float, float]], new: Sequence[tuple[float, float]]
) -> Matched:
    """The new side's ratio minus the base's at equal speed probe, from ``(probe, ratio)``
    runs of each: one straight line per side with a slope they share (an analysis of
    covariance). On a host whose speed drifts, a side whose runs fell on slow minutes has a
    worse median for that alone; the shared slope takes out what the probe explains, and the
    standard error says what is left to chance."""
    if len(base) < 2 or len(new) < 2:
        raise ValueError("a matched comparison needs at least two runs a side")
    sides = [list(base), list(new)]
    means = [
        (sum(p for p, _ in runs) / len(runs), sum(r for _, r in runs) / len(runs)) for runs in sides
    ]
    paired = list(zip(sides, means, strict=True))
    sxx = sum((p - mx) ** 2 for runs, (mx, _) in paired for p, _ in runs)
    sxy = sum((p - mx) * (r - my) for runs, (mx, my) in paired for p, r in runs)
    slope = sxy / sxx if sxx > 0 else 0.0
    (bx, by), (nx, ny) = means
    difference = (ny - by) - slope * (nx - bx)
    residuals = [r - my - slope * (p - mx) for runs, (mx, my) in paired for p, r in runs]
    freedom = len(residuals) - 3
    if freedom < 1:
        return Matched(difference, math.inf, slope, len(base), len(new))
    variance = sum(e * e for e in residuals) / freedom
    leverage = 1 / len(base) + 1 / len(new) + ((nx - bx) ** 2 / sxx if sxx > 0 else 0.0)
    return Matched(difference, math.sqrt(variance * leverage), slope, len(base), len(new))
