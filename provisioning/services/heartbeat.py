"""Keeping a short lease alive while its holder works: a claim on a step, a job's lease.

A lease sized for the longest possible run outlives a holder that died for just as long (a
worker killed mid-round kept reconcile stopped for six minutes). So leases are short, and they
are renewed every third of their length while the holder runs; a holder that dies stops
renewing, and its lease frees within one length.

One renewer thread per process renews every lease held in it (issue 12: a thread started and
joined around each step cost about 3 % of a busy worker's time, and most of those threads only
waited and exited). Entering a block only records when its first renewal is due; the thread
sleeps until the earliest one. Its connection is closed after each round of renewals, as each
block's own thread closed it, so it holds none between rounds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import connection

log = logging.getLogger("proxyhub.operations")


@dataclass(eq=False)
class _Lease:
    renew: Callable[[], None]
    every: float
    name: str
    due: float
    renewing: bool = field(default=False)


class _Renewer:
    """The process's renewer: the leases held, and the thread that renews them when due."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.leases: set[_Lease] = set()
        self.thread: threading.Thread | None = None

    def add(self, lease: _Lease) -> None:
        with self.cond:
            self.leases.add(lease)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self.thread.start()
            self.cond.notify()

    def remove(self, lease: _Lease) -> None:
        """Forget ``lease``; a renewal of it under way ends first, so none follows the block
        (as the block's own thread was joined)."""
        with self.cond:
            self.leases.discard(lease)
            deadline = time.monotonic() + 5.0
            while lease.renewing and time.monotonic() < deadline:
                self.cond.wait(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = [lease for lease in self.leases if lease.due <= now]
                if not due:
                    soonest = min((lease.due for lease in self.leases), default=None)
                    self.cond.wait(None if soonest is None else soonest - now)
                    continue
                for lease in due:
                    lease.renewing = True
            try:
                for lease in due:
                    try:
                        lease.renew()
                    except Exception:
                        log.warning("lease renewal failed", extra={"lease": lease.name})
            finally:
                connection.close()  # this thread's own connection
                with self.cond:
                    for lease in due:
                        lease.renewing = False
                        lease.due = time.monotonic() + lease.every
                    self.cond.notify_all()


_renewer = _Renewer()
_renewer_lock = threading.Lock()


def _the_renewer() -> _Renewer:
    """This process's renewer (a forked child makes its own: the parent's thread is not in it)."""
    global _renewer
    with _renewer_lock:
        if _renewer.pid != os.getpid():
            _renewer = _Renewer()
        return _renewer


@contextmanager
def renewed(renew: Callable[[], None], *, every: float, name: str) -> Iterator[None]:
    """Call ``renew`` every ``every`` seconds while the block runs. Most blocks end long before
    the first renewal, so nothing touches the database; a renewal that fails (a database
    restarting) is logged and tried again ``every`` seconds later."""
    renewer = _the_renewer()
    lease = _Lease(renew=renew, every=every, name=name, due=time.monotonic() + every)
    renewer.add(lease)
    try:
        yield
    finally:
        renewer.remove(lease)
