"""A command readies the broker before it writes (``dispatch.warm_sender``, issue 12).

A fresh process's first publish imported the broker transport, built Celery's task sender and
opened its connection after the operation had committed, and the first full collection of
Django's setup came due there too, so every ``proxies`` command left its first step due with no
message for 70-140 ms. These tests hold the warm-up to what it must do on the real Redis of the
test machine: do the first send's imports before it returns, leave a connected producer behind,
keep the command's message as it was, and change nothing (no error, no warning) when the broker
is down; and a command line's run keeps its setup out of the collector.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from kombu import pools
from pump import make_cluster
from redis_broker import broker, queue_messages

from provisioning.models import Operation
from provisioning.services import dispatch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What escaped any thread during the test (threading.excepthook)."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


# A fresh process, as a management command is: the warm-up, then its first send. It prints the
# modules that send still had to import.
FIRST_SEND = """
import json, sys
import django
django.setup()
from provisioning.services import dispatch
warm = dispatch.warm_sender()
warm.join(30)
before = set(sys.modules)
dispatch.send_step("00000000-0000-4000-8000-000000000001", "first", 0.0)
print(json.dumps(sorted(set(sys.modules) - before)))
"""

# A command line's run of ``proxies`` (its --help: no database needed), then the collector's
# frozen count.
COMMAND_LINE = """
import gc
import django
django.setup()
from provisioning.management.commands.proxies import Command
try:
    Command().run_from_argv(["manage.py", "proxies", "--help"])
except SystemExit:
    pass
print(gc.get_freeze_count())
"""


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_fresh_process_does_its_first_sends_imports_before_it_writes(
    live_broker: str, live_queue: Any, prod_env: dict[str, str], python: Callable[..., Any]
) -> None:
    """Done in the warm-up's thread, they raced the command's own work and were still going at
    its commit: its first step sat due with no message for 126-140 ms (services/dispatch.py)."""
    done = python({**prod_env, "REDIS_URL": live_broker}, "-c", FIRST_SEND)
    imported = json.loads(_last_line(done))
    assert imported == []
    steps = [m for m in queue_messages(live_queue) if m["queue"] == dispatch.STEP_QUEUE]
    assert [m["kwargs"]["token"] for m in steps] == ["first"]


def test_a_command_line_run_keeps_its_setup_out_of_the_collector(
    prod_env: dict[str, str], python: Callable[..., Any]
) -> None:
    """The first full collection after Django's setup took about 50 ms and came due between an
    operation's commit and its step's publish; a command line's process freezes what its setup
    made. A command called in a long-lived process (call_command) leaves the collector alone."""
    assert int(_last_line(python(prod_env, "-c", COMMAND_LINE))) > 0
    frozen = gc.get_freeze_count()
    call_command("proxies", "list", stdout=io.StringIO())
    assert gc.get_freeze_count() == frozen


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_warm_up_leaves_a_connected_producer_for_the_send(
    live_broker: str, live_queue: Any, thread_errors: list[BaseException]
) -> None:
    # kombu's connection pools are global, by broker URL: drop what earlier tests opened.
    pools.reset()
    with broker(live_broker) as app:
        with app.producer_pool.acquire(block=False) as producer:
            assert not producer.connection.connected  # a fresh app: nothing opened yet
        warm = dispatch.warm_sender()
        warm.join(timeout=30)
        assert not warm.is_alive()
        with app.producer_pool.acquire(block=False) as producer:
            assert producer.connection.connected
    assert thread_errors == []


def test_a_command_with_the_warm_up_sends_its_step_once_after_commit(
    live_broker: str, live_queue: Any, thread_errors: list[BaseException]
) -> None:
    make_cluster()
    with broker(live_broker):
        call_command(
            "proxies",
            "create",
            "gamma",
            *("--cluster", "pvesim", "--zone", "pve1"),
            *("--machine-type", "small", "--image", "debian-13"),
            stdout=io.StringIO(),
        )
    op = Operation.objects.get(proxy_name="gamma")
    steps = [m for m in queue_messages(live_queue) if m["queue"] == dispatch.STEP_QUEUE]
    assert [(m["task"], m["kwargs"]["operation_id"]) for m in steps] == [
        (dispatch.STEP_TASK, str(op.pk))
    ]
    # Sent as a message whose result nobody keeps: the send skips the result backend's notice
    # before it publishes (a first send's entry-point scan).
    assert steps[0]["headers"]["ignore_result"] is True
    assert thread_errors == []


def test_a_warm_up_against_a_broker_that_is_down_ends_quietly(
    caplog: pytest.LogCaptureFixture, thread_errors: list[BaseException]
) -> None:
    caplog.set_level(logging.DEBUG, logger="proxyhub.operations")
    with broker(f"redis://127.0.0.1:{_closed_port()}/0"):
        warm = dispatch.warm_sender()
        warm.join(timeout=45)
    assert not warm.is_alive()
    assert thread_errors == []
    # The send after commit reports a broker that is down (test_broker_down); the warm-up
    # only notes it for debugging, by the error's class.
    notes = [r for r in caplog.records if r.name == "proxyhub.operations"]
    assert [(r.levelno, r.getMessage(), r.error) for r in notes] == [  # type: ignore[attr-defined]
        (logging.DEBUG, "broker warm-up failed", "OperationalError")
    ]
