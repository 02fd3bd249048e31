"""A worker's pool processes die with it, even when it is killed without a chance to stop them.

Each prefork pool process asks the kernel for SIGKILL when its parent dies (prctl(2)'s
``PR_SET_PDEATHSIG``, set as it starts). Without it a SIGKILLed or OOM-killed worker would leave
its pool processes behind, still holding their database session and whatever step they ran,
with no parent to hand them messages. ``proxyhub.celery`` makes that call through ctypes rather
than billiard's cffi path (issue 12: the worker's memory); this holds it to the same effect.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from itstack import Stack, wait_until

pytestmark = pytest.mark.integration


def _group_members(pgid: int) -> set[int]:
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # Field 5 is the process group; the command (field 2) may hold spaces: skip it.
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry))
    return members


def test_a_killed_workers_pool_processes_exit_with_it(stack: Stack) -> None:
    worker = stack.worker("orphans", concurrency=2)
    try:
        assert worker.process is not None
        parent = worker.process.pid
        pool = wait_until(
            lambda: (_group_members(parent) - {parent}) or None,
            timeout=30,
            what="the worker's pool processes",
        )
        assert len(pool) == 2

        os.kill(parent, signal.SIGKILL)  # the parent alone: nobody tells the pool to stop
        worker.process.wait(timeout=10)

        wait_until(
            lambda: not (_group_members(parent) & pool),
            timeout=30,
            what="the pool processes to exit after their parent",
        )
    finally:
        worker.stop()
        stack.workers.remove(worker)
