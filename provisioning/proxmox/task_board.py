"""One look at a node's task list answers for every task of ours on that node (issue 12).

A step waiting on a Proxmox task looks at it when the task is expected to end (``waits``). A
fleet keeps several of our tasks running on one node at once (the template's node clones up to
its cap), and each looked at its own task with its own status read. One
``GET /nodes/{node}/tasks`` (``source=all``, ``since`` the oldest of them, our user only:
pve-reference §4.4) tells every one's state for the price of one of those reads. So the look
that comes first answers for all of them: it says which of the others it saw ended (the caller
wakes those operations now, instead of at their own planned looks: ``services.task_wakes``),
and the board remembers those ends, so the woken operation's poll reads nothing at all.

What the board remembers is only a task that ended, and an end is a fact that cannot go stale
(a UPID names one task for good). A task the list does not show (a busy node's list cut at its
limit, an entry not yet written) is read on its own with a status read, as without a board:
absence never counts as an end. A node with no other task of ours in flight is read the way it
always was, one status read, since a list would cost more and tell no more.

A start's wait asks the board first too (``look_shared``): the ``qmstart``'s end is its VM
running, so on a busy node the list answers for the VMs a fleet is starting, and alone on its
node the start reads the VM's status as before (``create._start_listed``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .api import Api
from .deadline import Deadline
from .tasks import TaskOutcome, listed_outcome, logged, parse_upid, read_task

# The other UPIDs of ours in flight on ``node`` besides ``upid``, as the caller knows them (the
# services read them from the task slots' holders: ``services.task_wakes.tasks_in_flight``).
InFlight = Callable[[str, str], Sequence[str]]

# How many entries one look lists. The list is newest first and starts at the oldest of our
# tasks, so only a node that ran this many tasks of our user since then cuts ours off; those are
# then read one by one.
LIST_LIMIT = 200
# How many ended tasks a board remembers for polls still to come (one per operation woken and
# not yet run in this process; one run in another process leaves its entry behind).
KEPT = 4096


@dataclass(frozen=True)
class Seen:
    """A task's state as one look saw it: sent and answered at these wall-clock times."""

    outcome: TaskOutcome
    sent: float
    landed: float


@dataclass(frozen=True)
class Look:
    """What a poll learned: its own task (``seen``) and the other tasks that look found
    ended (``ended``: their UPIDs, remembered by the board for their own polls)."""

    seen: Seen
    ended: tuple[str, ...] = ()


class TaskBoard:
    """Per cluster and process: what the last looks at its nodes' task lists saw end."""

    def __init__(self, in_flight: InFlight, *, kept: int = KEPT) -> None:
        self._in_flight = in_flight
        self._kept = kept
        self._ended: OrderedDict[str, Seen] = OrderedDict()
        self._guard = threading.Lock()

    def look(
        self,
        api: Api,
        upid: str,
        *,
        clock: Callable[[], float] = time.time,
        deadline: Deadline | None = None,
    ) -> Look:
        """The state of ``upid``: remembered when an earlier look saw it end, else read, with
        every other task of ours on its node in the same request when there are any."""
        shared = self.look_shared(api, upid, clock=clock, deadline=deadline)
        if shared is not None:
            return shared
        return Look(read_seen(api, upid, clock=clock, deadline=deadline))

    def look_shared(
        self,
        api: Api,
        upid: str,
        *,
        clock: Callable[[], float] = time.time,
        deadline: Deadline | None = None,
    ) -> Look | None:
        """What the board can say of ``upid`` without a read of it alone: remembered when an
        earlier look saw it end, or one look at its node's list when other tasks of ours run
        there. None when it has nothing to share: the caller reads what it reads alone (a
        task's status, or for a start the VM's own: ``create``)."""
        with self._guard:
            known = self._ended.pop(upid, None)
        if known is not None:
            return Look(known)
        parsed = parse_upid(upid)
        others = [
            other
            for other in self._in_flight(parsed.node, upid)
            if other != upid and _node_of(other) == parsed.node
        ]
        if not others:
            return None
        started = [parse_upid(other).starttime for other in others]
        sent = clock()
        listing = api.node_tasks(
            parsed.node,
            source="all",
            since=min([parsed.starttime, *started]),
            userfilter=parsed.user.split("!")[0],
            limit=LIST_LIMIT,
            deadline=deadline,
        )
        landed = clock()
        entries = {str(entry.get("upid")): entry for entry in listing}
        ended: list[str] = []
        for other in others:
            entry = entries.get(other)
            if entry is None:
                continue
            outcome = listed_outcome(other, entry)
            if outcome.finished:
                self._keep(other, Seen(outcome, sent, landed))
                ended.append(other)
        mine = entries.get(upid)
        if mine is None:
            return Look(read_seen(api, upid, clock=clock, deadline=deadline), tuple(ended))
        return Look(Seen(logged(listed_outcome(upid, mine)), sent, landed), tuple(ended))

    def _keep(self, upid: str, seen: Seen) -> None:
        with self._guard:
            self._ended[upid] = seen
            while len(self._ended) > self._kept:
                self._ended.popitem(last=False)


def read_seen(
    api: Api,
    upid: str,
    *,
    clock: Callable[[], float] = time.time,
    deadline: Deadline | None = None,
) -> Seen:
    """``upid``'s state by one status read of its own (pve-reference §4.2)."""
    sent = clock()
    outcome = read_task(api, upid, deadline=deadline)
    return Seen(outcome, sent, clock())


def _node_of(upid: str) -> str:
    try:
        return parse_upid(upid).node
    except ValueError:
        return ""
