"""One circuit probe, sent on a thread of its own so that it need not hold a worker.

A live pveproxy answers ``GET /version`` in milliseconds, a silent host never does, and the
probe's bound (``PROXYHUB_CIRCUIT_PROBE_SECONDS``, 3 s) is what telling them apart costs. The
delivery that probes waits only ``PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS`` for the answer; when
none came by then it hands the verdict over to the probe's thread and goes, its step deferred.
So a silent cluster costs a worker that short wait per probe, not the whole bound (issue 10:
while a cluster is out, its steps hold no worker slot), and a cluster that answers runs the
step in the same delivery as before.

This module only runs the request and hands over its result; ``services.circuit`` decides
what the result means for the breaker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioning.proxmox.api import Api
from provisioning.proxmox.deadline import Cancelled, Deadline, DeadlineExceeded
from provisioning.proxmox.errors import ProxmoxError

from .tracing import probe_span

# What a probe may meet that says something about the cluster; anything else is a bug.
PROBE_FAILURES = (ProxmoxError, Cancelled, DeadlineExceeded)


@dataclass(frozen=True)
class ProbeResult:
    """How the probe ended: ``error`` None means Proxmox answered."""

    error: BaseException | None
    seconds: float


class ProbeRun:
    """One ``GET /version`` bounded by ``bound`` seconds, running on a daemon thread."""

    def __init__(self, api: Api, bound: float, *, label: str = "") -> None:
        self._api = api
        self._bound = bound
        self._label = label
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._result: ProbeResult | None = None
        self._then: Callable[[ProbeResult], None] | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"circuit-probe-{label}", daemon=True
        )

    def start(self) -> ProbeRun:
        self._thread.start()
        return self

    def result(self, wait: float) -> ProbeResult | None:
        """The result once the probe ended, waiting up to ``wait`` seconds; None if it has not."""
        self._done.wait(wait)
        with self._lock:
            return self._result

    def hand_off(self, then: Callable[[ProbeResult], None]) -> ProbeResult | None:
        """Have ``then`` called with the result on the probe's thread when the probe ends. If it
        ended meanwhile, nothing is handed over and the result is returned to the caller."""
        with self._lock:
            if self._result is not None:
                return self._result
            self._then = then
            return None

    def _run(self) -> None:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            with probe_span(self._label):
                self._api.version(deadline=Deadline(self._bound))
        except BaseException as err:  # handed to whoever takes the result
            error = err
        result = ProbeResult(error, time.monotonic() - started)
        with self._lock:
            self._result = result
            then = self._then
        self._done.set()
        if then is not None:
            then(result)
