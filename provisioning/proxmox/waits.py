"""When to look at a Proxmox task (or a boot) again: at its expected end, then soon and sooner.

A fixed poll interval is wrong both ways: too slow for the 0.1 s tasks of a small node, too
chatty for a two-minute clone. So each wait is planned from what the same kind of work took
before on the same node: the first look comes when the work is expected to have ended; if it
has not, the next looks come after a short interval that doubles (from ``MISS_POLL``, or a
twentieth of the estimate for long work) up to the configured poll interval (with no estimate:
below).
The budgets (``budgets.Budgets``) still bound every wait; an estimate only moves the looks inside
them.

The estimates themselves are kept by the caller (the services keep them per cluster in the
database, ``InMemoryDurations`` keeps them for tools and tests); this module only says how a
finished wait changes one (``learn``). What a finished wait knows is an interval, not a
duration: the work was still going at the last look that saw it running and over by the first
look that saw it ended. A bracketed wait counts as the middle of that interval; a wait whose
first look already found the work over only proves it took at most that long, so it counts as
a little less (``PROBE_DOWN``): otherwise an estimate that is too long would never shrink.

A look that found the work over is timed by when it was planned (seconds after the work began),
not by when it happened, as long as it landed about on time: a look always lands a little after
its plan (the broker's delivery, the request), and learning from the landing would grow every
estimate by that overhead, round after round. In planned time the estimate settles where a
planned look finds the work over. But a plan is not a fact: a look that a loaded machine
delivered late (more than ``LATE`` after its plan, or ``LATE_SHARE`` of it when longer) found the
work over at its landing, and the work may have ended anywhere before that, so it counts at its
landing. Counting it at its plan taught a wait that a 0.6 s clone takes 35 ms when its first
look, planned at 50 ms, came at 0.8 s; the next create then read that clone again and again.
Either way a look that found the work over is a bound, not a measure: once an estimate exists,
such a wait may shorten it but never lengthens it (only a look that saw the work still going
does). Counted at 0.9 of their landings, three clone looks a busy worker's queue delivered at
0.57 s instead of 0.21 s took a 0.2 s clone's estimate to about 0.45 s, and on-time looks took it
back down by 2 % each: for some forty clones of issue 12's makespan the look came up to a
quarter of a second after the clone ended while its node's task slot sat idle. A look
that found the work still going is timed by when it was sent, always: that is what Proxmox
said (the work was going then), and the plan of a late look says less (``seen_at``). The first look
comes ``MARGIN`` after the estimate, and a right estimate drifts below the work until a first look
finds it still going (one poll more), which pulls it back up.

A wait with no estimate (``COLD_GROWTH``) looks after a quarter of the time waited so far: its
bracket is at most a fifth of the work, so the estimate it leaves is about a tenth off at worst.
Doubling left half unknown, and the middle of that was the next waits' plan: a 2 s boot
bracketed as 1.97 to 3.8 s planned every later create's first look a second late (issue 12's
latency). Growing by half still left a third: the benchmark's cold boot, seen going at 1.97 s
and over at 2.96 s, made the next two creates look 0.58 and 0.5 s late, and an estimate too
long only comes down by a few percent a wait (``PROBE_DOWN``). In a simulation of 500 cold
boots of 1.6-2.5 s, the two waits after each noticed the end 12.8 % after it on average with
growth by half, 8 % with a quarter; the cold wait costs about eleven looks instead of eight,
once per node and kind (an image's boot: once per image).

The constants trade looks for lateness. In a simulation with 10 % jitter on the duration and a
15-45 ms overhead per look, warm waits took 1.15 (0.2 s work) to 1.43 (2 s) looks each and
noticed the end 7 % (2 s) to 17 % (0.2 s, mostly the overhead) after it (1.33 looks and 8 % for
2 s when the look after a miss came a tenth of the estimate later, ``STEP_SHARE``); a cold wait
left an estimate 6 % off on average (19 % at worst); an estimate 40 % too long came within 10 %
in 11 waits (these two measured with the tenth). A faster probe down (0.7 with a 20 % margin)
shrank that in six, but every first look then came a fifth late, and a cold wait's error took as
long to leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

# The shortest step of a wait with no estimate, and how near its planned first look a wait with
# one waits for that plan rather than planning the look after it (``next_wait``).
MIN_POLL = 0.05
# After a first look that came on an estimate and found the work still going, the next comes
# this share of the estimate later, or MISS_POLL when that is longer (long work is not looked at
# every 20 ms). A right estimate's first look misses now and then (module docstring), so this
# share is most of how late a long wait is noticed: a twentieth, not a tenth (warm waits for a
# 2 s boot, looks landing 15-45 ms after their plans: noticed 60 ms late on average instead of
# 95, for 1.38 looks each instead of 1.33; tests/unit/test_wait_planning.py).
STEP_SHARE = 0.05
# The work was expected over, so it is most likely a few ms from its end, and MIN_POLL there
# cost short work half its length (issue 12's latency: a 0.1 s start looked at 2 ms before its
# end and again 59 ms later, in two creates of three). Cold waits keep MIN_POLL: they know
# nothing of where the end is, and a shorter interval there is only more looks (tried in the
# makespan at 20 ms for every look: worse).
MISS_POLL = 0.02
# With no estimate, each look comes after this share of the time waited so far (at least
# MIN_POLL): the look that finds the work over then bounds its end within a fifth of its
# duration, and the middle of that bracket is about a tenth off at worst (module docstring).
COLD_GROWTH = 0.25
# The first look comes this share after the expected end (module docstring).
MARGIN = 0.05
# A first look that found the work over counts as this share of the time it was planned for;
# PROBE_DOWN * (1 + MARGIN) < 1, so an estimate that is too long shrinks.
PROBE_DOWN = 0.9
# How much one new sample moves an estimate (after the first few, which are averaged).
ALPHA = 0.4
# One sample moves an estimate at most this many times up or down (a task stuck behind a lock
# once does not make every later wait long).
OUTLIER_FACTOR = 4.0
# The kind under which boot-to-address is kept (beside the task types of the UPIDs).
BOOT = "boot"
# A look that landed more than this after its plan (or LATE_SHARE of the plan, when longer) was
# late: more than a delivery's usual overhead (20-35 ms on an idle machine), so the plan is no
# longer a fair stand-in for when it looked (module docstring).
LATE = 0.1
LATE_SHARE = 0.2


@dataclass(frozen=True)
class Timing:
    """What one finished wait told: ``kind`` of work on ``scope`` (a task type on a node, or
    ``BOOT`` for an image) was still going ``seen_running`` seconds after it began (0 when no
    look saw it going) and over at the look that stands for ``seen_done`` after (``seen_at``)."""

    kind: str
    scope: str
    seen_running: float
    seen_done: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        return cls(
            kind=str(data["kind"]),
            scope=str(data["scope"]),
            seen_running=float(data["seen_running"]),
            seen_done=float(data["seen_done"]),
        )

    @property
    def bound_only(self) -> bool:
        """No look saw the work going: the wait bounds its duration from above and can only
        shorten an estimate (``learn``; module docstring)."""
        return self.seen_running <= 0

    def sample(self) -> float:
        """The duration this wait stands for (module docstring)."""
        if self.bound_only:
            return max(0.0, self.seen_done * PROBE_DOWN)
        return (self.seen_running + max(self.seen_done, self.seen_running)) / 2


def seen_at(*, planned: float | None, sent: float, landed: float, running: bool) -> float:
    """The time, in seconds after the work began, that a look stands for (module docstring).

    ``planned``: when the look was planned (None for a record without a plan); ``sent`` and
    ``landed``: when its read went out and its answer came back; ``running``: whether it found
    the work still going."""
    if running:
        return max(0.0, sent)
    if planned is None or landed - planned > max(LATE, LATE_SHARE * planned):
        return max(0.0, landed)
    return max(0.0, min(planned, landed))


class Durations(Protocol):
    """Expected seconds of ``kind`` of work on ``scope``; None when nothing is known yet.

    ``elsewhere``: the shortest estimate of ``kind`` on any other scope, the prior of a wait on a
    scope that has none yet (a task on a node where none of its type ran: ``steps.task_wait``).
    The nodes of a cluster do the same work on similar machines; the shortest is taken so that
    a prior never plans a look later than the fastest node has shown, and a node that is slower
    costs the looks that follow, as a cold wait would."""

    def expected(self, kind: str, scope: str) -> float | None: ...

    def elsewhere(self, kind: str, scope: str) -> float | None: ...


class NoDurations:
    """Nothing known: every wait starts short and grows (a cold start)."""

    def expected(self, kind: str, scope: str) -> float | None:
        return None

    def elsewhere(self, kind: str, scope: str) -> float | None:
        return None


@dataclass(frozen=True)
class Estimate:
    """A running estimate: its value in seconds and how many samples made it."""

    seconds: float
    samples: int


def learn(current: Estimate | None, timing: Timing, *, ceiling: float | None = None) -> Estimate:
    """``current`` moved by one finished wait: a plain mean over the first few samples, then an
    exponentially weighted one; a sample far from the estimate is clamped first (outliers), and
    the result never exceeds ``ceiling`` (the budget of that kind of wait). A wait no look saw
    going counts at most as the estimate (``Timing.bound_only``): it may shorten it, never
    lengthen it."""
    sample = timing.sample()
    if current is None:
        seconds = sample
        samples = 1
    else:
        if timing.bound_only:
            sample = min(sample, current.seconds)
        low, high = current.seconds / OUTLIER_FACTOR, current.seconds * OUTLIER_FACTOR
        if current.seconds > 0:
            sample = min(max(sample, low), high)
        samples = current.samples + 1
        weight = max(ALPHA, 1.0 / samples)
        seconds = current.seconds + weight * (sample - current.seconds)
    if ceiling is not None:
        seconds = min(seconds, ceiling)
    return Estimate(max(0.0, seconds), samples)


def next_wait(*, expected: float | None, elapsed: float, cap: float, limit: float) -> float:
    """Seconds until the next look at work that began ``elapsed`` seconds ago.

    Before its expected end (plus ``MARGIN``): wait for it, never past ``limit`` (the wait's
    budget, so an estimate gone wrong cannot outwait the ceiling). After it: the time it has
    overrun, at least ``MISS_POLL`` (or ``STEP_SHARE`` of the estimate) and at most ``cap`` (the
    configured poll interval), so the interval doubles while the work runs late. With no
    estimate: ``COLD_GROWTH`` of the time waited, at least ``MIN_POLL``."""
    if cap <= 0:
        return 0.0
    first = expected * (1 + MARGIN) if expected is not None else 0.0
    remaining = first - elapsed
    if remaining >= MIN_POLL:
        return min(remaining, max(limit - elapsed, MIN_POLL))
    # Due, or nearly. No look comes sooner than MISS_POLL after the last (MIN_POLL with no
    # estimate), which also keeps a wait from being spent re-reading in a tight loop.
    if expected is None:
        step = max(MIN_POLL, COLD_GROWTH * elapsed)
    elif remaining > 0:
        # The planned first look is nearer than MIN_POLL (a step that ran late): at its plan.
        step = max(remaining, MISS_POLL)
    else:
        step = max(-remaining, MISS_POLL, STEP_SHARE * expected)
    return min(step, cap)


class InMemoryDurations:
    """Estimates kept in this process (tools, the blocking provider calls, tests)."""

    def __init__(self) -> None:
        self._estimates: dict[tuple[str, str], Estimate] = {}

    def expected(self, kind: str, scope: str) -> float | None:
        found = self._estimates.get((kind, scope))
        return found.seconds if found is not None else None

    def elsewhere(self, kind: str, scope: str) -> float | None:
        others = [e.seconds for (k, s), e in self._estimates.items() if k == kind and s != scope]
        return min(others, default=None)

    def learn(self, timing: Timing) -> None:
        key = (timing.kind, timing.scope)
        self._estimates[key] = learn(self._estimates.get(key), timing)
