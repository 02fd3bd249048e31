"""Liveness, readiness and metrics endpoints for probes and Prometheus.

They need no login and no CSRF token: they only answer GET and change nothing. Failures name
the dependency and the exception class only, never the exception text, which for a database or
broker can contain a URL with its password.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from django.conf import settings
from django.db import connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
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
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _broker_ok() -> None:
    with celery_app.connection_for_write(connect_timeout=BROKER_TIMEOUT_SECONDS) as conn:
        conn.ensure_connection(
            max_retries=1, interval_start=0, interval_step=0.5, timeout=BROKER_TIMEOUT_SECONDS
        )
        if conn.transport.driver_type == "filesystem":
            # The embedded broker "connects" without touching the disk; what can fail is its
            # folders, so check those.
            options = celery_app.conf.broker_transport_options
            for key in ("data_folder_in", "data_folder_out", "control_folder"):
                folder = Path(options.get(key, ""))
                if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
                    raise NotADirectoryError(key)


@csrf_exempt
@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers ``SELECT 1`` and a broker connection can be opened.

    200 ``{"database": "ok", "broker": "ok"}``; otherwise 503 with ``"failed"`` for the
    dependency that failed and, under ``errors``, its exception class.
    """
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
        return JsonResponse(body, status=503)
    return JsonResponse(body)


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
    """Prometheus text format; with ``PROXYHUB_METRICS_TOKEN`` set, only for that bearer token."""
    if not _authorized(request):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="proxyhub metrics"'
        return response
    body = metrics.exposition(settings.PROMETHEUS_MULTIPROC_DIR or None)
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
