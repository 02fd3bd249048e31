"""Simulated Proxmox tasks: UPIDs, logs, exit statuses, and a per-node queue (pve-reference §4).

A task is submitted by a handler with a ``run`` function. When the node has a free slot the
task *begins*: ``run`` does the task's checks and immediate effects and either raises
``TaskError`` (the task ends at once with ``TASK ERROR: <text>``, as a real task that dies on
a lock check does) or returns a ``finish`` function, called when the task's duration has
passed. Nothing runs in the background: ``Scheduler.advance(now)`` replays every begin and end
due by ``now`` in time order, and the engine calls it before and after each request. That keeps
a fake clock exact and ten thousand idle VMs free.

Tasks beyond a node's ``node_task_limit`` wait in a FIFO queue; while they wait they read as
``running`` with an empty log (``no content``), which is what a client polling a slow node sees.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .state import Node, TaskError

# pve-reference §4.1 (pve-common UPID.pm): the parser accepts hex in either case.
UPID_RE = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)"
    r":(?P<pid>[0-9a-fA-F]{8}):(?P<pstart>[0-9a-fA-F]{8,9}):(?P<starttime>[0-9a-fA-F]{8})"
    r":(?P<type>[^:\s/]+):(?P<id>[^:\s/]*):(?P<user>[^:\s/]+):"
)

Finish = Callable[[float], None]
RunFn = Callable[["Task", float], Finish | None]


class WaitFor(Exception):
    """Raised by a task's ``run``: it blocks on another task's config file lock.

    qemu-server takes a flock on ``/var/lock/qemu-server/lock-<vmid>.conf`` before touching a
    config and waits for it (10 s by default). A start issued while the VM's clone still runs
    therefore waits for the clone instead of failing (seed 000 entry 10, F3); ``run`` is
    called again when ``holder`` ends, or the task fails with ``error`` after ``timeout``.
    """

    def __init__(self, holder: Task, timeout: float, error: str) -> None:
        self.holder = holder
        self.timeout = timeout
        self.error = error
        super().__init__(error)


@dataclass
class InjectedFailure:
    """``Control.fail_next_task``: the next task of a type fails with ``message``.

    With ``applied`` the task's effect still happens and only its exit status is an error
    (a ``qmstart`` that reports failure although the VM runs — research/peers.md §6).
    """

    task_type: str
    message: str
    node: str | None = None
    applied: bool = False


@dataclass(eq=False)
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    submitted: float
    duration: float
    run: RunFn | None = None
    cleanup: Finish | None = None  # undo a failed task's partial effect (clone)
    error_prefix: str = ""  # clone wraps its errors: "clone failed: <error>"
    injected: InjectedFailure | None = None
    state: Literal["queued", "running", "stopped"] = "queued"
    started_at: float | None = None
    ends_at: float | None = None
    ended_at: float | None = None
    exitstatus: str | None = None
    warnings: int = 0
    log: list[str] = field(default_factory=list)
    finish: Finish | None = None
    waiters: list[Task] = field(default_factory=list)  # tasks blocked on this one's lock

    def write(self, line: str) -> None:
        self.log.append(line)

    def warn(self, line: str) -> None:
        """``log_warn``: the line is logged and counted for ``TASK WARNINGS: n``."""
        self.warnings += 1
        self.log.append(f"WARN: {line}")

    @property
    def is_running(self) -> bool:
        return self.state != "stopped"

    @property
    def will_fail_at_end(self) -> bool:
        return self.injected is not None and not self.injected.applied


def _fail_with(error: str) -> Finish:
    def fail(at: float) -> None:
        raise TaskError(error)

    return fail


def format_upid(
    node: str, pid: int, pstart: int, starttime: int, task_type: str, task_id: str, user: str
) -> str:
    """``UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:`` (note the trailing colon)."""
    return f"UPID:{node}:{pid:08X}:{pstart:08X}:{starttime:08X}:{task_type}:{task_id}:{user}:"


class Scheduler:
    """All tasks of the cluster, their per-node slots and the timeline of their ends."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.tasks: dict[str, Task] = {}
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._running: dict[str, int] = {}
        self._queues: dict[str, deque[Task]] = {}
        self.injected: list[InjectedFailure] = []

    # --- submitting ---------------------------------------------------------------------

    def submit(
        self,
        *,
        node: Node,
        task_type: str,
        task_id: str,
        user: str,
        now: float,
        wall: int,
        duration: float,
        run: RunFn | None,
        cleanup: Finish | None = None,
        error_prefix: str = "",
    ) -> Task:
        """Create a task on ``node``; it begins now when a slot is free, else it queues."""
        pid = node.next_pid
        node.next_pid += 1
        pstart = max(0, wall - node.boot_epoch) * 100  # clock ticks since the node booted
        upid = format_upid(node.name, pid, pstart, wall, task_type, task_id, user)
        task = Task(
            upid=upid,
            node=node.name,
            pid=pid,
            pstart=pstart,
            starttime=wall,
            type=task_type,
            id=task_id,
            user=user,
            submitted=now,
            duration=duration,
            run=run,
            cleanup=cleanup,
            error_prefix=error_prefix,
            injected=self._take_injection(task_type, node.name),
        )
        self.tasks[upid] = task
        if self._running.get(node.name, 0) < self._limit():
            self._begin(task, now)
        else:
            self._queues.setdefault(node.name, deque()).append(task)
        return task

    def inject(self, failure: InjectedFailure) -> None:
        self.injected.append(failure)

    def _take_injection(self, task_type: str, node: str) -> InjectedFailure | None:
        for i, failure in enumerate(self.injected):
            if failure.task_type == task_type and failure.node in (None, node):
                return self.injected.pop(i)
        return None

    # --- time ---------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Run every task end (and the begins it frees) due at or before ``now``, in order."""
        while self._heap and self._heap[0][0] <= now:
            at, _, task = heapq.heappop(self._heap)
            if task.state == "running" and task.ends_at == at:
                self._end(task, at)

    def _begin(self, task: Task, at: float) -> None:
        self._running[task.node] = self._running.get(task.node, 0) + 1
        task.state = "running"
        task.started_at = at
        self._run(task, at)

    def _run(self, task: Task, at: float) -> None:
        """The task's checks and first effects; then its end goes on the timeline."""
        failure = task.injected
        if failure is not None and not failure.applied and task.cleanup is None:
            self._stop(task, at, task.error_prefix + failure.message)
            return
        try:
            task.finish = task.run(task, at) if task.run else None
        except TaskError as exc:
            self._stop(task, at, task.error_prefix + exc.text)
            return
        except WaitFor as wait:
            task.finish = _fail_with(wait.error)
            task.ends_at = at + wait.timeout
            wait.holder.waiters.append(task)
            heapq.heappush(self._heap, (task.ends_at, next(self._seq), task))
            return
        task.ends_at = at + task.duration
        heapq.heappush(self._heap, (task.ends_at, next(self._seq), task))

    def _end(self, task: Task, at: float) -> None:
        failure = task.injected
        if failure is not None and not failure.applied and task.cleanup is not None:
            task.cleanup(at)
            self._stop(task, at, task.error_prefix + failure.message)
            return
        try:
            if task.finish is not None:
                task.finish(at)
        except TaskError as exc:
            self._stop(task, at, task.error_prefix + exc.text)
            return
        self._stop(task, at, failure.message if failure is not None else None)

    def _stop(self, task: Task, at: float, error: str | None) -> None:
        """Write the final log line and free the slot for the next queued task."""
        if error is not None:
            flat = " ".join(error.splitlines())
            task.write(f"TASK ERROR: {flat}")
            task.exitstatus = flat
        elif task.warnings:
            task.write(f"TASK WARNINGS: {task.warnings}")
            task.exitstatus = f"WARNINGS: {task.warnings}"
        else:
            task.write("TASK OK")
            task.exitstatus = "OK"
        task.state = "stopped"
        task.ended_at = at
        task.ends_at = None
        self._running[task.node] = self._running.get(task.node, 1) - 1
        waiters, task.waiters = task.waiters, []
        for waiter in waiters:
            if waiter.state == "running":
                self._run(waiter, at)  # the lock is free: the waiter goes on
        queue = self._queues.get(task.node)
        if queue:
            self._begin(queue.popleft(), at)

    # --- stopping -----------------------------------------------------------------------

    def interrupt(self, task: Task, at: float) -> None:
        """``DELETE /nodes/{node}/tasks/{upid}``: the worker gets a signal (§4.2)."""
        if task.state == "stopped":
            return
        if task.state == "queued":
            self._queues[task.node].remove(task)
            self._running[task.node] = self._running.get(task.node, 0) + 1
        if task.cleanup is not None:
            task.cleanup(at)
            self._stop(task, at, task.error_prefix + "interrupted by signal")
        else:
            self._stop(task, at, "received interrupt")

    def running_on(self, node: str) -> int:
        return self._running.get(node, 0)

    def queued_on(self, node: str) -> int:
        return len(self._queues.get(node, ()))
