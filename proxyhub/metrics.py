"""Prometheus metrics: database gauges read at scrape time, process counters for the rest.

Two kinds of numbers:

* what the database says now (proxies by phase and cluster, operations by kind and state):
  ``DatabaseCountCollector`` counts rows when /metrics is scraped, so there is nothing to keep
  in sync and every process reports the same truth; the journal of operations only grows, so
  ``OperationCountCollector`` counts its finished rows from a summary kept a few seconds
  (``PROXYHUB_METRICS_SUMMARY_SECONDS``) and only the few in-flight rows at every scrape;
* what processes did (Proxmox requests, step durations): counters and histograms that the code
  feeds through ``record_proxmox_call`` and ``record_step``. Proxmox calls happen in Celery
  workers, so these use prometheus_client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR``
  is set (settings sets it by default): every process writes its values to files in that
  directory and /metrics adds them up, worker metrics included.

``provisioning/proxmox`` must not import Django, so it does not call ``record_proxmox_call``
itself: it logs one "proxmox api call" line per request (seed 000 entry 20), and
``ProxmoxCallMetricsHandler``, attached to its logger in settings, turns those lines into metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import FieldError
from django.db import DatabaseError
from django.db.models import Count
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

log = logging.getLogger(__name__)

# Proxmox answers most GETs in milliseconds; uploads and a busy pvedaemon take seconds; the
# provider's request timeout defaults to 30 s (seed 000 entry 15).
_PROXMOX_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# A step is one short idempotent action (DESIGN §6), bounded by the 180 s hard time limit.
_STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 180)

PROXMOX_REQUESTS = Counter(
    "proxmox_requests",
    "Proxmox API requests by call and HTTP status (or error class when no answer came).",
    ["call", "status"],
)
PROXMOX_REQUEST_SECONDS = Histogram(
    "proxmox_request_seconds",
    "Proxmox API request latency by call.",
    ["call"],
    buckets=_PROXMOX_BUCKETS,
)
PROXMOX_TRANSIENT_FAULTS = Counter(
    "proxyhub_proxmox_transient_faults",
    "Proxmox requests that met a transient fault (a 5xx, a reset, a timeout), by cluster and "
    "call; a read retried in place counts once per fault.",
    ["cluster", "call"],
)
OPERATION_STEP_SECONDS = Histogram(
    "operation_step_seconds",
    "Duration of one operation step by operation kind and step.",
    ["kind", "step"],
    buckets=_STEP_BUCKETS,
)


def record_proxmox_call(call: str, status: int | str, seconds: float) -> None:
    """Count one Proxmox API request and observe its latency."""
    PROXMOX_REQUESTS.labels(call=call, status=str(status)).inc()
    PROXMOX_REQUEST_SECONDS.labels(call=call).observe(max(seconds, 0.0))


def record_step(kind: str, step: str, seconds: float) -> None:
    """Observe how long one step of an operation (``create``/``clone``, ...) took."""
    OPERATION_STEP_SECONDS.labels(kind=kind, step=step).observe(max(seconds, 0.0))


class ProxmoxCallMetricsHandler(logging.Handler):
    """Feeds ``record_proxmox_call`` from the provider's per-call log lines.

    ``provisioning.proxmox.api`` logs "proxmox api call" (fields ``call``, ``http_status``,
    ``duration``) on success and "proxmox api call failed" on failure; a failure that never got
    an HTTP answer (connect error, timeout, TLS) has no ``http_status`` and is counted under its
    ``error_class`` instead, so an unreachable node shows up as ``status="ConnectFailed"``.
    """

    MESSAGES = frozenset({"proxmox api call", "proxmox api call failed"})

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg not in self.MESSAGES:
            return
        call = getattr(record, "call", None)
        if not call:
            return
        status = getattr(record, "http_status", None)
        if status is None:
            status = getattr(record, "error_class", None) or "error"
        try:
            seconds = float(getattr(record, "duration", 0.0) or 0.0)
            record_proxmox_call(str(call), status, seconds)
            if getattr(record, "transient", False):
                cluster = str(getattr(record, "cluster", "") or "")
                PROXMOX_TRANSIENT_FAULTS.labels(cluster=cluster, call=str(call)).inc()
        except Exception:
            self.handleError(record)


class StepMetricsHandler(logging.Handler):
    """Feeds ``record_step`` from the journal's "operation step finished" lines (fields
    ``kind``, ``step``, ``duration``), logged at DEBUG on ``proxyhub.operations.steps``."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg != "operation step finished":
            return
        try:
            record_step(
                str(getattr(record, "kind", "")),
                str(getattr(record, "step", "")),
                float(getattr(record, "duration", 0.0) or 0.0),
            )
        except Exception:
            self.handleError(record)


@dataclass(frozen=True)
class CountSpec:
    """One gauge family: rows of ``model`` ("app_label.Model") counted by ``labels``.

    ``labels`` maps a label name to the field lookup that fills it
    (``cluster`` -> ``cluster__name``).
    """

    metric: str
    documentation: str
    model: str
    labels: Mapping[str, str] = field(default_factory=dict)


DEFAULT_COUNTS = (
    CountSpec(
        "proxyhub_proxies",
        "Proxies by phase and cluster.",
        "provisioning.Proxy",
        {"phase": "phase", "cluster": "cluster__name"},
    ),
)


