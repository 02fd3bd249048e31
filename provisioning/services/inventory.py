"""The inventory snapshot: every guest of each cluster, refreshed from one listing per cluster
(issue 14; seed 001's bounded inventory, "the local inventory limit is 4096 definitions").

A refresh reads Proxmox with no transaction open, then replaces the cluster's rows in one
transaction, so a reader sees the old snapshot or the new one, never half of each. A refresh
that fails (the cluster does not answer, the deadline ends) writes nothing but the error on the
cluster's ``InventoryRefresh``: the previous snapshot stays, with its time, for the page to show.

Ownership is the provider's (``proxmox.inventory``); owners already proven by a mark are passed
back in, so a steady cluster costs one listing and no config read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction

from provisioning.models import Cluster, InventoryGuest, InventoryRefresh
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import ProxmoxError
from provisioning.proxmox.inventory import (
    INVENTORY_LIMIT,
    OWNERS,
    Inventory,
    Remembered,
)

from .clock import db_now
from .providers import provider_for

log = logging.getLogger("proxyhub.operations")

# Rows written per INSERT: 4,096 rows in nine statements.
_BATCH = 500


@dataclass(frozen=True)
class RefreshOutcome:
    """What one cluster's refresh did: ``error`` empty on success."""

    cluster: str
    count: int
    listed: int
    truncated: bool
    unread: int
    error: str = ""


def inventory_limit() -> int:
    """Rows kept per cluster: seed 001's 4,096 (a setting only so tests can lower it)."""
    return int(getattr(settings, "PROXYHUB_INVENTORY_LIMIT", INVENTORY_LIMIT))


def inventory_refresh(*, cluster: Cluster) -> RefreshOutcome:
    """Replace ``cluster``'s snapshot with what one listing shows now (see the module)."""
    started = db_now()
    known = {
        (vmid, name): Remembered(owner, status, (started - seen).total_seconds())
        for vmid, name, owner, status, seen in InventoryGuest.objects.filter(
            cluster=cluster, mark_read=True
        ).values_list("vmid", "name", "owner", "status", "refreshed_at")
        if owner in OWNERS
    }
    deadline = Deadline(float(getattr(settings, "PROXYHUB_INVENTORY_DEADLINE_SECONDS", 120.0)))
    try:
        inventory = provider_for(cluster).inventory(
            known=known, limit=inventory_limit(), deadline=deadline
        )
    except ProxmoxError as err:
        # Classified errors carry no token, no cloud-init and no CA (seed 000 entry 20).
        message = str(err)
        _record_failure(cluster, started, message)
        log.warning(
            "inventory refresh failed; the previous snapshot stays",
            extra={"cluster": cluster.name, "error": message},
        )
        return RefreshOutcome(cluster.name, 0, 0, False, 0, error=message)
    count = _replace(cluster, inventory, started)
    log.info(
        "inventory refreshed",
        extra={
            "cluster": cluster.name,
            "count": count,
            "listed": inventory.listed,
            "truncated": inventory.truncated,
            "mark_reads": inventory.mark_reads,
        },
    )
    return RefreshOutcome(
        cluster.name, count, inventory.listed, inventory.truncated, inventory.unread
    )


def inventory_refresh_all() -> list[RefreshOutcome]:
    """One refresh per cluster, in name order; one cluster failing does not stop the others."""
    return [inventory_refresh(cluster=c) for c in Cluster.objects.order_by("name")]


def _replace(cluster: Cluster, inventory: Inventory, started: datetime) -> int:
    """The new snapshot, in one transaction, under the cluster's refresh row lock. A refresh
    that started before the snapshot now in place was taken is dropped (two refreshes of one
    cluster that overlap end with the newer listing)."""
    InventoryRefresh.objects.get_or_create(cluster=cluster)
    with transaction.atomic():
        record = InventoryRefresh.objects.select_for_update().get(cluster=cluster)
        if record.refreshed_at is not None and record.refreshed_at > started:
            return record.count
        InventoryGuest.objects.filter(cluster=cluster).delete()
        InventoryGuest.objects.bulk_create(
            (
                InventoryGuest(
                    cluster=cluster,
                    vmid=g.vmid,
                    name=_fit(g.name, "name"),
                    node=_fit(g.node, "node"),
                    type=g.type,
                    status=_fit(g.status, "status"),
                    lock=_fit(g.lock, "lock"),
                    tags=_fit(";".join(g.tags), "tags"),
                    hastate=_fit(g.hastate, "hastate"),
                    template=g.template,
                    pool=_fit(g.pool, "pool"),
                    owner=g.owner,
                    mark_read=g.mark_read,
                    refreshed_at=started,
                )
                for g in inventory.guests
            ),
            batch_size=_BATCH,
        )
        record.refreshed_at = started
        record.attempted_at = started
        record.count = len(inventory.guests)
        record.listed = inventory.listed
        record.truncated = inventory.truncated
        record.unread = inventory.unread
        record.error = ""
        record.save()
    return len(inventory.guests)


def _fit(value: str, field: str) -> str:
    """``value`` cut to its column: an odd value on one guest (a very long tag list) must not
    make PostgreSQL refuse the whole snapshot."""
    limit = getattr(InventoryGuest._meta.get_field(field), "max_length", None)
    return value[:limit] if isinstance(limit, int) else value


def _record_failure(cluster: Cluster, started: datetime, message: str) -> None:
    record, _ = InventoryRefresh.objects.get_or_create(cluster=cluster)
    InventoryRefresh.objects.filter(pk=record.pk).update(attempted_at=started, error=message)
