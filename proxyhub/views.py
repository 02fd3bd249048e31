"""Liveness, readiness and metrics endpoints for probes and Prometheus.

They need no login and no CSRF token: they only answer GET and change nothing. Failures name
the dependency and the exception class only, never the exception text, which for a database or
broker can contain a URL with its password.
"""

from __future__ import annotations

import hmac
import os
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from kombu import Connection
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from . import metrics
from .celery import app as celery_app

# A probe must answer well inside a probe timeout even when a dependency blackholes packets.
BROKER_TIMEOUT_SECONDS = 2


@csrf_exempt
@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process serves requests. Touches no dependency, so a database outage does
    not make an orchestrator restart healthy web processes."""
    return JsonResponse({"status": "ok"})


def _database_ok() -> None:
    # The process's own connection, kept between requests (CONN_MAX_AGE); one found broken is
    # replaced at the next request's start (CONN_HEALTH_CHECKS), so a probe opens none of its own.
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


# The broker connection /readyz keeps open between checks, guarded by its lock (gunicorn threads
# or not, one check at a time); dropped after a failure so the next check connects afresh.
_broker_lock = threading.Lock()
_broker: Connection | None = None


def _broker_connection() -> Connection:
    global _broker
    if _broker is None:
        # Socket timeouts too, not only the connect timeout: a Redis that stops answering on an
        # open connection must fail the probe, not hang it.
        _broker = celery_app.connection_for_write(
            connect_timeout=BROKER_TIMEOUT_SECONDS,
            transport_options={
                "socket_timeout": BROKER_TIMEOUT_SECONDS,
                "socket_connect_timeout": BROKER_TIMEOUT_SECONDS,
            },
        )
    return _broker


def _broker_ok() -> None:
    global _broker
    with _broker_lock:
        conn = _broker_connection()
        try:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0.5, timeout=BROKER_TIMEOUT_SECONDS
            )
            if conn.transport.driver_type == "redis":
                # A kept connection says nothing of now: ask Redis itself.
                conn.default_channel.client.ping()  # type: ignore[attr-defined]
            elif conn.transport.driver_type == "filesystem":
                # The embedded broker "connects" without touching the disk; what can fail is its
                # folders, so check those.
                options = celery_app.conf.broker_transport_options
                for key in ("data_folder_in", "data_folder_out", "control_folder"):
                    folder = Path(options.get(key, ""))
                    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                        raise NotADirectoryError(key)
        except Exception:
            _broker = None
            conn.release()
            raise


def _check_readiness() -> tuple[dict[str, object], int]:
    body: dict[str, object] = {}
    errors: dict[str, str] = {}
    for name, probe in (("database", _database_ok), ("broker", _broker_ok)):
        try:
            probe()
        except Exception as exc:  # any failure means "not ready"; the class says which kind
            body[name] = "failed"
            errors[name] = type(exc).__name__
        else:
            body[name] = "ok"
    if errors:
        body["errors"] = errors
        return body, 503
    return body, 200


# The last verdict and when its check started, kept PROXYHUB_READYZ_CACHE_SECONDS: a probe storm
# (every replica's orchestrator, a load balancer) costs one check per window per process.
_verdict_lock = threading.Lock()
_verdict: tuple[float, dict[str, object], int] | None = None


def _readiness() -> tuple[dict[str, object], int]:
    global _verdict
    window = float(settings.PROXYHUB_READYZ_CACHE_SECONDS)
    # Held across the check: probes arriving meanwhile wait for its verdict, not run their own.
    with _verdict_lock:
        now = time.monotonic()
        if _verdict is not None and now - _verdict[0] < window:
            return _verdict[1], _verdict[2]
        body, status = _check_readiness()
        _verdict = (now, body, status)
        return body, status


@csrf_exempt
@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers ``SELECT 1`` and the broker answers too.

    200 ``{"database": "ok", "broker": "ok"}``; otherwise 503 with ``"failed"`` for the
    dependency that failed and, under ``errors``, its exception class. The verdict is kept
    ``PROXYHUB_READYZ_CACHE_SECONDS``, so a failure shows within that long.
    """
    body, status = _readiness()
    return JsonResponse(body, status=status)


def _authorized(request: HttpRequest) -> bool:
    token = settings.PROXYHUB_METRICS_TOKEN
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), token.encode()
    )


@csrf_exempt
@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format; with ``PROXYHUB_METRICS_TOKEN`` set, only for that bearer token
    (production refuses to start without one unless ``PROXYHUB_METRICS_PUBLIC`` is true)."""
    if not _authorized(request):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="proxyhub metrics"'
        return response
    body = metrics.exposition(settings.PROMETHEUS_MULTIPROC_DIR or None)
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
