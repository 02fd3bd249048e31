"""Node health rounds, their history, and the selectors the admin and placement read.

A round checks every node of every cluster with the provider's checker (seed 000 entry 16:
four requests per node, nodes concurrently, results in config order) and stores one
``NodeHealth`` row per node. Clusters are checked concurrently, each against its own deadline,
so one cluster whose nodes hang or fail never delays another cluster's results; the checks
make no database calls, and the rows are written by the calling thread as each cluster
finishes.

Settings: ``PROXYHUB_HEALTH_DEADLINE_SECONDS`` (default 20) bounds one cluster's check;
``PROXYHUB_HEALTH_RETENTION_DAYS`` (default 7) is how long history is kept;
``PROXYHUB_HEALTH_STALE_SECONDS`` (default five Beat intervals) is the age after which
placement stops trusting a result (``healthchecks.placement``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet, Subquery
from django.utils import timezone

from provisioning.models import Cluster, Node
from provisioning.proxmox.checker import NodeCheck
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import ProxmoxError
from provisioning.proxmox.provider import Provider
from provisioning.services.providers import provider_for

from .models import NodeHealth, Reason

log = logging.getLogger("proxyhub.health")

DEFAULT_DEADLINE_SECONDS = 20.0
DEFAULT_RETENTION_DAYS = 7
# Clusters checked at once; each check runs its own threads for the nodes (the checker's 8).
MAX_PARALLEL_CLUSTERS = 16


def deadline_seconds_setting() -> float:
    return float(getattr(settings, "PROXYHUB_HEALTH_DEADLINE_SECONDS", DEFAULT_DEADLINE_SECONDS))


def stale_after() -> timedelta:
    """How old a result may be before placement ignores it (five Beat intervals by default)."""
    seconds = getattr(settings, "PROXYHUB_HEALTH_STALE_SECONDS", None)
    if seconds is None:
        seconds = 5 * int(getattr(settings, "PROXYHUB_HEALTH_INTERVAL_SECONDS", 60))
    return timedelta(seconds=float(seconds))


# --- rounds ---------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """A cluster ready to be checked off the database: its provider, or why there is none."""

    cluster: Cluster
    nodes: list[str]
    provider: Provider | None
    problem: str = ""


@dataclass
class _Checked:
    prepared: _Prepared
    started: datetime
    results: list[NodeCheck]


def check_cluster(cluster: Cluster, *, deadline_seconds: float | None = None) -> list[NodeHealth]:
    """Check every node of ``cluster`` now and store the results (config order)."""
    seconds = deadline_seconds if deadline_seconds is not None else deadline_seconds_setting()
    checked = _run_check(_prepare(cluster), seconds)
    return _record(checked)


def check_round(
    *, deadline_seconds: float | None = None, cluster_names: Sequence[str] | None = None
) -> list[NodeHealth]:
    """Check every cluster (or the named ones) concurrently; results by cluster name, then
    config order. A cluster that fails to check reports it on each of its nodes."""
    seconds = deadline_seconds if deadline_seconds is not None else deadline_seconds_setting()
    clusters = Cluster.objects.order_by("name")
    if cluster_names is not None:
        clusters = clusters.filter(name__in=list(cluster_names))
    prepared = [_prepare(cluster) for cluster in clusters]
    stored: dict[int, list[NodeHealth]] = {}
    failure: Exception | None = None
    if prepared:
        workers = min(len(prepared), MAX_PARALLEL_CLUSTERS)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="health-round") as pool:
            futures = [pool.submit(_run_check, item, seconds) for item in prepared]
            # Stored as each cluster finishes: a slow cluster holds back only its own rows,
            # and one that cannot be stored does not stop the others being stored.
            for future in as_completed(futures):
                checked = future.result()
                try:
                    stored[checked.prepared.cluster.pk] = _record(checked)
                except Exception as exc:
                    log.exception(
                        "node health not stored", extra={"cluster": checked.prepared.cluster.name}
                    )
                    failure = failure or exc
    if failure is not None:
        raise failure
    return [row for item in prepared for row in stored.get(item.cluster.pk, [])]


def _prepare(cluster: Cluster) -> _Prepared:
    """Everything that needs the database, done before the check leaves this thread."""
    nodes = list(cluster.nodes.order_by("position", "name").values_list("name", flat=True))
    try:
        return _Prepared(cluster, nodes, provider_for(cluster))
    except ProxmoxError as exc:
        problem = str(exc)
    except Exception as exc:  # a catalogue the provider cannot be built from
        log.exception("health check could not start", extra={"cluster": cluster.name})
        problem = type(exc).__name__
    return _Prepared(cluster, nodes, None, problem)


def _run_check(item: _Prepared, seconds: float) -> _Checked:
    """The checker for one cluster; never raises, makes no database call."""
    started = timezone.now()
    if item.provider is None:
        return _Checked(item, started, _failed(item, f"the check could not start: {item.problem}"))
    try:
        results = item.provider.check(deadline=Deadline(seconds))
    except Exception as exc:
        log.exception("health check failed unexpectedly", extra={"cluster": item.cluster.name})
        results = _failed(item, f"the check failed unexpectedly: {type(exc).__name__}")
    return _Checked(item, started, results)


def _failed(item: _Prepared, message: str) -> list[NodeCheck]:
    return [
        NodeCheck(
            node=node,
            ready=False,
            reason="APIError",
            message=message,
            details={"isoStorage": item.cluster.iso_storage},
        )
        for node in item.nodes
    ]


def _record(checked: _Checked) -> list[NodeHealth]:
    """Store one round of one cluster and move ``latest`` onto it, in one transaction.

    The cluster row is locked first, so two rounds of the same cluster (Beat and
    ``check_nodes`` at once) store one after the other; a round that started before the
    stored latest result of a node keeps its row as history instead of overtaking it.
    """
    cluster = checked.prepared.cluster
    rows = [
        NodeHealth(
            cluster=cluster,
            node=result.node,
            ready=result.ready,
            reason=Reason(result.reason),
            message=result.message,
            details=result.details,
            duration=result.duration,
            checked_at=checked.started,
        )
        for result in checked.results
    ]
    with transaction.atomic():
        if not Cluster.objects.select_for_update().filter(pk=cluster.pk).exists():
            return []  # deleted while it was being checked
        latest = NodeHealth.objects.filter(cluster=cluster, latest=True)
        newer = set(latest.filter(checked_at__gt=checked.started).values_list("node", flat=True))
        latest.exclude(node__in=newer).update(latest=False)
        for row in rows:
            row.latest = row.node not in newer
        NodeHealth.objects.bulk_create(rows)
    ready = sum(row.ready for row in rows)
    log.info(
        "node health round",
        extra={"cluster": cluster.name, "nodes": len(rows), "ready": ready},
    )
    return rows


# --- history --------------------------------------------------------------------------------


def prune_history(*, now: datetime | None = None) -> int:
    """Delete results older than the retention; a node's latest result is always kept."""
    days = int(getattr(settings, "PROXYHUB_HEALTH_RETENTION_DAYS", DEFAULT_RETENTION_DAYS))
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted, _ = NodeHealth.objects.filter(latest=False, checked_at__lt=cutoff).delete()
    if deleted:
        log.info("node health history pruned", extra={"deleted": deleted, "days": days})
    return deleted


