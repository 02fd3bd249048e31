"""The simulator's HTTPS front end: what pveproxy does before and after an API handler runs.

It turns each HTTP request into a ``SimRequest``, asks the engine for a ``SimResponse`` and writes
it back the way pveproxy does (pve-reference §1.2, §1.3): the reason phrase carries the first line
of the error, ``Server: pve-api-daemon/3.0``, no caching. It also acts out the engine's faults:
``reset`` drops the connection with a TCP RST and no answer, ``stall`` holds it silently.

Uploads are parsed the way pveproxy's streaming parser reads them (pve-reference §7.7): the
text parts ``content``, ``checksum-algorithm``, ``checksum`` first, then exactly one file part
named ``filename``. The body is read from the socket chunk by chunk, never as a whole, so a large
upload costs its own size once and nothing more.

Nothing here logs a body, a header value or a parameter: upload content, cloud-init and the
token's secret all pass through this module.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import select
import socket
import socketserver
import ssl
import struct
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from .protocol import SimRequest, SimResponse

log = logging.getLogger("proxyhub.pvesim.http")

SERVER_HEADER = "pve-api-daemon/3.0"
# pve-reference §1.1: larger non-upload bodies are refused with 501.
MAX_BODY_BYTES = 512 * 1024
# Uploads are held in memory by the simulator; a seed ISO is ~400 KiB, so this is generous.
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
# Multipart text parts and part headers are small by nature; a huge one is malformed.
MAX_TEXT_PART_BYTES = 64 * 1024
MAX_PART_HEADER_BYTES = 8 * 1024
# The order pveproxy's streaming upload parser accepts text parts in (pve-reference §7.7).
UPLOAD_TEXT_FIELDS = ("content", "checksum-algorithm", "checksum")
UPLOAD_FILE_FIELD = "filename"
# A stalled connection is held until the client leaves or the server stops, never forever.
STALL_CAP_SECONDS = 120.0
HANDSHAKE_TIMEOUT_SECONDS = 10.0
KEEPALIVE_IDLE_SECONDS = 60.0
READ_CHUNK = 64 * 1024


class Engine(Protocol):
    """What the server needs from the state engine."""

    def handle(self, request: SimRequest) -> SimResponse: ...


class RequestRejected(Exception):
    """A request pveproxy refuses before any API handler runs (plain-text answer)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# --- multipart ---------------------------------------------------------------------------------


class _BodyReader:
    """Reads exactly ``length`` bytes of a request body from ``rfile``, in chunks."""

    def __init__(self, rfile: IO[bytes] | io.BufferedIOBase, length: int) -> None:
        self.rfile = rfile
        self.remaining = length

    def read(self, limit: int = READ_CHUNK) -> bytes:
        if self.remaining <= 0:
            return b""
        chunk = self.rfile.read(min(limit, self.remaining))
        if not chunk:
            raise RequestRejected(400, "unexpected end of request body")
        self.remaining -= len(chunk)
        return chunk

    def drain(self) -> None:
        while self.remaining > 0:
            self.read()


def _disposition(headers: dict[str, str]) -> tuple[str | None, str | None]:
    """``name`` and ``filename`` of a part's ``Content-Disposition`` header."""
    value = headers.get("content-disposition", "")
    name = filename = None
    for item in value.split(";")[1:]:
        key, _, raw = item.strip().partition("=")
        raw = raw.strip()
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            raw = raw[1:-1].replace('\\"', '"')
        if key.lower() == "name":
            name = raw
        elif key.lower() == "filename":
            filename = raw
    return name, filename


