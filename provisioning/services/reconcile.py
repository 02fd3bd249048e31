"""Reconcile: make Proxmox hold what the database asks for (DESIGN.md §5).

One ``/cluster/resources`` listing per cluster per round serves all its proxies. A proxy is read
further (config, status, agent) only when the listing cannot settle it: not yet ``Running``
with an address, or its VM's entry changed (not running, locked, renamed). So a round over a
converged fleet makes one request per cluster and no mutation.

What a round does per proxy with no operation running:
* asked to be deleted: a delete;
* no VM yet, or its VM vanished: a create (the create adopts a VM of ours if one exists);
* a VM that can never report an address (its agent config was removed): a replace;
* power: a stopped VM that should run is started; a running one that should not is shut
  down. A deliberately stopped proxy (``desired_power`` off) stays stopped.
Proxies latched ``Failed`` are left for an operator.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.utils import timezone

from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredPower,
    DesiredState,
    ErrorClass,
    Phase,
    RequestedVia,
)
from provisioning.proxmox.errors import ClassifiedError, NotFoundError
from provisioning.proxmox.observe import Instance

from . import operations
from .leases import job_lease
from .providers import provider_for

log = logging.getLogger("proxyhub.reconcile")

_PHASE = {"Running": Phase.RUNNING, "Provisioning": Phase.PROVISIONING, "Stopped": Phase.STOPPED}


def reconcile_round(*, lease_seconds: float = 600) -> Counter[str]:
    """Reconcile every cluster once, holding the ``reconcile`` lease."""
    totals: Counter[str] = Counter()
    with job_lease("reconcile", seconds=lease_seconds):
        for cluster in Cluster.objects.all():
            try:
                totals.update(reconcile_cluster(cluster))
            except ClassifiedError as err:
                # One unreachable cluster must not stop the others.
                log.warning(
                    "reconcile skipped a cluster",
                    extra={"cluster": cluster.name, "error": str(err)},
                )
                totals["cluster_errors"] += 1
    return totals


def reconcile_cluster(cluster: Cluster) -> Counter[str]:
    counts: Counter[str] = Counter()
    proxies = list(Proxy.objects.filter(cluster=cluster).exclude(phase=Phase.FAILED))
    if not proxies:
        return counts
    busy = set(
        Operation.objects.filter(
            proxy__in=[p.pk for p in proxies], state__in=ACTIVE_STATES
        ).values_list("proxy_id", flat=True)
    )
    provider = provider_for(cluster)
    try:
        listing = provider.api.cluster_resources()
    except Exception as err:
        from provisioning.proxmox.errors import classify

        raise classify("list", err) from err
    by_vmid = {int(e["vmid"]): e for e in listing if "vmid" in e}
    for proxy in proxies:
        if proxy.pk in busy:
            counts["busy"] += 1
            continue
        counts[_reconcile_proxy(proxy, provider, listing, by_vmid)] += 1
    return counts


def _reconcile_proxy(
    proxy: Proxy,
    provider: Any,
    listing: list[dict[str, Any]],
    by_vmid: Mapping[int, Mapping[str, Any]],
) -> str:
    if proxy.desired_state == DesiredState.DELETED:
        operations.proxy_request_delete(proxy=proxy, via=RequestedVia.BEAT)
        return "delete"
    if not proxy.provider_id:
        operations.proxy_retry(proxy=proxy, via=RequestedVia.BEAT)
        return "create"
    entry = by_vmid.get(proxy.vmid or -1)
    if entry is None or (entry.get("name") and entry.get("name") != proxy.vm_name):
        return _recreate(proxy, "its VM is gone")
    if not _needs_read(proxy, entry):
        return "converged"
    try:
        instance = provider.get(proxy.provider_id, listing=listing)
    except NotFoundError:
        return _recreate(proxy, "its VM is gone")
    except ClassifiedError as err:
        Proxy.objects.filter(pk=proxy.pk).update(
            last_error=str(err), last_error_class=ErrorClass.TRANSIENT
        )
        return "unreadable"
    _record(proxy, instance)
    if proxy.desired_power == DesiredPower.ON and instance.state == "Stopped":
        if instance.lock == "suspended":
            return "hibernated"  # never clears by itself; an operator resumes or destroys it
        if instance.status == "running" and instance.qmpstatus in ("paused", "suspended"):
            return "paused"  # an operator paused it in Proxmox; leave it to them
        if not instance.agent:
            # No agent configured: this VM can never report an address (seed 000 entry 7).
            operations.proxy_replace(proxy=proxy, via=RequestedVia.BEAT)
            return "replace"
        if instance.status == "stopped":
            operations.proxy_power(proxy=proxy, action="start", via=RequestedVia.BEAT)
            return "start"
    if proxy.desired_power == DesiredPower.OFF and instance.status == "running":
        operations.proxy_power(proxy=proxy, action="shutdown", via=RequestedVia.BEAT)
        return "shutdown"
    return "observed"


def _needs_read(proxy: Proxy, entry: Mapping[str, Any]) -> bool:
    """Whether the listing alone cannot confirm the proxy's state."""
    running = entry.get("status") == "running" and not entry.get("lock")
    if proxy.desired_power == DesiredPower.OFF:
        return running or proxy.phase != Phase.STOPPED
    return not (running and proxy.phase == Phase.RUNNING and proxy.ip)


def _record(proxy: Proxy, instance: Instance) -> None:
    Proxy.objects.filter(pk=proxy.pk).update(
        phase=_PHASE.get(instance.state, Phase.STOPPED),
        ip=instance.ip,
        node=instance.node,
        vm_created_at=instance.created_at,
        observed_at=timezone.now(),
        last_error="",
        last_error_class="",
    )


def _recreate(proxy: Proxy, why: str) -> str:
    log.info("reconcile re-creates a proxy", extra={"proxy": proxy.name, "reason": why})
    Proxy.objects.filter(pk=proxy.pk).update(
        provider_id="", vmid=None, ip=None, phase=Phase.PENDING, observed_at=timezone.now()
    )
    proxy.refresh_from_db()
    operations.proxy_retry(proxy=proxy, via=RequestedVia.BEAT)
    return "recreate"