# --- selectors ------------------------------------------------------------------------------


def latest_configured() -> QuerySet[NodeHealth]:
    """Latest results of the nodes clusters have now, by cluster name then config order.

    A node removed from a cluster keeps its last row until the next round; it is left out
    here. Rows carry ``position``, the node's place in the cluster's config.
    """
    position = Node.objects.filter(cluster=OuterRef("cluster"), name=OuterRef("node")).values(
        "position"
    )[:1]
    return (
        NodeHealth.objects.filter(latest=True)
        .annotate(position=Subquery(position))
        .filter(position__isnull=False)
        .order_by("cluster__name", "position", "node")
    )


def latest_for_cluster(cluster: Cluster) -> list[NodeHealth]:
    """The latest result of each node of ``cluster``, in config order (unchecked nodes absent)."""
    return list(latest_configured().filter(cluster=cluster).select_related("cluster"))


def ready_nodes(cluster: Cluster) -> list[str]:
    """Nodes of ``cluster`` whose latest check found them ready, in config order."""
    return list(
        latest_configured().filter(cluster=cluster, ready=True).values_list("node", flat=True)
    )


def clusters_without_ready_node() -> list[Cluster]:
    """Clusters that have been checked and whose latest results show no ready node.

    A cluster never checked yet is not listed: nothing is known about it (placement does
    not hold its creates back either).
    """
    health = ready_node_annotations()
    return list(
        Cluster.objects.annotate(checked=health["checked"], any_ready=health["any_ready"])
        .filter(checked=True, any_ready=False)
        .order_by("name")
    )


def ready_node_annotations() -> dict[str, Exists]:
    """``checked`` and ``any_ready`` for a ``Cluster`` queryset: whether its nodes have latest
    results, and whether one of them found a node ready (the console's proxy list reads them
    on the clusters it loads anyway, instead of a query of its own)."""
    latest = latest_configured().filter(cluster=OuterRef("pk")).order_by()
    return {"checked": Exists(latest), "any_ready": Exists(latest.filter(ready=True))}
