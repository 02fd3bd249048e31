"""A loopback HTTP server that serves one cloud image, for template builds (issue 14).

The simulator's ``download-url`` fetches for real; tests point it here, on 127.0.0.1, so no
test reaches the internet. ``requests`` counts the GETs the node made.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ImageServer:
    data: bytes
    port: int = 0
    requests: list[str] = field(default_factory=list)

    def url(self, name: str = "debian-13-genericcloud-amd64.qcow2") -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    @property
    def checksum(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()


@contextmanager
def image_server(data: bytes | None = None) -> Iterator[ImageServer]:
    served = ImageServer(data if data is not None else os.urandom(4096))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(served.data)))
            self.end_headers()
            self.wfile.write(served.data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
