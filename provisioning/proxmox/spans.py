"""One tracing span per Proxmox request (seed 000 entry 17's child spans; issue 13).

Tracing is optional: without the OpenTelemetry API installed (``requirements-otel.txt``) these
are no-ops, and with the API but no configured provider (``proxyhub.tracing`` sets one up only
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set) OpenTelemetry's own no-op tracer answers.

What a span carries is chosen, never copied wholesale from the call: the method, the path
template (``/nodes/{node}/qemu/{vmid}/config``, never the filled path with its query), the
call's name, the node, VMID and storage from the path, the HTTP status and the UPID. Never a
parameter, a body, an upload, a header (the token) or Proxmox's error text: the entry-20 rule
that cloud-init, the token, the CA and upload bodies go nowhere holds for spans too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the optional extra is not installed
    _trace = None  # type: ignore[assignment]


class TracedCall(Protocol):
    """What a span reads of ``api.Call`` (a protocol, so this module imports nothing of it)."""

    @property
    def name(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def path_params(self) -> Mapping[str, str]: ...


# Path parameters that identify what a request works on; the others (upid, volume) have
# attributes of their own or are left out.
_IDS = {"node": "proxmox.node", "vmid": "proxmox.vmid", "storage": "proxmox.storage"}


class RequestSpan:
    """What the client may add to a request's span once it is answered."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def answered(self, status: int, upid: str | None) -> None:
        if self._span is None:
            return
        self._span.set_attribute("http.response.status_code", status)
        if upid:
            self._span.set_attribute("proxmox.upid", upid)

    def failed(self, error: BaseException, status: int | None) -> None:
        """The class of the failure only: its text can quote what Proxmox said."""
        if self._span is None:
            return
        if status is not None:
            self._span.set_attribute("http.response.status_code", status)
        self._span.set_attribute("error.type", type(error).__name__)
        self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))


@contextmanager
def request_span(call: TracedCall, cluster: str) -> Iterator[RequestSpan]:
    if _trace is None:
        yield RequestSpan(None)
        return
    attributes: dict[str, str] = {
        "http.request.method": call.method,
        "url.template": call.path,
        "proxmox.call": call.name,
    }
    if cluster:
        attributes["proxmox.cluster"] = cluster
    for key, name in _IDS.items():
        if key in call.path_params:
            attributes[name] = str(call.path_params[key])
    tracer = _trace.get_tracer("proxyhub.proxmox")
    with tracer.start_as_current_span(
        f"{call.method} {call.path}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield RequestSpan(span)
