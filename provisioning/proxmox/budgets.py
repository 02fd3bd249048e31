"""How long proxyhub waits for each kind of Proxmox work (seed 000 entry 18).

One frozen record of every budget, in seconds, so tests can shrink them all at once with
``scaled`` instead of patching constants. A task wait that runs out is transient and names the
UPID; the task keeps running on Proxmox and the next attempt finds its result.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Budgets:
    """Seed 000 entry 18's table.

    ``connect`` bounds the TCP dial and the TLS handshake, ``request`` one request with its
    response (the cluster's ``requestTimeoutSeconds``); the task budgets bound the wait for a
    submitted task; ``lock_wait`` the ownership check's wait for a VM's lock (as long as a
    clone); ``running`` the wait for ``status: running`` after the start task; ``poll_interval``
    the pause between task and status polls.
    """

    connect: float = 10.0
    request: float = 30.0
    clone: float = 600.0
    lock_wait: float = 600.0
    upload: float = 120.0
    resize: float = 120.0
    start: float = 120.0
    stop: float = 120.0
    destroy: float = 300.0
    seed_delete: float = 60.0
    running: float = 60.0
    poll_interval: float = 1.0

    def scaled(self, factor: float) -> Budgets:
        """Every budget, the poll interval included, multiplied by ``factor`` (tests shrink)."""
        if factor <= 0:
            raise ValueError(f"factor must be positive, got {factor}")
        return dataclasses.replace(
            self,
            **{f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self)},
        )

    def for_task(self, task_type: str) -> float:
        """The budget of a task of ``task_type`` (a UPID's type): the longest a wait for it
        may last, so an expected duration never plans a look beyond it."""
        field_name = _TASK_BUDGETS.get(task_type)
        return float(getattr(self, field_name)) if field_name else self.clone


# A UPID's task type to the budget that bounds the wait for it (seed 000 entry 18); any other
# type is bounded by the longest of them, the clone's.
_TASK_BUDGETS = {
    "qmclone": "clone",
    "imgcopy": "upload",
    "resize": "resize",
    "qmresize": "resize",
    "qmstart": "start",
    "hastart": "start",
    "qmreboot": "start",
    "qmstop": "stop",
    "qmshutdown": "stop",
    "hastop": "stop",
    "qmdestroy": "destroy",
    "imgdel": "seed_delete",
}


DEFAULT_BUDGETS = Budgets()
