"""Tracing with real workers (issue 13): the steps of one create, run by two worker processes
that pass the operation's trace context to each other in the Celery messages, form one trace.

The workers send their spans over OTLP/HTTP, as in production, to a receiver this test runs on
loopback (it decodes OpenTelemetry's protobuf export requests). The session's untraced worker
is stopped meanwhile, so every step runs on one of the two traced ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from itstack import Stack, Worker, wait_until
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from provisioning.services.tracing import parse_trace_parent

pytestmark = pytest.mark.integration

PROXIES = 4


@dataclass(frozen=True)
class Received:
    trace_id: int
    span_id: int
    parent_id: int
    name: str
    attributes: dict[str, Any]


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1 that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        lock = threading.Lock()
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            spans.extend(_received(span) for span in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _received(span: Any) -> Received:
    attributes: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        is_int = value.HasField("int_value")
        attributes[item.key] = value.int_value if is_int else value.string_value
    return Received(
        int.from_bytes(span.trace_id, "big"),
        int.from_bytes(span.span_id, "big"),
        int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else 0,
        span.name,
        attributes,
    )


@pytest.fixture
def traced_workers(stack: Stack, _main_worker: Worker) -> Iterator[tuple[Collector, list[Worker]]]:
    _main_worker.stop()  # the next test's `worker` fixture starts it again
    with Collector() as collector:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        workers = [stack.worker(f"traced-{i}", concurrency=1, env=env) for i in (1, 2)]
        try:
            yield collector, workers
        finally:
            for worker in workers:
                worker.stop()
                stack.workers.remove(worker)


def test_the_steps_of_a_create_on_two_workers_form_one_trace_under_its_operation(
    stack: Stack, traced_workers: tuple[Collector, list[Worker]]
) -> None:
    collector, _ = traced_workers
    stack.create_proxies("--count", str(PROXIES), "--prefix", "trc")
    names = [f"trc-{i}" for i in range(1, PROXIES + 1)]
    stack.wait_phase(names, "Running", timeout=120)
    with psycopg.connect(stack.env["DATABASE_URL"], autocommit=True) as conn:
        rows = conn.execute(
            "SELECT proxy_name, trace_parent FROM provisioning_operation "
            "WHERE proxy_name LIKE 'trc-%%' AND kind = 'create'"
        ).fetchall()
    reserved = {name: parse_trace_parent(parent) for name, parent in rows}
    assert sorted(reserved) == names and all(reserved.values())

    def roots_arrived() -> bool:
        ids = {(s.trace_id, s.span_id) for s in collector.spans if s.name == "operation create"}
        return all(r in ids for r in reserved.values())

    wait_until(roots_arrived, timeout=30, interval=0.2, what="every operation's span")
    pids: set[int] = set()
    two_workers_in_one_trace = 0
    for name, ids in reserved.items():
        assert ids is not None
        trace_id, operation_span = ids
        ours = [s for s in collector.spans if s.trace_id == trace_id]
        (root,) = [s for s in ours if s.parent_id == 0]
        assert (root.span_id, root.attributes["proxyhub.proxy"]) == (operation_span, name)
        steps = [s for s in ours if s.name.startswith("step ")]
        assert len(steps) >= 5 and {s.parent_id for s in steps} == {operation_span}
        assert {s.attributes["proxyhub.trace.source"] for s in steps} == {"message"}
        step_ids = {s.span_id for s in steps}
        requests = [s for s in ours if "url.template" in s.attributes]
        assert requests and {s.parent_id for s in requests} <= step_ids
        assert len(ours) == 1 + len(steps) + len(requests)
        ran_on = {int(s.attributes["process.pid"]) for s in steps}
        pids |= ran_on
        two_workers_in_one_trace += len(ran_on) > 1
    assert len(pids) == 2, "both workers ran steps"
    assert two_workers_in_one_trace >= 1, "some create's steps ran on both workers"
    stack.manage("proxies", "delete", *names)
    stack.wait_phase(names, "Deleted", timeout=60)
