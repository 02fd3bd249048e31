"""The provider for a cluster row, built once per process and rebuilt when the row changes.

``HttpTransport`` keeps a keep-alive pool and the cached CA, so building one per step would
throw both away. The cache key includes ``Cluster.updated_at`` (every save of the cluster or,
through the admin and the import, of its children bumps it), so an edited catalogue takes
effect on the next step without a restart.

Tests swap the transport for the in-process simulator with ``use_transport_factory``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings

from provisioning.models import Cluster
from provisioning.proxmox.api import Api, ReadRetry, Transport
from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.http import HttpTransport
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.task_board import TaskBoard

from .durations import ClusterDurations
from .installation import installation_id
from .task_wakes import ClusterTasksInFlight

TransportFactory = Callable[[ProxmoxConfig], Transport]

_lock = threading.Lock()
_cache: dict[tuple[int, str], Provider] = {}
_factory: TransportFactory | None = None
_budgets: Budgets | None = None


def _http_transport(config: ProxmoxConfig) -> Transport:
    return HttpTransport(
        config.url,
        config.token_file,
        ca_file=config.ca_file,
        insecure=config.insecure_skip_tls_verify,
        # 0 is no per-request bound (docs/catalogue.md); the step task's time limit remains.
        request_timeout=config.request_timeout_seconds,
        credentials_dir=config.credentials_dir,
        ca_fingerprint=config.ca_fingerprint,
    )


def _default_budgets() -> Budgets:
    """Seed 000 entry 18's budgets, with the pause between task and status polls from the
    setting ``PROXYHUB_POLL_INTERVAL_SECONDS`` (1 s suits a real node; the ``fast`` simulator
    profile's 0.1 s tasks finish well inside it)."""
    interval = float(getattr(settings, "PROXYHUB_POLL_INTERVAL_SECONDS", 1.0))
    return Budgets(poll_interval=interval)


def _read_retry() -> ReadRetry:
    """Issue 16: a GET that meets a transient fault is sent again in place, at once and then
    after short jittered pauses (settings ``PROXYHUB_READ_RETRIES``,
    ``PROXYHUB_READ_RETRY_PAUSE_SECONDS``), before the step counts it as a failure."""
    return ReadRetry(
        retries=int(getattr(settings, "PROXYHUB_READ_RETRIES", 3)),
        pause=float(getattr(settings, "PROXYHUB_READ_RETRY_PAUSE_SECONDS", 0.2)),
    )


def provider_for(cluster: Cluster) -> Provider:
    """The provider for ``cluster`` as it is now."""
    key = (cluster.pk, cluster.updated_at.isoformat() if cluster.updated_at else "")
    with _lock:
        provider = _cache.get(key)
    if provider is not None:
        return provider
    config = cluster.proxmox_config(installation_id())
    transport = (_factory or _http_transport)(config)
    api = Api(transport, reads=_read_retry(), label=cluster.name)
    provider = Provider(
        api,
        config,
        budgets=_budgets or _default_budgets(),
        durations=ClusterDurations(cluster.pk),
        board=TaskBoard(ClusterTasksInFlight(cluster.pk)),
    )
    with _lock:
        for stale in [k for k in _cache if k[0] == cluster.pk and k != key]:
            old = _cache.pop(stale)
            close = getattr(old.api.transport, "close", None)
            if close is not None:
                close()
        _cache[key] = provider
    return provider


def api_with_token_file(config: ProxmoxConfig, token_file: str) -> Api:
    """An uncached ``Api`` for ``config`` that signs in with ``token_file`` instead of the
    cluster's own: ``bootstrap_cluster``'s administrator token, used once and never kept."""
    transport = (_factory or _http_transport)(dataclasses.replace(config, token_file=token_file))
    return Api(transport, reads=_read_retry(), label=config.name)


def forget_providers() -> None:
    with _lock:
        _cache.clear()


@contextmanager
def use_transport_factory(
    factory: TransportFactory, *, budgets: Budgets | None = None
) -> Iterator[None]:
    """Route every provider built inside the block through ``factory`` (tests, benchmarks)."""
    global _factory, _budgets
    previous = (_factory, _budgets)
    _factory, _budgets = factory, budgets
    forget_providers()
    try:
        yield
    finally:
        _factory, _budgets = previous
        forget_providers()
