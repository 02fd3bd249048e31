"""The request and response shapes between the simulator's engine and its front ends.

The HTTPS server and the in-process entry point (``inprocess.call``) both turn what they
receive into a ``SimRequest`` and act on the ``SimResponse`` the engine returns, so the two
front ends cannot drift apart in what they accept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# A fault the front end must act out instead of (or after) answering normally:
# "reset"  - close the connection without an answer (the mutation may have been applied);
# "stall"  - hold the connection open without answering until the client gives up.
Fault = Literal["reset", "stall"]


@dataclass
class SimRequest:
    """One request as the engine sees it.

    ``path`` is the URL path as received, percent-encoded (``/api2/json/nodes/pve1/status``,
    ``/_sim/ledger``). ``query`` and ``form`` are the decoded query-string and body
    parameters; ``json_body`` is set instead of ``form`` for ``application/json`` bodies.
    ``headers`` has lower-case names. ``files`` maps a multipart field name to
    ``(filename, content)``. ``body_length`` is the raw body size (a GET or DELETE with a
    body is refused by Proxmox with 501).
    """

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    form: dict[str, str] = field(default_factory=dict)
    json_body: object | None = None
    headers: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    body_length: int = 0


@dataclass
class SimResponse:
    """The engine's answer.

    ``body`` is the exact bytes to send (``None`` for an empty body, as for 401). ``reason``
    is the HTTP reason phrase (Proxmox puts the first line of the error there). ``delay`` is
    how long the front end waits before answering (the 3 s 401 delay, injected latency);
    ``fault`` replaces or follows the answer as described for ``Fault``.
    """

    status: int
    reason: str
    body: bytes | None = None
    content_type: str = "application/json;charset=UTF-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    fault: Fault | None = None
