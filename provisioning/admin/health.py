"""Node health on the console, when the ``healthchecks`` app is installed.

DESIGN.md §3 keeps the import direction ``healthchecks`` → ``provisioning``: provisioning's
models and services never depend on health results. The console is where the two meet, so it
reads ``healthchecks``' selectors when that app is installed and shows nothing otherwise, and
it asks for a health round by the task's registered name instead of importing its module.
"""

from __future__ import annotations

import importlib
from typing import Any

from django.apps import apps

from provisioning.models import Cluster
from provisioning.services import dispatch

# healthchecks.schedules.CHECK_TASK: one round over every cluster, on the ``health`` queue.
CHECK_ROUND_TASK = "proxyhub.health.check_round"


def installed() -> bool:
    return apps.is_installed("healthchecks")


def _services() -> Any | None:
    if not installed():
        return None
    try:
        return importlib.import_module("healthchecks.services")
    except ImportError:
        return None


def latest_for_cluster(cluster: Cluster) -> list[Any] | None:
    """The latest ``NodeHealth`` of each node (config order), or ``None`` without the app."""
    services = _services()
    if services is None:
        return None
    return list(services.latest_for_cluster(cluster))


def clusters_without_ready_node() -> list[Cluster]:
    services = _services()
    if services is None:
        return []
    return list(services.clusters_without_ready_node())


def cluster_health_annotations() -> dict[str, Any]:
    """``checked`` and ``any_ready`` for a ``Cluster`` queryset (``healthchecks``' own
    definitions); nothing without the app."""
    services = _services()
    if services is None:
        return {}
    return dict(services.ready_node_annotations())


def checked_without_ready_node(cluster: Cluster) -> bool:
    """What ``clusters_without_ready_node`` lists, for a cluster loaded with
    ``cluster_health_annotations``: checked, and no node found ready."""
    return bool(getattr(cluster, "checked", False)) and not getattr(cluster, "any_ready", True)


def request_check_round() -> bool:
    """Send one health round after commit; ``False`` without the ``healthchecks`` app.

    Sent by name: the web process never imports the task modules (the worker discovers them),
    and the name is the contract, as Beat's schedule uses it too.
    """
    from celery import current_app

    if not installed():
        return False
    dispatch.publish_after_commit(
        lambda: current_app.send_task(CHECK_ROUND_TASK, queue="health"),
        what="node health round",
    )
    return True
