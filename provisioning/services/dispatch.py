"""Handing work to the queue: how services send a step without importing the tasks above them.

The services sit under the Celery tasks (tasks are thin doors onto services, STYLE.md), so they
cannot import ``provisioning.tasks``. They send by the task's registered name instead, which the
tasks declare with ``name=`` from the constants here. Every send happens after commit: a message
must never point at a row that a rolled-back transaction took back.

Tests replace ``send_step`` on this module (the service tests' pump does), so callers look it up
here at call time rather than binding it on import.

A send after commit never fails the request or task whose data it follows: the operation is
already in the journal, due now, with its token. When the broker cannot be reached (the publish
is bounded by the broker timeouts and retry policy in settings), the failure is logged without
the message's content and noted for the current request (``collecting_unsent``), and the
sweeper sends the step once the broker answers again (it re-sends any step overdue by its grace
period, whether its first message was lost in the broker or never left this process).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

STEP_TASK = "proxyhub.provisioning.step"
SWEEP_TASK = "proxyhub.provisioning.sweep"
RECONCILE_TASK = "proxyhub.provisioning.reconcile"
GC_TASK = "proxyhub.provisioning.gc"
PRUNE_JOURNAL_TASK = "proxyhub.provisioning.prune_journal"
INVENTORY_TASK = "proxyhub.provisioning.inventory_refresh"

# Step messages travel on the default queue; the periodic jobs that keep the loop alive (sweep,
# reconcile, GC) have a small queue of their own, so a backlog of steps can never starve them.
STEP_QUEUE = "provisioning"
CONTROL_QUEUE = "control"

# Which due step a worker takes first. Work under way (a Proxmox task to watch, a slot to use, a
# boot to look at) goes before work that can wait: an operation's first step and the cleanup
# after a create's proxy runs (the seed's release). One worker's backlog of new creates then no
# longer stands between a task's end and its next submission, which is what keeps a node's task
# slots full (issue 12's makespan: the first steps of 60 creates held a node idle for over a
# second while its first clones had ended). On Redis a lower number is delivered first (kombu's
# priority lists); the embedded broker keeps arrival order. A step that waited past the
# sweeper's grace is sent again at the first priority (services.sweeper), so nothing waits
# forever behind a steady stream of work under way.
PRIORITY_UNDER_WAY = 0
PRIORITY_CAN_WAIT = 3


log = logging.getLogger("proxyhub.operations")


@dataclass
class Unsent:
    """What could not be sent during a request: operations whose step message is left to the
    sweeper, and other messages by what they were (a health round)."""

    operations: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.operations or self.other)


# Filled for whoever is collecting (the admin's request, so its page can say the work waits for
# the queue); None when nobody is.
_unsent: ContextVar[Unsent | None] = ContextVar("proxyhub_unsent", default=None)

# The message header that carries the operation's trace context (services.tracing).
TRACE_HEADER = "traceparent"


def send_step(
    operation_id: str,
    token: str,
    countdown: float = 0.0,
    trace_parent: str = "",
    priority: int = PRIORITY_UNDER_WAY,
) -> None:
    """Send the message for an operation's next step now (callers use ``send_after_commit``).
    ``trace_parent`` is the operation's reserved trace context: its steps' spans, on whichever
    worker, become children of the operation's span. ``priority``: ``PRIORITY_UNDER_WAY`` or
    ``PRIORITY_CAN_WAIT`` (above)."""
    from celery import current_app

    current_app.send_task(
        STEP_TASK,
        kwargs={"operation_id": operation_id, "token": token},
        countdown=max(0.0, countdown),
        queue=STEP_QUEUE,
        headers={TRACE_HEADER: trace_parent} if trace_parent else None,
        priority=priority,
        # No result is kept (settings: no result backend). Said here, send_task skips the
        # backend's notice before it publishes, whose first lookup in a process scans entry
        # points: 7 ms of a command's first send, after its commit.
        ignore_result=True,
    )


def warm_sender() -> threading.Thread:
    """Ready this process's sender for the sends to come; returns the thread that opens the
    broker's connection while the caller goes on (checking input, writing the operations).

    A fresh process's first publish imports the broker's transport and its client library,
    builds Celery's task sender (which imports its events module) and looks up the result
    backend (an ``AsyncResult`` is made even with ``ignore_result``), then opens the connection.
    A management command is such a process every time (issue 12's latency). The imports and the
    building are done here, before the caller writes anything: they hold the interpreter, so in
    a thread they only raced the command's own work and were still going at its commit, the
    operation sitting due with no message for 126-140 ms (four ``proxies create`` runs on the
    Redis broker); done first, 8-10 ms, and the whole command was shorter too (79-119 ms from
    Django's setup to its end against 161-184). Only the connection, which waits on the
    network, is left to the thread. A warm-up that fails (the broker is down) changes nothing:
    the send after commit meets the same error and reports it (``send_after_commit``).
    """

    from celery import current_app

    # The caller's app, the one its sends will use (Celery's current app is per thread).
    app = current_app._get_current_object()

    def build() -> None:
        with app.connection_for_write() as connection:
            connection.get_transport_cls()  # imports the transport; opens nothing
        _ = app.amqp.send_task_message
        _ = app.backend

    def connect() -> None:
        with app.producer_pool.acquire(block=True) as producer:
            # The default channel is the one a publish uses; opening it opens the socket
            # (kombu's Redis channel pings on creation).
            producer.connection.ensure_connection(max_retries=1)
            _ = producer.connection.default_channel

    _quietly(build)
    thread = threading.Thread(
        target=_quietly, args=(connect,), name="proxyhub-warm-sender", daemon=True
    )
    thread.start()
    return thread


def _quietly(warm: Callable[[], None]) -> None:
    """Run one part of the warm-up; a warm-up never fails its caller (``warm_sender``)."""
    try:
        warm()
    except Exception as err:
        log.debug("broker warm-up failed", extra={"error": type(err).__name__})


def send_after_commit(
    operation_id: str,
    token: str,
    countdown: float = 0.0,
    trace_parent: str = "",
    priority: int = PRIORITY_UNDER_WAY,
) -> None:
    """Send the step once the surrounding transaction commits (at once outside a transaction).

    A broker that cannot be reached never raises into the caller (module docstring): the data
    is committed by then, and the sweeper sends the step later.
    """

    def send_or_leave_to_sweeper() -> None:
        try:
            send_step(operation_id, token, countdown, trace_parent, priority)
        except (BrokerError, OSError) as err:
            note_unsent(operation_id, err)

    # robust: anything else a publish raises is logged by Django rather than turned into a 500
    # for a request whose data is already committed.
    transaction.on_commit(send_or_leave_to_sweeper, robust=True)


def note_unsent(operation_id: str, err: BaseException) -> None:
    """Log that a step message was not sent (the error's class only: a broker error's text is
    not needed and a URL in it could carry a password) and tell the collector, if any."""
    log.warning(
        "step message not sent: the broker is unreachable; the sweeper sends it once it is back",
        extra={"operation": operation_id, "error": type(err).__name__},
    )
    unsent = _unsent.get()
    if unsent is not None:
        unsent.operations.append(operation_id)


def publish_after_commit(publish: Callable[[], None], *, what: str) -> None:
    """Run ``publish`` (a send that is not a step, e.g. a health round) after commit; a broker
    that cannot be reached is logged as ``what`` not sent, never raised into the request."""

    def publish_or_log() -> None:
        try:
            publish()
        except (BrokerError, OSError) as err:
            log.warning(
                "message not sent: the broker is unreachable",
                extra={"what": what, "error": type(err).__name__},
            )
            unsent = _unsent.get()
            if unsent is not None:
                unsent.other.append(what)

    transaction.on_commit(publish_or_log, robust=True)


@contextmanager
def collecting_unsent() -> Iterator[Unsent]:
    """Within the block, what could not be sent is recorded on the ``Unsent`` it yields."""
    found = Unsent()
    reset = _unsent.set(found)
    try:
        yield found
    finally:
        _unsent.reset(reset)
