"""Garbage collection (DESIGN.md §2 and §5, seed 000 entries 11 and 12).

Two kinds of garbage, per cluster, from one listing:

* **VMs** of *this* installation (mark ``proxyhub-installation=<ours>``) whose UID belongs to
  no proxy row and that are older than the minimum age. Each becomes a journalled delete
  operation, so GC's deletes show in the journal like any other. Another installation's VMs,
  unmarked VMs and foreign ``proxy-*`` VMs are never candidates.
* **Seed ISOs** of *this* installation on ``isoStorage`` (their name carries its tag and the
  proxy's, ``seed.seed_iso_name``) that no VM in the cluster is named for and whose proxy uid
  belongs to no proxy row, older than the minimum age. Another installation's seeds are never
  candidates, nor are seeds of the legacy form ``proxy-<name>-seed.iso``, which cannot be
  attributed (the operator guide says how to clear those by hand).

A VM whose mark carries no uid is not collected either: a destroy refuses it (issue 11).

``gc_plan`` only reads; ``gc_run(dry_run=True)`` returns exactly what ``gc_run()`` would remove.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q

from provisioning.models import Cluster, GcRound, Operation, Proxy
from provisioning.models.choices import ACTIVE_STATES, OperationKind
from provisioning.proxmox.errors import ClassifiedError, ProxmoxError, classify
from provisioning.proxmox.seed import uid_tag

from . import operations
from .clock import db_now
from .installation import identity_problem
from .leases import job_lease
from .maintenance import nodes_paused
from .providers import provider_for
from .rounds import round_timing

log = logging.getLogger("proxyhub.gc")

# How many VMs and seeds one round removes at most (PROXYHUB_GC_MAX_DELETES_PER_ROUND).
MAX_DELETES_PER_ROUND = 50


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
    now = db_now()
    try:
        listing = provider.api.cluster_resources()
    except Exception as err:
        raise classify("list", err) from err
    live_uids: set[str] = set()
    proxy_vm_names: set[str] = set()
    for uid, name in Proxy.objects.values_list("uid", "name").iterator(chunk_size=5000):
        live_uids.add(str(uid))
        proxy_vm_names.add(f"proxy-{name}")
    live_uid_tags = {uid_tag(u) for u in live_uids}
    being_deleted = _gc_deletes_in_flight(cluster)
    items: list[GcItem] = []
    # A VM named for a live proxy is never garbage (below), so the listing's name settles it
    # and its config is not read: a healthy fleet costs one listing, not one read per proxy.
    for vm in provider.list_managed(listing=listing, skip_names=proxy_vm_names):
        if not vm.uid:
            # Not provably ours: the delete would refuse it, every round (issue 11).
            log.info("gc left a vm without uid", extra={"vmid": vm.vmid, "vm_name": vm.name})
            continue
        if vm.uid in live_uids:
            continue
        if vm.name in proxy_vm_names:
            continue  # a live proxy's name: never garbage, whatever its mark says
        if vm.vmid in being_deleted:
            continue
        age = _age(vm.created_at, now)
        if age is not None and age < min_age:
            continue
        reason = "no proxy has its uid"
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
        if seed.uid_tag in live_uid_tags:
            continue  # its proxy lives: a VM on its way may boot from it
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


class GcRefused(Exception):
    """GC will not delete anything: the installation identity cannot be trusted."""


def max_deletes_per_round() -> int:
    return int(getattr(settings, "PROXYHUB_GC_MAX_DELETES_PER_ROUND", MAX_DELETES_PER_ROUND))


def gc_run(
    *, dry_run: bool = False, min_age: float | None = None, via: str = "beat"
) -> list[GcItem]:
    """Plan (and unless ``dry_run``, remove) garbage on every cluster, holding the GC lease.

    At most ``PROXYHUB_GC_MAX_DELETES_PER_ROUND`` items go per round, oldest first; the rest
    are held back for the next round and recorded (``GcRound``), so a mistake (a database that
    lost its proxies, a wrong identity) costs a bounded, visible amount. The round stops starting
    new work at its deadline. Nothing is deleted when the installation identity kept outside
    the database is missing or disagrees with the database's (``GcRefused``).
    """
    timing = round_timing()
    stop_at = time.monotonic() + timing.deadline
    record = GcRound(started_at=db_now(), dry_run=dry_run, requested_via=via)
    problem = identity_problem()
    if problem and not dry_run:
        record.refused = [{"cluster": "", "reason": problem}]
        record.finished_at = db_now()
        record.save()
        log.error("gc refused", extra={"reason": problem})
        raise GcRefused(problem)
    done: list[GcItem] = []
    held: list[GcItem] = []
    budget = max_deletes_per_round()
    with job_lease("gc", seconds=timing.lease):
        for cluster in Cluster.objects.all():
            if time.monotonic() > stop_at:
                record.refused.append({"cluster": cluster.name, "reason": "round deadline"})
                continue
            try:
                plan = gc_plan(cluster, min_age=min_age)
            except ClassifiedError as err:
                log.warning(
                    "gc skipped a cluster", extra={"cluster": cluster.name, "error": str(err)}
                )
                record.refused.append({"cluster": cluster.name, "reason": str(err)})
                continue
            plan = _outside_maintenance(cluster, plan, record)
            plan.sort(key=_oldest_first)
            take, rest = plan[:budget], plan[budget:]
            budget -= len(take)
            if not dry_run:
                take = _remove(cluster, take)
            done.extend(take)
            held.extend(rest)
    record.removed = [item.as_json() for item in done]
    record.held_back = [item.as_json() for item in held]
    record.finished_at = db_now()
    record.save()
    log.info(
        "gc round",
        extra={
            "dry_run": dry_run,
            "vms": sum(i.kind == "vm" for i in done),
            "seeds": sum(i.kind == "seed" for i in done),
            "held_back": len(held),
        },
    )
    return done


def _outside_maintenance(cluster: Cluster, plan: list[GcItem], record: GcRound) -> list[GcItem]:
    """Issue 14: nothing is deleted on a cluster or node in maintenance. What is left there is
    not held back (it is not this round's to take) and is found again by a later round; the
    round's record says what maintenance kept."""
    whole, nodes = nodes_paused(cluster.pk)
    kept = [item for item in plan if whole or item.node in nodes]
    if kept:
        where = "the cluster" if whole else "node(s) " + ", ".join(sorted({i.node for i in kept}))
        record.refused.append(
            {"cluster": cluster.name, "reason": f"{len(kept)} item(s) kept: {where} in maintenance"}
        )
    kept_ids = {id(item) for item in kept}
    return [item for item in plan if id(item) not in kept_ids]


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _oldest_first(item: GcItem) -> tuple[int, int]:
    # An unknown age counts as old (seed 000 entry 8): such items go first.
    return (0 if item.age_seconds is None else 1, -(item.age_seconds or 0))


def _remove(cluster: Cluster, plan: list[GcItem]) -> list[GcItem]:
    """Remove each item on its own, so one failure never aborts the round; returns what went.

    A VM becomes a journalled delete, decided under a transaction that checks again, on the
    database as it is now, that no proxy owns the VM (by uid or by name) and no GC delete of
    it runs; the delete itself checks name, mark and uid once more right before it destroys.
    """
    provider = provider_for(cluster)
    removed: list[GcItem] = []
    for item in plan:
        try:
            if item.kind == "vm" and _start_vm_delete(cluster, item):
                removed.append(item)
            elif item.kind == "seed":
                assert item.volid is not None
                provider.api.delete_volume(item.node, provider.config.iso_storage, item.volid)
                removed.append(item)
        except (ProxmoxError, DatabaseError) as err:
            log.warning(
                "gc could not remove an item",
                extra={"kind": item.kind, "name": item.name, "error": str(err)},
            )
    return removed


def _start_vm_delete(cluster: Cluster, item: GcItem) -> bool:
    assert item.vmid is not None
    with transaction.atomic():
        owned = Proxy.objects.filter(
            Q(name=item.name.removeprefix("proxy-")) | Q(uid=item.uid)
            if item.uid
            else Q(name=item.name.removeprefix("proxy-"))
        ).exists()
        if owned or item.vmid in _gc_deletes_in_flight(cluster):
            return False
        operations.operation_for_gc(
            cluster=cluster, vm_name=item.name, uid=item.uid, vmid=item.vmid
        )
    return True


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
