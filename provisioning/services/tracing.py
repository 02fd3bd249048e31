"""Tracing the control loop: a span per operation, a child span per step (issue 13; seed 000
entry 17), and under each step the Proxmox requests' spans (``provisioning.proxmox.spans``).

An operation's steps run in many deliveries, often on different worker processes, so their
spans cannot nest in one process's context. Instead every operation reserves its span's ids
when it is created (``Operation.trace_parent``, a W3C ``traceparent``), the step messages carry
that context (``dispatch.send_step`` puts it in the Celery message's headers; the row is the
fallback for a message the sweeper re-sends), each step's span takes it as its parent, and the
operation's own span is recorded with those ids once the operation ends, from its creation to
its end. One create is then one trace, whichever workers ran its steps.

Attributes name the operation, its kind, its proxy, cluster and step, and how a step ended
(its error class, never its message). Tracing is optional and off unless configured
(``proxyhub.tracing``); without the OpenTelemetry API installed everything here is a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provisioning.models import Operation

    from .runners import Outcome

try:
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
except ImportError:  # the optional extra is not installed
    _trace = None  # type: ignore[assignment]

# (trace id, span id) the next root span must take: read by the id generator proxyhub.tracing
# installs, so the operation's span gets the ids its steps already named as their parent.
_reserved: ContextVar[tuple[int, int] | None] = ContextVar("proxyhub_reserved_ids", default=None)


def reserved_ids() -> tuple[int, int] | None:
    return _reserved.get()


def parse_trace_parent(text: str) -> tuple[int, int] | None:
    """(trace id, span id) of a ``00-<32 hex>-<16 hex>-<2 hex>`` traceparent, or None."""
    parts = text.split("-")
    if len(parts) != 4 or parts[0] != "00" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None
    return (trace_id, span_id) if trace_id and span_id else None


class StepSpan:
    """What the driver adds to a step's span once the step ran."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def ended(self, outcome: Outcome) -> None:
        if self._span is None:
            return
        result = outcome.result
        self._span.set_attribute("proxyhub.step.result", result.status)
        self._span.set_attribute("proxyhub.step.name", result.step)
        if result.upid:
            self._span.set_attribute("proxmox.upid", result.upid)
        if result.status == "error" and result.error is not None:
            self._span.set_attribute("error.type", result.error.kind)
            self._span.set_status(Status(StatusCode.ERROR, result.error.kind))


def _operation_attributes(op: Operation) -> dict[str, str]:
    attributes = {
        "proxyhub.operation.id": str(op.pk),
        "proxyhub.operation.kind": str(op.kind),
        "proxyhub.proxy": op.proxy_name,
    }
    if op.cluster_id is not None and op.cluster is not None:
        attributes["proxmox.cluster"] = op.cluster.name
    return attributes


@contextmanager
def step_span(op: Operation, trace_parent: str = "") -> Iterator[StepSpan]:
    """The span of the step about to run, a child of the operation's span."""
    if _trace is None:
        yield StepSpan(None)
        return
    carried = parse_trace_parent(trace_parent)
    ids = carried or parse_trace_parent(op.trace_parent)
    context = None
    if ids is not None:
        parent = SpanContext(ids[0], ids[1], is_remote=True, trace_flags=TraceFlags(0x01))
        context = _trace.set_span_in_context(NonRecordingSpan(parent), Context())
    stage = str(op.progress.get("stage", "start"))
    tracer = _trace.get_tracer("proxyhub.operations")
    with tracer.start_as_current_span(
        f"step {stage}",
        context=context,
        attributes={
            **_operation_attributes(op),
            "proxyhub.step.stage": stage,
            # Which worker process ran it, and whether the message carried the context (a
            # message the sweeper sent again has none: the journal's copy is used).
            "process.pid": os.getpid(),
            "proxyhub.trace.source": "message" if carried else "journal",
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield StepSpan(span)


@contextmanager
def probe_span(cluster: str) -> Iterator[None]:
    """A circuit probe's own trace: it serves every operation of the cluster, none in
    particular (services.circuit_probe), so its request span hangs under this root."""
    if _trace is None:
        yield
        return
    tracer = _trace.get_tracer("proxyhub.circuit")
    with tracer.start_as_current_span(
        "circuit probe", context=Context(), attributes={"proxmox.cluster": cluster}
    ):
        yield


def operation_span_end(op: Operation, state: str, finished_at: datetime) -> None:
    """Record the operation's own span now that it ended, with the ids its steps point to."""
    if _trace is None:
        return
    ids = parse_trace_parent(op.trace_parent)
    if ids is None:
        return
    token = _reserved.set(ids)
    try:
        span = _trace.get_tracer("proxyhub.operations").start_span(
            f"operation {op.kind}",
            context=Context(),  # a root: the trace is the operation's
            start_time=_nanoseconds(op.created_at),
            attributes={**_operation_attributes(op), "proxyhub.operation.state": state},
        )
    finally:
        _reserved.reset(token)
    if state != "succeeded":
        span.set_status(Status(StatusCode.ERROR, state))
    span.end(end_time=_nanoseconds(finished_at))


def _nanoseconds(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)
