"""A loopback black hole: a host that accepts connections and never answers.

The expensive way for a Proxmox cluster to be unreachable. A refused connection fails in
microseconds; a host that accepts TCP, completes TLS and then says nothing holds the client
until its request timeout (``requestTimeoutSeconds``, 30 s by default). That is what a
pveproxy behind a hung storage mount or an overloaded node looks like, and what the cluster
isolation benchmark (benchmarks/isolation.py) puts beside a healthy cluster.

With ``cert_file``/``key_file`` it completes the TLS handshake (the simulator's server
certificate does: it is issued for 127.0.0.1 by the CA the catalogue trusts), reads the request
and never replies; without them it accepts TCP and never even answers the handshake, which the
client gives up on after its connect timeout (10 s) instead. Every connection is recorded: when
it came, how many bytes it sent, when the client gave up. Standard library only.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Connection:
    accepted: float  # time.time() when accepted
    handshake: bool = False  # TLS completed (always False without TLS)
    received: int = 0  # bytes of request read
    closed: float | None = None  # when the client hung up (or the black hole stopped)

    @property
    def held_seconds(self) -> float | None:
        return None if self.closed is None else self.closed - self.accepted


class BlackHole:
    """``with BlackHole(...) as hole: hole.url``; ``hole.connections`` lists what came."""

    def __init__(
        self,
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._context: ssl.SSLContext | None = None
        if cert_file is not None:
            self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)
        self.host, self.port = self._listener.getsockname()[:2]
        self.connections: list[Connection] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"{'https' if self._context else 'http'}://{self.host}:{self.port}"

    def __enter__(self) -> BlackHole:
        accept = threading.Thread(target=self._accept, name="blackhole-accept", daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def snapshot(self) -> list[Connection]:
        with self._lock:
            return [Connection(**vars(c)) for c in self.connections]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = Connection(accepted=time.time())
            with self._lock:
                self.connections.append(record)
                self._sockets.append(sock)
            hold = threading.Thread(
                target=self._hold, args=(sock, record), name="blackhole-hold", daemon=True
            )
            hold.start()
            self._threads.append(hold)

    def _hold(self, sock: socket.socket, record: Connection) -> None:
        """Take what the client sends and never answer, until it hangs up."""
        conn: socket.socket = sock
        try:
            conn.settimeout(0.5)
            if self._context is not None:
                conn = self._handshake(sock)
                record.handshake = True
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except (TimeoutError, ssl.SSLWantReadError):
                    continue
                if not data:
                    break
                record.received += len(data)
        except (OSError, ssl.SSLError):
            pass
        finally:
            record.closed = time.time()
            with contextlib.suppress(OSError):
                conn.close()

    def _handshake(self, sock: socket.socket) -> socket.socket:
        assert self._context is not None
        tls = self._context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            self._sockets.append(tls)
        while not self._stop.is_set():
            try:
                tls.do_handshake()
                return tls
            except (TimeoutError, ssl.SSLWantReadError):
                continue
        raise OSError("stopped")
