"""proxyhub's seam over the in-process simulator: the fast fake for unit and service tests.

``SimTransport`` is a ``provisioning.proxmox.api.Transport``: it hands each ``Call`` to
``pvesim.inprocess.call``, which builds exactly what the HTTPS client would put on the wire,
and reads the answer the way ``HttpTransport`` does: the JSON envelope on 2xx, ``ApiError``
with the body's ``message`` (else the reason phrase) otherwise. Faults are acted out against
the caller's deadline, so cancellation and expiry behave as they do over a socket.

It lives with the tests because it joins two things that must not know each other: pvesim
imports nothing of ``provisioning``, and ``provisioning`` never runs against its own test
double. ``benchmarks/`` import it from here as they import ``tests/integration/itstack.py``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from provisioning.proxmox.api import Api, Call, Response
from provisioning.proxmox.deadline import Deadline, effective
from provisioning.proxmox.errors import ApiError, ConnectFailed, RequestTimeout
from pvesim.engine import Engine
from pvesim.inprocess import Answer
from pvesim.inprocess import call as sim_call
from pvesim.simulator import Simulator


class SimTransport:
    """A ``provisioning.proxmox.api.Transport`` backed by an in-process engine."""

    def __init__(
        self, engine: Engine, *, token: str | None = None, request_timeout: float = 30.0
    ) -> None:
        self.engine = engine
        self._token = token
        self.request_timeout = request_timeout

    @property
    def token(self) -> str:
        """The token sent; by default the engine's current one (as if read from its file)."""
        return self._token if self._token is not None else self.engine.token

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        dl = effective(deadline)
        dl.check()
        upload = None if call.upload is None else (call.upload.filename, call.upload.content)
        answer = sim_call(
            self.engine, call.method, call.url_path(), call.params, token=self.token, upload=upload
        )
        if answer.delay > 0:
            dl.sleep(answer.delay)
        if answer.fault == "reset":
            raise ConnectFailed(f"{call.method} {call.path}: connection reset by peer")
        if answer.fault == "stall":
            dl.sleep(dl.timeout(self.request_timeout))
            raise RequestTimeout(
                f"{call.method} {call.path}: no answer within {self.request_timeout:g} s"
            )
        return _response(answer)


def _response(answer: Answer) -> Response:
    status = answer.status
    payload = answer.payload
    if 200 <= status < 300:
        if not isinstance(payload, dict) or "data" not in payload:
            raise ApiError(status, "the answer is not a Proxmox JSON envelope")
        total = payload.get("total")
        return Response(status, payload["data"], total if isinstance(total, int) else None)
    message = ""
    errors: dict[str, str] = {}
    if isinstance(payload, dict):
        if isinstance(payload.get("message"), str):
            message = payload["message"].rstrip("\n")
        if isinstance(payload.get("errors"), dict):
            errors = {str(k): str(v) for k, v in payload["errors"].items()}
    if not message:
        message = (answer.reason or "").strip()
    if not message and answer.body:
        message = answer.body.decode("utf-8", "replace").strip().splitlines()[0]
    if not message:
        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = f"HTTP {status}"
    raise ApiError(status, message, errors)


def sim_api(engine: Simulator | None = None, **engine_kwargs: Any) -> tuple[Api, Simulator]:
    """An ``Api`` over a fresh (or the given) simulator: ``api, engine = sim_api()``."""
    if engine is None:
        engine = Simulator(**engine_kwargs)
    elif engine_kwargs:
        raise TypeError("pass either an engine or engine arguments, not both")
    return Api(SimTransport(engine)), engine
