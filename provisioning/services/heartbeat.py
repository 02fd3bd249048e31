"""Keeping a short lease alive while its holder works: a claim on a step, a job's lease.

A lease sized for the longest possible run outlives a holder that died for just as long (a
worker killed mid-round kept reconcile stopped for six minutes). So leases are short, and a
background thread renews them every third of their length while the holder runs; a holder that
dies stops renewing, and its lease frees within one length.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection

log = logging.getLogger("proxyhub.operations")


@contextmanager
def renewed(renew: Callable[[], None], *, every: float, name: str) -> Iterator[None]:
    """Call ``renew`` every ``every`` seconds while the block runs. Most blocks end long before
    the first renewal, so the thread usually only waits and exits without touching the
    database; a renewal that fails (a database restarting) is logged and tried again."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(every):
                try:
                    renew()
                except Exception:
                    log.warning("lease renewal failed", extra={"lease": name})
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=beat, name=f"renew-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
