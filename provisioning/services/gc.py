"""Garbage collection (DESIGN.md §2 and §5, seed 000 entries 11 and 12).

Two kinds of garbage, per cluster, from one listing:

* **VMs** of *this* installation (mark ``proxyhub-installation=<ours>``) whose UID belongs to
  no proxy row and that are older than the minimum age. Each becomes a journalled delete
  operation, so GC's deletes show in the journal like any other. Another installation's VMs,
  unmarked VMs and foreign ``proxy-*`` VMs are never candidates.
* **Seed ISOs** ``proxy-*-seed.iso`` on ``isoStorage`` that no VM in the cluster is named for
  and no proxy row will use, older than the minimum age. A seed a VM of any installation still
  boots from is kept: its name matches that VM.

``gc_plan`` only reads; ``gc_run(dry_run=True)`` returns exactly what ``gc_run()`` would remove.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import ACTIVE_STATES, OperationKind
from provisioning.proxmox.errors import ClassifiedError, ProxmoxError, classify

from . import operations
from .leases import job_lease
from .providers import provider_for

log = logging.getLogger("proxyhub.gc")


@dataclass(frozen=True)
class GcItem:
    """One thing GC removes (or, dry-run, would remove)."""

    kind: str  # "vm" or "seed"
    cluster: str
    node: str
    name: str  # the VM name (for a seed: the VM it was for)
    vmid: int | None
    volid: str | None
    uid: str
    age_seconds: int | None
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cluster": self.cluster,
            "node": self.node,
            "name": self.name,
            "vmid": self.vmid,
            "volid": self.volid,
            "uid": self.uid,
            "ageSeconds": self.age_seconds,
            "reason": self.reason,
        }


def min_age_seconds() -> float:
    return float(getattr(settings, "PROXYHUB_GC_MIN_AGE_SECONDS", 900))


def gc_plan(cluster: Cluster, *, min_age: float | None = None) -> list[GcItem]:
    """What GC would remove from ``cluster`` now. Makes only GET requests."""
    min_age = min_age_seconds() if min_age is None else min_age
    provider = provider_for(cluster)
    now = timezone.now()
    try:
        listing = provider.api.cluster_resources()
    except Exception as err:
        raise classify("list", err) from err
    live_uids = {str(u) for u in Proxy.objects.values_list("uid", flat=True)}
    proxy_vm_names = {f"proxy-{n}" for n in Proxy.objects.values_list("name", flat=True)}
    being_deleted = _gc_deletes_in_flight(cluster)
    items: list[GcItem] = []
    for vm in provider.list_managed(listing=listing):
        if vm.uid and vm.uid in live_uids:
            continue
        if vm.vmid in being_deleted:
            continue
        age = _age(vm.created_at, now)
        if age is not None and age < min_age:
            continue
        reason = "no proxy has its uid" if vm.uid else "its mark carries no uid"
        items.append(
            GcItem(
                "vm",
                cluster.name,
                vm.node,
                vm.name,
                vm.vmid,
                None,
                vm.uid,
                None if age is None else int(age),
                reason,
            )
        )
    for seed in provider.list_orphan_seeds(listing=listing):
        if seed.vm_name in proxy_vm_names:
            continue  # a proxy whose VM is on its way will boot from it
        age = None if seed.ctime is None else now.timestamp() - seed.ctime
        if age is not None and age < min_age:
            continue
        items.append(
            GcItem(
                "seed",
                cluster.name,
                seed.node,
                seed.vm_name,
                None,
                seed.volid,
                "",
                None if age is None else int(age),
                "no VM is named for it",
            )
        )
    return items


def gc_run(*, dry_run: bool = False, min_age: float | None = None) -> list[GcItem]:
    """Plan (and unless ``dry_run``, remove) garbage on every cluster, holding the GC lease."""
    done: list[GcItem] = []
    with job_lease("gc", seconds=600):
        for cluster in Cluster.objects.all():
            try:
                plan = gc_plan(cluster, min_age=min_age)
            except ClassifiedError as err:
                log.warning(
                    "gc skipped a cluster", extra={"cluster": cluster.name, "error": str(err)}
                )
                continue
            if not dry_run:
                _remove(cluster, plan)
            done.extend(plan)
    log.info(
        "gc round",
        extra={
            "dry_run": dry_run,
            "vms": sum(i.kind == "vm" for i in done),
            "seeds": sum(i.kind == "seed" for i in done),
        },
    )
    return done


def _remove(cluster: Cluster, plan: list[GcItem]) -> None:
    provider = provider_for(cluster)
    for item in plan:
        if item.kind == "vm":
            assert item.vmid is not None
            operations.operation_for_gc(
                cluster=cluster, vm_name=item.name, uid=item.uid, vmid=item.vmid
            )
        else:
            assert item.volid is not None
            try:
                provider.api.delete_volume(item.node, provider.config.iso_storage, item.volid)
            except ProxmoxError as err:
                log.warning(
                    "gc could not delete a seed", extra={"volid": item.volid, "error": str(err)}
                )


def _gc_deletes_in_flight(cluster: Cluster) -> set[int]:
    vmids: set[int] = set()
    for progress in Operation.objects.filter(
        cluster=cluster, proxy__isnull=True, kind=OperationKind.DELETE, state__in=ACTIVE_STATES
    ).values_list("progress", flat=True):
        vmid = (progress or {}).get("target", {}).get("vmid")
        if vmid is not None:
            vmids.add(int(vmid))
    return vmids


def _age(created: datetime | None, now: datetime) -> float | None:
    """Seconds since creation; an unknown creation time counts as old (seed 000 entry 8)."""
    if created is None:
        return None
    return (now - created.astimezone(UTC)).total_seconds()
