"""The simulator in-process, without HTTP: one API call in, the answer out as plain data.

``call`` builds exactly what an HTTPS client puts on the wire for one API call (``/api2/json``
+ the encoded path; GET/DELETE parameters in the query, POST/PUT parameters in the form body, an
upload as the multipart file part ``filename``; the ``PVEAPIToken`` header), hands it to the
engine and returns what came back: status, reason phrase, the JSON body decoded, and what the
HTTPS server would act out instead of a plain answer (a delay to hold, a ``reset`` or a
``stall``).

It knows no client library. A client adapts its own seam to it beside that client's tests:
proxyhub's ``SimTransport`` is ``tests/support/simtransport.py``, which keeps pvesim free of
any import of ``provisioning``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from .engine import API_PREFIX, Engine
from .protocol import Fault, SimRequest


@dataclass(frozen=True)
class Answer:
    """One answer as a client reads it off the wire.

    ``payload`` is the body decoded when it is JSON (the ``{"data": ...}`` envelope, or an
    error's ``message`` and ``errors``), else ``None``; ``body`` is the raw bytes (empty for no
    body). ``delay`` is how long the server would hold the answer back; ``fault`` is what it
    would do to the connection instead (see ``protocol.Fault``).
    """

    status: int
    reason: str
    payload: Any
    body: bytes
    delay: float
    fault: Fault | None


def call(
    engine: Engine,
    method: str,
    path: str,
    params: Mapping[str, Any],
    *,
    token: str,
    upload: tuple[str, bytes] | None = None,
) -> Answer:
    """One API call: ``path`` is below ``/api2/json`` and already percent-encoded
    (``/nodes/pve1/tasks/UPID%3A.../status``); ``upload`` is ``(filename, content)``."""
    method = method.upper()
    request = SimRequest(
        method=method,
        path=API_PREFIX + path,
        headers={"authorization": f"PVEAPIToken={token}", "accept": "application/json"},
    )
    if method in ("GET", "DELETE", "HEAD"):
        request.query = dict(params)
    else:
        request.form = dict(params)
        request.body_length = len(urlencode(list(params.items()), quote_via=quote))
    if upload is not None:
        request.files = {"filename": upload}
        request.body_length += len(upload[1])
    response = engine.handle(request)
    body = response.body or b""
    payload: Any = None
    if body and response.content_type.startswith("application/json"):
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
    return Answer(response.status, response.reason, payload, body, response.delay, response.fault)
