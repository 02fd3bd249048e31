"""How fast this machine runs Python at the moment of a run: a fixed piece of work, timed.

The suite's timed figures move with the machine. On a shared host the same two cores can run
the same Python half as fast one minute as the next: on 2026-12-08 a fixed loop took 218 to 350
ms within a quarter of an hour with no load of our own, and six makespan sets of one commit
gave medians from 1.37 to 2.0 (benchmarks/README.md). The simulator's capacity, measured once
per suite, cannot show that. So every fleet the suite creates (``suite.create_fleet``: each
latency and makespan run) times this probe just before and just after it (``speedProbeMs``): a
reader can tell a slow run from a slow machine, and compare two commits only on runs the probe
says were alike.

The work is interpreted Python of the kind a delivery does most (small dicts, string joins,
integer arithmetic), so it slows with the worker's own code; the median of a few rounds leaves
out a single round that the scheduler interrupted.
"""

from __future__ import annotations

import statistics
import time

# Sized to take about 10-20 ms on the machines the suite has run on: long enough to time, short
# enough that probing before and after every run costs the suite well under a second.
ITEMS = 50_000
ROUNDS = 5


def _work(items: int) -> int:
    total = 0
    for i in range(items):
        row = {"pk": i, "state": "running", "node": f"pve{i % 3}"}
        total += len("|".join((row["state"], row["node"]))) + (i * i) % 7
    return total


def probe_ms(*, items: int = ITEMS, rounds: int = ROUNDS) -> float:
    """Milliseconds the probe's work took: the median of ``rounds`` timings."""
    if items < 1 or rounds < 1:
        raise ValueError("the probe needs at least one item and one round")
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        _work(items)
        timings.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(timings), 2)


def around(before: float, after: float) -> float:
    """One run's probe: the mean of the timings before and after it."""
    return round((before + after) / 2, 2)
