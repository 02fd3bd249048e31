"""The engine's sense of time: a monotonic clock, or a manual one tests move by hand.

The engine never runs background threads: a task's progress is computed from the clock when
someone looks (``simtasks.Scheduler.advance``). With ``ManualClock`` nothing moves until a test
(or ``POST /_sim/advance``) advances it, which makes timing tests exact and instant.
"""

from __future__ import annotations

import threading


class ManualClock:
    """A monotonic-style clock that only moves when told to. Callable like ``time.monotonic``."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never backwards); returns the new time."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += seconds
            return self._now
