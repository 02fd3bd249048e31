"""What a handler gets to work with, and the table from schema key to handler.

Handler modules register themselves with ``@handler("GET /version")``; the engine imports
them all and looks handlers up by the schema key ``Schema.match`` resolved. A handler returns
the envelope's ``data`` (or a ``Reply`` when it also sets ``total`` or holds the answer back)
and raises ``SimError`` for Proxmox's error answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .permissions import Permissions
from .profiles import Profile
from .simtasks import Finish, RunFn, Scheduler, Task
from .state import Cluster, Guest, GuestKind, Node, SimError


@dataclass
class Reply:
    """A handler's answer when ``data`` alone is not enough."""

    data: Any
    total: int | None = None
    wait: float = 0.0  # seconds the front end holds the answer (``delay``/``background_delay``)


@dataclass
class Sim:
    """The engine's state and services, shared by all handlers."""

    cluster: Cluster
    scheduler: Scheduler
    permissions: Permissions
    profile: Profile
    manual_clock: bool  # waits must not block real time when a test drives the clock


@dataclass
class Ctx:
    """One request as a handler sees it: parameters are the validated strings."""

    sim: Sim
    now: float
    user: str  # the token identity, ``user@realm!name``
    key: str
    params: dict[str, str] = field(default_factory=dict)
    upload: tuple[str, bytes] | None = None  # (client file name, content)

    @property
    def cluster(self) -> Cluster:
        return self.sim.cluster

    @property
    def perms(self) -> Permissions:
        """The rights of the token that sent this request."""
        return self.sim.permissions.for_identity(self.user)

    # --- parameters ---------------------------------------------------------------------

    def text(self, name: str, default: str | None = None) -> str | None:
        return self.params.get(name, default)

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self.params.get(name)
        return default if value is None or value == "" else int(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.params.get(name)
        return default if value is None else value == "1"

    @property
    def vmid(self) -> int:
        return int(self.params["vmid"])

    @property
    def node_name(self) -> str:
        return self.params["node"]

    @property
    def node(self) -> Node:
        return self.cluster.nodes[self.params["node"]]

    def guest(self, kind: GuestKind = "qemu") -> Guest:
        """The guest the path names, on the node the path names (500 otherwise)."""
        return self.cluster.guest(self.node_name, self.vmid, kind)

    # --- tasks --------------------------------------------------------------------------

    def submit(
        self,
        task_type: str,
        task_id: str,
        run: RunFn | None,
        *,
        node: Node | None = None,
        cleanup: Finish | None = None,
        error_prefix: str = "",
    ) -> Task:
        target = node or self.node
        return self.sim.scheduler.submit(
            node=target,
            task_type=task_type,
            task_id=task_id,
            user=self.user,
            now=self.now,
            wall=self.cluster.wall(self.now),
            duration=self.sim.profile.duration(task_type),
            run=run,
            cleanup=cleanup,
            error_prefix=error_prefix,
        )

    def wait_for(self, task: Task, seconds: int, failed: Callable[[str], SimError]) -> Reply:
        """``delay``/``background_delay``: null when the task ends OK within ``seconds``.

        The answer is held back until the task's end (real clocks only; with a manual clock a
        wait takes no simulated time and an unfinished task's UPID comes back at once).
        """
        self.sim.scheduler.advance(self.now)  # a task of no duration has ended by now
        if not task.is_running:
            status = str(task.exitstatus)
            if status == "OK" or status.startswith("WARNINGS: "):
                return Reply(None)
            raise failed(status)
        if self.sim.manual_clock:
            return Reply(task.upid)
        end = task.ends_at  # None while the task still waits for a slot
        if end is not None and end - self.now <= seconds:
            if task.will_fail_at_end and task.injected is not None:
                raise failed(task.error_prefix + task.injected.message)
            return Reply(None, wait=max(0.0, end - self.now))
        return Reply(task.upid, wait=float(seconds))


Handler = Callable[[Ctx], Any]
HANDLERS: dict[str, Handler] = {}


def handler(key: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        if key in HANDLERS:
            raise RuntimeError(f"two handlers for {key}")
        HANDLERS[key] = fn
        return fn

    return register
