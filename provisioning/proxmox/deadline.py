"""Deadlines and cancellation for calls into Proxmox.

Python has no request context, so every seam method and every provider operation takes an
optional ``Deadline``: an absolute expiry on the monotonic clock plus a cancel flag another
thread may set. Waits sleep on the flag, so a cancelled or expired operation returns promptly
(seed 000 entry 18: "a cancelled ctx cancels only that request").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class DeadlineExceeded(Exception):
    """The operation's deadline passed before it finished."""


class Cancelled(Exception):
    """Somebody cancelled the operation."""


class Deadline:
    """An optional expiry plus a cancel flag, shared by every call of one operation."""

    def __init__(
        self,
        seconds: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._expires_at = None if seconds is None else clock() + seconds
        self._cancelled = threading.Event()

    @classmethod
    def never(cls) -> Deadline:
        return cls(None)

    @property
    def expires_at(self) -> float | None:
        return self._expires_at

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def remaining(self) -> float | None:
        """Seconds left, or ``None`` when there is no expiry. Never negative."""
        if self._expires_at is None:
            return None
        return max(0.0, self._expires_at - self._clock())

    def check(self) -> None:
        """Raise ``Cancelled`` or ``DeadlineExceeded`` when the operation must stop now."""
        if self._cancelled.is_set():
            raise Cancelled("operation cancelled")
        left = self.remaining()
        if left is not None and left <= 0:
            raise DeadlineExceeded("deadline exceeded")

    def timeout(self, cap: float) -> float:
        """The timeout for one request: ``cap`` shortened to what is left. Raises when none is."""
        self.check()
        left = self.remaining()
        return cap if left is None else min(cap, left)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; wake at once on cancel; raise if the deadline ends first."""
        self.check()
        left = self.remaining()
        wait = seconds if left is None else min(seconds, left)
        if self._cancelled.wait(max(0.0, wait)):
            raise Cancelled("operation cancelled")
        if left is not None and wait < seconds:
            raise DeadlineExceeded("deadline exceeded")

    def wait_cancelled(self, seconds: float) -> bool:
        """Block up to ``seconds`` for a cancel; True if cancelled. For request watchdogs."""
        return self._cancelled.wait(seconds)


def effective(deadline: Deadline | None) -> Deadline:
    """The deadline to use when a caller passed none."""
    return deadline if deadline is not None else Deadline.never()
