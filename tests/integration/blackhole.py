"""A cluster that is down in the expensive way: its address accepts connections, then nothing.

A refused connection fails in a millisecond; a host that accepts the TCP connection and never
answers (a hung pveproxy, a firewall that swallows the TLS handshake, a half-dead VPN) costs
every request its whole timeout. That is the outage a per-cluster circuit breaker exists for, so
the isolation test points a cluster at this server.

It listens on loopback in the test's own process, accepts every connection, never sends a byte,
and records when each connection was accepted and when the client gave up on it (so a test can
tell which requests reached the dead cluster, and when). Standard library only: the integration
tier's worker processes connect to it as they would to Proxmox.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Connection:
    """One connection a client opened: epoch seconds (comparable with PostgreSQL's ``now()``
    on this machine), ``closed`` once the client hung up."""

    accepted: float
    closed: float | None = None


class Blackhole:
    """Accept and hold every connection on ``127.0.0.1:<port>``; never answer.

    Use as a context manager; ``connections`` is safe to read at any time (a copy).
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._seen: list[Connection] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="blackhole", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def connections(self) -> list[Connection]:
        with self._lock:
            return [Connection(c.accepted, c.closed) for c in self._seen]

    def __enter__(self) -> Blackhole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    if key.data is None:
                        self._accept(selector)
                    else:
                        self._drain(selector, key.fileobj, key.data)  # type: ignore[arg-type]
        finally:
            for key in list(selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _ = self._listener.accept()
            conn.setblocking(False)
            record = Connection(time.time())
            with self._lock:
                self._seen.append(record)
            selector.register(conn, selectors.EVENT_READ, record)

    def _drain(
        self, selector: selectors.BaseSelector, conn: socket.socket, record: Connection
    ) -> None:
        """Read and drop what the client sends (its TLS ClientHello); notice when it hangs up."""
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return
        with self._lock:
            record.closed = time.time()
        selector.unregister(conn)
        conn.close()
