"""Response bodies exactly as pveproxy sends them (pve-reference §1.2-1.3)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .protocol import SimResponse

JSON_TYPE = "application/json;charset=UTF-8"
TEXT_TYPE = "text/plain;charset=UTF-8"


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def ok(data: Any, *, total: int | None = None) -> SimResponse:
    """``{"data": ...}`` plus ``total`` when the handler set one (the task log)."""
    payload: dict[str, Any] = {"data": data}
    if total is not None:
        payload["total"] = total
    return SimResponse(200, "OK", _dumps(payload), JSON_TYPE)


def reason_of(message: str) -> str:
    """The status line carries the first line of the message (pve-http-server ``response``)."""
    first = message.split("\n", 1)[0].strip()
    return first or "Error"


def error(
    status: int, message: str, errors: Mapping[str, str] | None = None, *, newline: bool = True
) -> SimResponse:
    """A handler's ``die``: ``{"data":null,"message":"<text>\\n"}`` (+ ``errors`` for 400).

    pve-manager's own 501 for an unknown method carries no newline (``newline=False``).
    """
    text = message if message.endswith("\n") or not newline else message + "\n"
    payload: dict[str, Any] = {"data": None, "message": text}
    if errors:
        payload["errors"] = dict(errors)
    return SimResponse(status, reason_of(message), _dumps(payload), JSON_TYPE)


def empty(status: int, reason: str) -> SimResponse:
    """Errors raised before a handler runs (401) and proxy errors (595/596): no body."""
    return SimResponse(status, reason, None, TEXT_TYPE)


def plain(status: int, text: str) -> SimResponse:
    """pveproxy's plain-text errors (``Unexpected content for method 'DELETE'``)."""
    return SimResponse(status, reason_of(text), text.encode("utf-8"), TEXT_TYPE)
