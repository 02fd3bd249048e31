"""The embedded broker (proxyhub.embedded_broker): kombu's filesystem transport with a publish
that a consumer can never see half written.

kombu 5.7's filesystem transport creates the message file in the queue folder and only then
writes its bytes. A worker polling the folder in between takes the empty file and dies with
"Unrecoverable error: JSONDecodeError" (celery/kombu#1551). CI saw exactly that: the browser
test's worker died and its three creates stayed Creating.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue
from kombu.transport import filesystem, virtual

from proxyhub.embedded_broker import Transport

TRANSPORT = "proxyhub.embedded_broker:Transport"


def _options(root: Path) -> dict[str, Any]:
    folders = {name: root / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "store_processed": False,
    }


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Callable[[Any], Connection]]:
    opened: list[Connection] = []

    def open_one(transport: Any) -> Connection:
        conn = Connection(
            "filesystem://localhost/", transport=transport, transport_options=_options(tmp_path)
        )
        # kombu keeps declared exchanges and bindings in one state per process, shared by every
        # connection; each connection here stands for a process of its own.
        conn.transport.state = virtual.BrokerState()
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.release()


def _after_first_create_under(
    root: Path, poll: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Run ``poll`` once, right after the first file under ``root`` is opened for writing: the
    moment another process can already see a new file that holds nothing yet. Returns the file
    it ran after."""
    fired: list[str] = []
    real_open = io.open

    def hooked_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        writing = any(flag in mode for flag in "wxa+")
        if writing and not fired and Path(file).resolve().is_relative_to(root.resolve()):
            fired.append(str(file))
            poll()
        return f

    monkeypatch.setattr(builtins, "open", hooked_open)
    monkeypatch.setattr(io, "open", hooked_open)  # Path.open's way in
    return fired


def _consume_during_publish(
    connect: Callable[[Any], Connection],
    transport: Any,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> list[Any]:
    """Publish one message while a second connection polls the queue just after the producer
    creates its file. Returns what that poll found; the message must still arrive, whole."""
    producer, consumer = connect(transport), connect(transport)
    inbox = consumer.SimpleQueue("steps")
    outbox = producer.SimpleQueue("steps")
    seen: list[Any] = []

    def poll() -> None:
        with contextlib.suppress(Empty):
            seen.append(inbox.get(block=False).payload)

    with monkeypatch.context() as patch:
        fired = _after_first_create_under(root / "queue", poll, patch)
        outbox.put({"operation_id": "a577ea33", "token": "6106fc62"})
    assert fired, "the publish wrote no file in the queue folder: the hook saw nothing"
    message = inbox.get(timeout=1)
    assert message.payload == {"operation_id": "a577ea33", "token": "6106fc62"}
    message.ack()
    return seen


def _bind_during_table_creation(
    connect: Callable[[Any], Connection],
    transport: Any,
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> set[str]:
    """Two processes bind queues to one exchange on a fresh folder at once (web and worker at
    start-up): the second binds just after the first creates the exchange's table. Returns the
    queues the table routes to afterwards."""
    exchange = Exchange("steps", type="direct")
    first, second = connect(transport), connect(transport)
    with monkeypatch.context() as patch:
        fired = _after_first_create_under(
            root / "control",
            lambda: Queue("beat", exchange, routing_key="beat")(second.default_channel).declare(),
            patch,
        )
        Queue("steps", exchange, routing_key="steps")(first.default_channel).declare()
    assert fired, "the declare wrote no table in the control folder: the hook saw nothing"
    return {binding.queue for binding in first.default_channel.get_table("steps")}


@pytest.mark.parametrize(
    "race", [_consume_during_publish, _bind_during_table_creation], ids=["message", "table"]
)
def test_kombus_own_transport_hands_the_racing_reader_an_empty_file(
    race: Callable[..., Any],
    connect: Callable[[Any], Connection],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defect itself, for a message and for an exchange table, so these tests notice if
    kombu ever fixes it (and the subclass can go)."""
    with pytest.raises(ValueError, match="Expecting value"):
        race(connect, filesystem.Transport, tmp_path, monkeypatch)


def test_a_poll_during_a_publish_finds_nothing_and_the_message_arrives_whole(
    connect: Callable[[Any], Connection], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _consume_during_publish(connect, TRANSPORT, tmp_path, monkeypatch) == []


def test_two_processes_binding_at_start_up_both_end_up_in_the_tables(
    connect: Callable[[Any], Connection], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _bind_during_table_creation(connect, TRANSPORT, tmp_path, monkeypatch) == {
        "steps",
        "beat",
    }


def test_the_settings_path_resolves_to_the_subclass(
    connect: Callable[[Any], Connection],
) -> None:
    conn = connect(TRANSPORT)
    assert conn.get_transport_cls() is Transport
    # The health view and kombu's own checks key on the driver type, which stays filesystem's.
    assert conn.transport.driver_type == "filesystem"


def test_busy_producers_and_a_polling_consumer_lose_and_mangle_nothing(
    connect: Callable[[Any], Connection], tmp_path: Path
) -> None:
    """Two publishing threads and one polling consumer, as the web process, Beat and a worker
    share the folder; every message arrives once, intact, and no partial file is left behind."""
    per_producer = 300
    received: list[Any] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def produce(name: str) -> None:
        with connect(TRANSPORT) as conn:
            queue = conn.SimpleQueue("steps")
            for number in range(per_producer):
                queue.put({"producer": name, "number": number, "pad": "x" * 2048})

    def consume() -> None:
        try:
            with connect(TRANSPORT) as conn:
                queue = conn.SimpleQueue("steps")
                while len(received) < 2 * per_producer:
                    try:
                        message = queue.get(timeout=0.01)
                    except Empty:
                        if done.is_set() and queue.qsize() == 0:
                            return
                        continue
                    received.append(message.payload)
                    message.ack()
        except BaseException as exc:  # the assertion below reports it
            failures.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    producers = [threading.Thread(target=produce, args=(name,)) for name in ("web", "beat")]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    done.set()
    consumer.join(timeout=60)

    assert failures == []
    assert sorted((m["producer"], m["number"]) for m in received) == sorted(
        (name, number) for name in ("web", "beat") for number in range(per_producer)
    )
    assert all(m["pad"] == "x" * 2048 for m in received)
    assert list((tmp_path / "queue").iterdir()) == []