class MultipartParser:
    """A streaming ``multipart/form-data`` parser with pveproxy's upload rules.

    Returns the text fields and the single file part. The body is consumed chunk by chunk: the
    buffer never holds more than one chunk plus a delimiter's length beyond the part being
    collected, whatever the total size.
    """

    def __init__(self, body: _BodyReader, boundary: bytes, max_file_bytes: int) -> None:
        self.body = body
        self.delimiter = b"--" + boundary
        self.max_file_bytes = max_file_bytes
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.body.read()
        self.buffer += chunk
        return bool(chunk)

    def _read_until(self, marker: bytes, limit: int, sink: Callable[[bytes], None] | None) -> None:
        """Consume up to and including ``marker``; pass what comes before it to ``sink``."""
        taken = 0
        while True:
            at = self.buffer.find(marker)
            if at >= 0:
                data, self.buffer = self.buffer[:at], self.buffer[at + len(marker) :]
                taken += len(data)
                if taken > limit:
                    raise RequestRejected(501, "for data too large")
                if sink:
                    sink(data)
                return
            # Keep a tail that could be the start of the marker; hand on the rest.
            keep = len(marker) - 1
            if len(self.buffer) > keep:
                data, self.buffer = self.buffer[:-keep], self.buffer[-keep:]
                taken += len(data)
                if taken > limit:
                    raise RequestRejected(501, "for data too large")
                if sink:
                    sink(data)
            if not self._fill():
                raise RequestRejected(400, "malformed multipart body")

    def _read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise RequestRejected(400, "malformed multipart body")
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _part_headers(self) -> dict[str, str]:
        raw: list[bytes] = []
        self._read_until(b"\r\n\r\n", MAX_PART_HEADER_BYTES, raw.append)
        headers: dict[str, str] = {}
        for line in b"".join(raw).decode("utf-8", "replace").split("\r\n"):
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        return headers

    def parse(self) -> tuple[dict[str, str], tuple[str, str, bytes] | None]:
        """``(text fields, (field name, filename, content) of the file part or None)``."""
        fields: dict[str, str] = {}
        upload: tuple[str, str, bytes] | None = None
        expected = list(UPLOAD_TEXT_FIELDS)
        self._read_until(self.delimiter, MAX_PART_HEADER_BYTES, None)  # the preamble
        while True:
            if self._read_exact(2) == b"--":
                break  # the closing delimiter
            headers = self._part_headers()
            name, filename = _disposition(headers)
            separator = b"\r\n" + self.delimiter
            if upload is None and filename is None and name in expected:
                # Text parts are accepted only before the file, in pveproxy's order.
                del expected[: expected.index(name) + 1]
                chunks: list[bytes] = []
                self._read_until(separator, MAX_TEXT_PART_BYTES, chunks.append)
                fields[name] = b"".join(chunks).decode("utf-8", "replace")
            elif upload is None:
                if name != UPLOAD_FILE_FIELD:
                    raise RequestRejected(
                        500, f"wrong field name '{name}' for file upload, expected 'filename'"
                    )
                content: list[bytes] = []
                self._read_until(separator, self.max_file_bytes, content.append)
                upload = (name, filename or "", b"".join(content))
            else:
                # pveproxy stops reading form fields once the file is complete.
                self._read_until(separator, self.max_file_bytes, None)
        self.body.drain()  # the epilogue
        return fields, upload


# --- the request handler -----------------------------------------------------------------------


def _content_type(value: str) -> tuple[str, dict[str, str]]:
    kind, *params = value.split(";")
    options: dict[str, str] = {}
    for param in params:
        key, _, raw = param.strip().partition("=")
        options[key.lower()] = raw.strip().strip('"')
    return kind.strip().lower(), options


