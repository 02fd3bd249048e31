"""Turning tracing on: OpenTelemetry spans sent over OTLP/HTTP, only when asked for.

Tracing is off unless the optional packages are installed (``pip install -r
requirements-otel.txt``) and ``OTEL_EXPORTER_OTLP_ENDPOINT`` names a collector; the exporter reads
that and the other standard ``OTEL_*`` variables itself. Each worker process configures it when
it starts (``proxyhub.celery``), after the fork, so the exporter's background thread lives in
the process that records the spans. What is traced and what never goes into a span is said in
``provisioning.services.tracing`` and ``provisioning.proxmox.spans``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from provisioning.services.tracing import reserved_ids

log = logging.getLogger("proxyhub.tracing")


def reserving_id_generator() -> Any:
    """The SDK's random ids, except for a root span whose ids an operation reserved."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ReservingIdGenerator(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            reserved = reserved_ids()
            return reserved[0] if reserved else super().generate_trace_id()

        def generate_span_id(self) -> int:
            reserved = reserved_ids()
            return reserved[1] if reserved else super().generate_span_id()

    return ReservingIdGenerator()


def tracer_provider(service_name: str, processors: list[Any]) -> Any:
    """A provider with proxyhub's id generator and the given span processors."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        id_generator=reserving_id_generator(),
    )
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def configure_tracing(service_name: str) -> bool:
    """Send spans to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when it is set; whether tracing is on."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the tracing packages are not installed "
            "(pip install -r requirements-otel.txt); tracing stays off"
        )
        return False
    provider = tracer_provider(service_name, [BatchSpanProcessor(OTLPSpanExporter())])
    trace.set_tracer_provider(provider)
    log.info("tracing on", extra={"service": service_name})
    return True