class DatabaseCountCollector(Collector):
    """Gauges counted from the database at scrape time.

    A model that is not installed, a table that is not migrated yet or a field that does not
    exist skips that family without failing the scrape: /metrics must keep serving the process
    metrics while the database is being migrated.
    """

    def __init__(self, specs: Iterable[CountSpec] = DEFAULT_COUNTS) -> None:
        self.specs = tuple(specs)

    def collect(self) -> Iterator[Metric]:
        for spec in self.specs:
            family = self._count(spec)
            if family is not None:
                yield family

    def _count(self, spec: CountSpec) -> GaugeMetricFamily | None:
        app_label, _, model_name = spec.model.partition(".")
        try:
            model = apps.get_model(app_label, model_name)
        except LookupError:
            return None
        lookups = list(spec.labels.values())
        try:
            rows = list(model._default_manager.values(*lookups).annotate(n=Count("pk")).order_by())
        except (DatabaseError, FieldError) as exc:
            log.debug("metrics family skipped", extra={"metric": spec.metric, "reason": repr(exc)})
            return None
        family = GaugeMetricFamily(spec.metric, spec.documentation, labels=list(spec.labels))
        for row in rows:
            family.add_metric(["" if row[lk] is None else str(row[lk]) for lk in lookups], row["n"])
        return family


class OperationCountCollector(Collector):
    """``proxyhub_operations{kind,state}``: operations in the journal by kind and state, without
    counting the whole journal at every scrape.

    The journal only grows (it outlives the proxies it served), so a GROUP BY over all of it per
    scrape costs more with every operation ever run. Operations still in flight (queued, running,
    waiting, unknown) are few and found through the ``(state, next_step_at)`` index, so they are
    counted at every scrape; the finished ones (succeeded, failed) change only by growing, so
    their counts come from a summary this process recomputes at most once per
    ``PROXYHUB_METRICS_SUMMARY_SECONDS``. Within that window a finished count can lag by the
    operations that finished since; an in-flight count never lags.
    """

    METRIC = "proxyhub_operations"
    DOCUMENTATION = "Operations in the journal by kind and state."

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished: list[tuple[str, str, int]] | None = None
        self._finished_at = 0.0

    def collect(self) -> Iterator[Metric]:
        try:
            model = apps.get_model("provisioning", "Operation")
            # Imported here: settings' LOGGING imports this module before the apps are loaded.
            from provisioning.models.choices import ACTIVE_STATES

            active = self._group(model._default_manager.filter(state__in=ACTIVE_STATES))
            finished = self._finished_summary(model, ACTIVE_STATES)
        except (LookupError, DatabaseError, FieldError) as exc:
            log.debug("metrics family skipped", extra={"metric": self.METRIC, "reason": repr(exc)})
            return
        family = GaugeMetricFamily(self.METRIC, self.DOCUMENTATION, labels=["kind", "state"])
        for kind, state, n in sorted([*active, *finished]):
            family.add_metric([kind, state], n)
        yield family

    @staticmethod
    def _group(queryset: Any) -> list[tuple[str, str, int]]:
        rows = queryset.values_list("kind", "state").annotate(n=Count("pk")).order_by()
        return [(str(kind), str(state), int(n)) for kind, state, n in rows]

    def _finished_summary(self, model: Any, active: Iterable[str]) -> list[tuple[str, str, int]]:
        window = float(settings.PROXYHUB_METRICS_SUMMARY_SECONDS)
        with self._lock:
            now = time.monotonic()
            if self._finished is None or now - self._finished_at >= window:
                self._finished = self._group(model._default_manager.exclude(state__in=active))
                self._finished_at = now
            return self._finished


# One per process: the summary it keeps is what bounds the cost of a scrape.
OPERATION_COUNTS = OperationCountCollector()


class CircuitCollector(Collector):
    """Each cluster's circuit breaker at scrape time: ``proxyhub_cluster_circuit_open`` is 1
    while the cluster's steps are deferred (open or probing) and 0 when requests flow;
    ``proxyhub_cluster_circuit_times_opened`` counts how often it opened. A cluster that never
    failed has no breaker row and reads closed."""

    def collect(self) -> Iterator[Metric]:
        try:
            cluster = apps.get_model("provisioning", "Cluster")
            rows = list(
                cluster.objects.values_list("name", "circuit__state", "circuit__times_opened")
            )
        except (LookupError, DatabaseError, FieldError) as exc:
            log.debug("metrics family skipped", extra={"metric": "circuit", "reason": repr(exc)})
            return
        state = GaugeMetricFamily(
            "proxyhub_cluster_circuit_open",
            "1 while the cluster's circuit breaker defers its steps (open or probing), else 0.",
            labels=["cluster", "state"],
        )
        opened = GaugeMetricFamily(
            "proxyhub_cluster_circuit_times_opened",
            "How often the cluster's circuit breaker opened.",
            labels=["cluster"],
        )
        for name, current, times in rows:
            current = current or "closed"
            state.add_metric([name, current], 0 if current == "closed" else 1)
            opened.add_metric([name], times or 0)
        yield state
        yield opened


def exposition(multiproc_dir: str | Path | None) -> bytes:
    """The /metrics body in the Prometheus text format (0.0.4).

    In multiprocess mode the process-local registry would count only this web process, so a
    fresh registry aggregates every process's files instead (prometheus_client's documented
    recipe); the default registry adds the web process's own runtime metrics otherwise.
    """
    registry = CollectorRegistry(auto_describe=False)
    if multiproc_dir:
        MultiProcessCollector(registry, path=str(multiproc_dir))
    else:
        registry.register(_DefaultRegistry())
    registry.register(DatabaseCountCollector())
    registry.register(OPERATION_COUNTS)
    registry.register(CircuitCollector())
    # Imported here, not at the top: settings' LOGGING imports this module before the apps
    # (and their models) are loaded.
    from healthchecks.metrics import NodeHealthCollector

    registry.register(NodeHealthCollector())
    return generate_latest(registry)


class _DefaultRegistry(Collector):
    """The process-wide default registry, wrapped so it can sit beside other collectors."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