def _reason(text: str) -> str:
    """A reason phrase safe for a status line: first line only, Latin-1 (pve-reference §1.3)."""
    first = text.splitlines()[0] if text else ""
    return first.encode("latin-1", "replace").decode("latin-1")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = KEEPALIVE_IDLE_SECONDS
    # Headers and body leave in separate writes; with Nagle on, the body would wait for the
    # client's delayed ACK (~40 ms per request on loopback).
    disable_nagle_algorithm = True
    server: _TLSServer

    def version_string(self) -> str:
        return SERVER_HEADER

    def log_message(self, format: str, *args: Any) -> None:
        # The request line holds no secret (the token travels in a header); still DEBUG only.
        log.debug("pvesim %s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    # --- request ---------------------------------------------------------------------------

    def _read_request(self) -> SimRequest:
        split = urlsplit(self.path)
        headers: dict[str, str] = {}
        for key, value in self.headers.items():
            key = key.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        request = SimRequest(
            method=self.command,
            path=split.path,
            query=dict(parse_qsl(split.query, keep_blank_values=True)),
            headers=headers,
        )
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.close_connection = True
            raise RequestRejected(501, "chunked transfer encoding not supported")
        try:
            length = int(headers.get("content-length", "0") or "0")
        except ValueError:
            self.close_connection = True
            raise RequestRejected(400, "bad Content-Length") from None
        request.body_length = length
        if length <= 0:
            return request
        kind, options = _content_type(headers.get("content-type", ""))
        body = _BodyReader(self.rfile, length)
        if kind == "multipart/form-data":
            boundary = options.get("boundary", "")
            if not boundary:
                self._discard(body)
                raise RequestRejected(400, "missing multipart boundary")
            parser = MultipartParser(body, boundary.encode("latin-1"), self.server.max_upload_bytes)
            try:
                fields, upload = parser.parse()
            except RequestRejected:
                self._discard(body)
                raise
            request.form = fields
            if upload is not None:
                field_name, filename, content = upload
                request.files[field_name] = (filename, content)
            return request
        if length > MAX_BODY_BYTES:
            self._discard(body)
            raise RequestRejected(501, "for data too large")
        raw = body.read(length)
        while body.remaining:
            raw += body.read()
        if kind == "application/json":
            try:
                request.json_body = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                raise RequestRejected(400, "unable to parse JSON request body") from None
        else:
            # No content type means form encoding to Proxmox (pve-reference §1.1).
            request.form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
        return request

    def _discard(self, body: _BodyReader) -> None:
        """Read and drop what is left of a refused body so the answer reaches the client."""
        if body.remaining > self.server.max_upload_bytes:
            self.close_connection = True
            return
        try:
            body.drain()
        except (OSError, RequestRejected):
            self.close_connection = True

    # --- response --------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            request = self._read_request()
        except RequestRejected as exc:
            self._write(SimResponse(exc.status, exc.reason, exc.reason.encode(), "text/plain"))
            return
        except (OSError, ssl.SSLError):
            self.close_connection = True
            return
        try:
            response = self.server.engine.handle(request)
        except Exception:
            log.exception("pvesim engine failed on %s %s", request.method, request.path)
            response = SimResponse(500, "internal simulator error", None)
        if response.delay > 0 and self.server.stopping.wait(response.delay):
            self._abort()
            return
        if response.fault == "reset":
            self._abort()
            return
        if response.fault == "stall":
            self._stall()
            self._abort()
            return
        self._write(response)

    def _write(self, response: SimResponse) -> None:
        body = response.body or b""
        self.send_response(response.status, _reason(response.reason))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        self.send_header("Expires", formatdate(time.time(), usegmt=True))
        if body:
            self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in response.headers.items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _stall(self) -> None:
        """Hold the connection without answering until the client leaves or the server stops."""
        deadline = time.monotonic() + STALL_CAP_SECONDS
        sock = self.connection
        while time.monotonic() < deadline and not self.server.stopping.is_set():
            try:
                readable, _, _ = select.select([sock], [], [], 0.2)
            except (OSError, ValueError):
                return
            if readable:
                try:
                    if not sock.recv(4096):
                        return  # the client closed its side
                except ssl.SSLWantReadError:
                    continue
                except (OSError, ValueError):
                    return

    def _abort(self) -> None:
        """Close with a TCP RST and no answer: SO_LINGER 0, no TLS close_notify."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.server.drop(self.connection)


# --- the server --------------------------------------------------------------------------------


class _TLSServer(ThreadingHTTPServer):
    """A threading HTTP server that does the TLS handshake in each connection's thread."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        address: tuple[str, int],
        engine: Engine,
        context: ssl.SSLContext,
        max_upload_bytes: int,
    ) -> None:
        self.engine = engine
        self.context = context
        self.max_upload_bytes = max_upload_bytes
        self.stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS round trip we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs here, in the connection's own thread, so a slow or silent client
        # never holds up the accept loop.
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        tls.settimeout(None)
        with self._lock:
            if self.stopping.is_set():
                tls.close()
                return
            self._connections.add(tls)
        try:
            _Handler(tls, client_address, self)
        except (OSError, ssl.SSLError):
            pass  # the client went away mid-request
        finally:
            self.drop(tls)

    def drop(self, sock: socket.socket) -> None:
        """Forget and close a connection (idempotent)."""
        with self._lock:
            self._connections.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close_connections(self) -> None:
        """Wake every thread blocked on a connection; they then close it themselves."""
        with self._lock:
            live = list(self._connections)
        for sock in live:
            # The plain socket call: SSLSocket.shutdown would tear down the TLS object under a
            # thread that may be reading from it.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _TLSServer6(_TLSServer):
    address_family = socket.AF_INET6


class SimServer:
    """The simulator over HTTPS: ``SimServer(engine, certfile=..., keyfile=...).start()``.

    The listening socket is bound in the constructor, so ``url`` holds the real port (``port=0``
    picks a free one) before ``start``.
    """

    def __init__(
        self,
        engine: Engine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        certfile: str,
        keyfile: str,
        max_upload_bytes: int = MAX_UPLOAD_BYTES,
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certfile, keyfile)
        server_class = _TLSServer6 if ":" in host else _TLSServer
        self._server = server_class((host, port), engine, context, max_upload_bytes)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)  # noqa: S104
        if ":" in host:
            host = f"[{host}]"
        return f"https://{host}:{self.port}"

    def start(self) -> SimServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"pvesim-https-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop promptly: no new connections, stalled and idle ones closed."""
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
        self._server.close_connections()

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
