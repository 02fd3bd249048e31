"""Tracing (issue 13; seed 000 entry 17): one create is one trace, an operation span with a
child span per step and, under each step, a span per Proxmox request; no secret in any span.

The spans go to OpenTelemetry's in-memory exporter through the provider proxyhub.tracing builds
for production (its id generator is what lets the operation's span take the ids its steps
already point to). The message that carries the trace context between workers is the pump's
here and Celery's in tests/integration/test_tracing_across_workers.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation
from provisioning.models.choices import OperationState
from provisioning.services import operations
from provisioning.services.operations import ProxySpec
from provisioning.services.tracing import parse_trace_parent
from proxyhub.tracing import tracer_provider

pytestmark = pytest.mark.django_db

CANARY = b"#cloud-config\nwrite_files: [{content: trace-canary-5e0b1c}]\n"
# Everything a request span may carry; anything else would be a leak waiting to happen.
REQUEST_ATTRIBUTES = {
    "http.request.method",
    "url.template",
    "proxmox.call",
    "proxmox.cluster",
    "proxmox.node",
    "proxmox.vmid",
    "proxmox.storage",
    "http.response.status_code",
    "proxmox.upid",
    "error.type",
}


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """The process's tracer provider for this module only (OpenTelemetry allows setting it
    once per process, so the module puts the unset state back when it is done)."""
    memory = InMemorySpanExporter()
    trace.set_tracer_provider(tracer_provider("proxyhub-test", [SimpleSpanProcessor(memory)]))
    yield memory
    memory.shutdown()
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


def _spec(sim: Sim, name: str = "traced", **kwargs: Any) -> ProxySpec:
    return proxy_spec(sim, name, **{"cloud_init": CANARY, **kwargs})


def _trace_of(op: Operation, finished: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    ids = parse_trace_parent(op.trace_parent)
    assert ids is not None
    return [s for s in finished if s.context is not None and s.context.trace_id == ids[0]]


def test_one_create_is_one_trace_of_operation_steps_and_requests(
    pump: Pump, sim: Sim, spans: InMemorySpanExporter
) -> None:
    op = pump.call(operations.proxy_create, spec=_spec(sim))
    assert {m.trace_parent for m in pump.queue} == {op.trace_parent}  # the message carries it
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    finished = spans.get_finished_spans()
    ours = _trace_of(op, finished)
    # Besides the create's trace only the cold cluster's circuit probe, a trace of its own.
    others = [s for s in finished if s not in ours]
    roots = [s.name for s in others if s.parent is None]
    assert roots == ["circuit probe"] and len(others) == 2, [s.name for s in others]

    (root,) = [s for s in ours if s.parent is None]
    reserved = parse_trace_parent(op.trace_parent)
    assert root.context is not None and reserved is not None
    assert (root.name, root.context.span_id) == ("operation create", reserved[1])
    assert root.attributes is not None
    assert root.attributes["proxyhub.operation.state"] == "succeeded"
    assert root.attributes["proxyhub.proxy"] == "traced"
    assert root.start_time is not None and root.end_time is not None
    assert root.end_time - root.start_time > 0

    steps = [s for s in ours if s.name.startswith("step ")]
    assert len(steps) == op.steps.count() or len(steps) >= 5
    assert {s.parent.span_id for s in steps if s.parent} == {reserved[1]}
    assert all(s.parent is not None for s in steps)
    step_ids = {s.context.span_id for s in steps if s.context}

    requests = [s for s in ours if s.kind == SpanKind.CLIENT]
    assert requests and all(s.parent is not None and s.parent.span_id in step_ids for s in requests)
    assert len(ours) == 1 + len(steps) + len(requests)
    (clone,) = [
        s
        for s in requests
        if (s.attributes or {}).get("url.template") == "/nodes/{node}/qemu/{vmid}/clone"
    ]
    attributes = clone.attributes or {}
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.response.status_code"] == 200
    assert str(attributes["proxmox.upid"]).startswith("UPID:pve1:")
    assert attributes["proxmox.node"] == "pve1" and attributes["proxmox.cluster"] == "pvesim"
    for span in requests:
        assert set(span.attributes or {}) <= REQUEST_ATTRIBUTES, span.name


def test_no_span_carries_cloud_init_a_body_or_the_token(
    pump: Pump, sim: Sim, spans: InMemorySpanExporter
) -> None:
    """The canary cloud-init goes into the seed ISO that is uploaded; neither it nor the
    upload's bytes nor the token reach a span's name, attributes, events or status."""
    op = pump.call(operations.proxy_create, spec=_spec(sim, "canary"))
    pump.run()
    op.refresh_from_db()
    text = "\n".join(s.to_json() for s in spans.get_finished_spans())
    assert "url.template" in text and "upload" in text  # the upload was traced ...
    for secret in ("trace-canary-5e0b1c", "cloud-config", "PVEAPIToken", "write_files"):
        assert secret not in text  # ... and nothing of what it carried


def test_a_failed_operation_ends_its_span_with_an_error(
    pump: Pump, sim: Sim, spans: InMemorySpanExporter
) -> None:
    op = pump.call(operations.proxy_create, spec=_spec(sim, "doomed", image="debian-13-cloudinit"))
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.FAILED
    ours = _trace_of(op, spans.get_finished_spans())
    (root,) = [s for s in ours if s.parent is None]
    assert root.status.status_code == StatusCode.ERROR
    assert (root.attributes or {})["proxyhub.operation.state"] == "failed"
    (failed_step,) = [
        s for s in ours if s.name.startswith("step ") and s.status.status_code == StatusCode.ERROR
    ]
    assert (failed_step.attributes or {})["error.type"] == "permanent"
    assert "cloud-init drive" not in root.to_json() + failed_step.to_json()  # class, not message


def test_a_superseded_operation_still_records_its_span(
    pump: Pump, sim: Sim, spans: InMemorySpanExporter
) -> None:
    """An operation ended by a newer intent (a delete superseding a create) ends its trace
    too: its span is recorded, as failed, when the delete is committed."""
    create = pump.call(operations.proxy_create, spec=_spec(sim, "shortlived"))
    pump.queue.clear()
    from provisioning.models import Proxy

    delete = pump.call(operations.proxy_request_delete, proxy=Proxy.objects.get())
    create.refresh_from_db()
    assert create.state == OperationState.FAILED and "superseded" in create.last_error
    (root,) = [s for s in _trace_of(create, spans.get_finished_spans()) if s.parent is None]
    assert (root.name, (root.attributes or {})["proxyhub.operation.state"]) == (
        "operation create",
        "failed",
    )
    assert delete.trace_parent != create.trace_parent  # each operation is a trace of its own
