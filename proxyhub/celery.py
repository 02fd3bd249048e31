"""The Celery app ``proxyhub``: ``celery -A proxyhub worker`` and ``celery -A proxyhub beat``.

All configuration comes from Django settings under the ``CELERY_`` prefix (see the CELERY
section of ``proxyhub.settings.base`` for why each value is what it is); production's settings
unless ``DJANGO_SETTINGS_MODULE`` selects others. Workers log through Django's
``LOGGING`` rather than Celery's own handlers, so their lines are the same JSON as the web's.

``check_visibility_timeout`` guards the one setting whose wrong value silently duplicates work:
the Redis visibility timeout (research/reliability.md §5 items 6 and 7). It is registered as a
Django system check, so ``manage.py check``, ``migrate`` and ``runserver`` refuse to run with an
unsafe value.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from typing import Any

from celery import Celery, platforms
from celery.signals import setup_logging, task_postrun, task_prerun, worker_init
from django.core import checks

from proxyhub.settings import select_default_settings_module

select_default_settings_module()

# Celery's own start-up run of every Django check would import the admin console into the
# worker; the worker runs the checks that concern it instead (proxyhub.worker_checks).
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("proxyhub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# prctl(2)'s option that asks the kernel to signal this process when its parent dies.
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig(signum: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, signum)`` through ctypes, as billiard does without cffi.

    Each prefork pool process makes this call as it starts, so that it dies with its parent
    (Celery's ``process_initializer``). billiard makes it through cffi whenever cffi can be
    imported, and cryptography installs cffi for its own backend: every pool process then
    imports pycparser to parse that one C declaration, about 1.7 MiB of each pool process
    (issue 12: the worker's memory). The call and its effect are the same; Celery ignores the
    ``OSError`` of a kernel without it, as it does billiard's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


if sys.platform.startswith("linux"):
    platforms._set_pdeathsig = _set_pdeathsig  # what celery.platforms.set_pdeathsig calls


# Broker transports whose unacknowledged messages come back after a visibility timeout.
_VISIBILITY_TRANSPORTS = ("redis", "rediss", "sentinel", "sqs")

# Redelivery must wait this many times the longest a message can legitimately stay unacked.
VISIBILITY_MARGIN = 4


@worker_init.connect
def _configure_tracing(**_: Any) -> None:
    """Workers send spans when tracing is on (proxyhub.tracing). Set up once in the main
    process: the SDK's batch processor starts its thread again in each forked pool process."""
    from proxyhub.tracing import configure_tracing

    configure_tracing("proxyhub-worker")


@worker_init.connect
def _run_worker_checks(**_: Any) -> None:
    from proxyhub.worker_checks import run_worker_checks

    run_worker_checks()


@task_prerun.connect
@task_postrun.connect
def _database_connection_between_tasks(sender: Any = None, **_: Any) -> None:
    """A task keeps its process's database connection as a request does (``CONN_MAX_AGE``,
    ``CONN_HEALTH_CHECKS``): one found broken or older than its age is closed here, and the
    next task's first query checks the kept one before using it.

    Celery's Django fixup would close it around every task (``CELERY_DB_REUSE_MAX`` unset),
    so each step delivery paid a new PostgreSQL session and its cold catalog caches, about a
    tenth of a delivery (issue 12); settings raise that count so the age decides instead.
    An eager task runs inside its caller's transaction: its connection is the caller's."""
    if sender is not None and getattr(sender.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@setup_logging.connect
def _use_django_logging(**_: Any) -> None:
    """Connecting this signal stops Celery configuring logging; Django's LOGGING applies."""
    from django.conf import settings
    from django.utils.log import configure_logging

    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)


def check_visibility_timeout(
    *,
    broker_url: str,
    transport_options: Mapping[str, Any],
    task_time_limit: float | None,
    max_backoff: float,
) -> str | None:
    """Why this broker configuration can deliver a message twice, or ``None`` when it is safe.

    A Redis worker keeps a message unacknowledged while it runs (late acks) and while its
    countdown runs down, then Redis hands it to another worker once the visibility timeout
    passes. The timeout must exceed ``VISIBILITY_MARGIN`` times (hard time limit + longest
    countdown). Transports without a visibility timeout (the embedded filesystem broker) pass.
    """
    scheme = broker_url.split("://", 1)[0].split("+")[0].lower()
    if scheme not in _VISIBILITY_TRANSPORTS:
        return None
    if not task_time_limit:
        return "CELERY_TASK_TIME_LIMIT is not set, so no visibility timeout is provably safe"
    needed = VISIBILITY_MARGIN * (task_time_limit + max_backoff)
    timeout = transport_options.get("visibility_timeout")
    if timeout is None:
        return (
            f"CELERY_BROKER_TRANSPORT_OPTIONS has no visibility_timeout; it must be at least "
            f"{needed:g} s ({VISIBILITY_MARGIN} x (task time limit {task_time_limit:g} s + "
            f"max step backoff {max_backoff:g} s))"
        )
    if float(timeout) < needed:
        return (
            f"broker visibility_timeout {float(timeout):g} s is below {needed:g} s "
            f"({VISIBILITY_MARGIN} x (task time limit {task_time_limit:g} s + max step backoff "
            f"{max_backoff:g} s)): a running or counting-down step would be delivered twice"
        )
    return None


@checks.register("celery")
def visibility_timeout_check(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    problem = check_visibility_timeout(
        broker_url=settings.CELERY_BROKER_URL,
        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        task_time_limit=settings.CELERY_TASK_TIME_LIMIT,
        max_backoff=settings.PROXYHUB_STEP_MAX_BACKOFF_SECONDS,
    )
    if problem is None:
        return []
    return [
        checks.Error(
            problem,
            hint="Raise visibility_timeout in CELERY_BROKER_TRANSPORT_OPTIONS or lower "
            "PROXYHUB_STEP_MAX_BACKOFF_SECONDS.",
            id="proxyhub.E001",
        )
    ]
