"""The maintenance switch (issue 14): while it is on for a cluster or a node, proxyhub writes
nothing there.

An operator turns it on before working on a node (a kernel update, a disk swap) or on the whole
cluster, with a reason every admin page shows on a banner. While it is on:

* every operation step that would write to a paused node waits (the driver defers it with
  ``pause_updates``), before
  its ceiling, circuit, lease or slot are looked at: the operation is ``waiting`` with a note
  that names the switch, is looked at again every ``PROXYHUB_MAINTENANCE_RECHECK_SECONDS``, and
  the pause does not count toward its age ceiling (``Operation.paused_seconds``). A step whose
  Proxmox task is already running, and the wait for a booted VM's address, only read: they go
  on, and the next write waits;
* reconcile observes but starts nothing there, GC deletes nothing there, template builds wait
  like operations, and ``bootstrap_cluster`` refuses.

Turning it off (``maintenance_end``) sends every operation it held its next step after commit,
so none waits out the re-check interval.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from provisioning.models import Cluster, MaintenanceWindow, Node, Operation
from provisioning.models.choices import ACTIVE_STATES, OperationKind, OperationState
from provisioning.models.maintenance import REASON_MAX

from . import dispatch, slots
from .clock import db_now
from .requesters import requester_name

log = logging.getLogger("proxyhub.operations")

RECHECK_SECONDS = 15.0
# The note on a paused operation starts with this (the admin's display looks for it).
WAIT_NOTE = "waiting for maintenance on "

User = AbstractBaseUser | AnonymousUser | None


class MaintenanceInputError(ValueError):
    """Bad input: the message names the field and what is allowed; nothing was written."""


@dataclass(frozen=True)
class Blocking:
    """Why a write is paused: the switch that holds it."""

    cluster: str
    node: str
    reason: str
    by: str
    since: datetime

    @property
    def target(self) -> str:
        return f"{self.node} of cluster {self.cluster}" if self.node else f"cluster {self.cluster}"

    def note(self) -> str:
        return (
            f"{WAIT_NOTE}{self.target} ({self.reason}), turned on by {self.by} "
            f"at {self.since:%Y-%m-%d %H:%M} UTC"
        )


def recheck_seconds() -> float:
    return max(
        1.0, float(getattr(settings, "PROXYHUB_MAINTENANCE_RECHECK_SECONDS", RECHECK_SECONDS))
    )


# --- the selector: cheap, it runs before every step ------------------------------------------


def maintenance_blocking(cluster_id: Any, node: str | Iterable[str] | None) -> Blocking | None:
    """The switch that pauses a write to ``node`` (or to any of several nodes) of the cluster,
    or None. No node (a create not yet placed): only the cluster's switch pauses it. One query
    on the unique index; the whole cluster's switch wins over a node's."""
    if cluster_id is None:
        return None
    nodes = [node] if isinstance(node, str) else list(node or ())
    window = (
        MaintenanceWindow.objects.filter(cluster_id=cluster_id, node__in=["", *nodes])
        .select_related("cluster")
        .order_by("node")
        .first()
    )
    if window is None:
        return None
    return Blocking(
        cluster=window.cluster.name,
        node=window.node,
        reason=window.reason,
        by=window.started_by,
        since=window.started_at,
    )


def nodes_paused(cluster_id: Any) -> tuple[bool, set[str]]:
    """(whole cluster paused, the nodes paused on their own): for placement, reconcile, GC."""
    names = set(
        MaintenanceWindow.objects.filter(cluster_id=cluster_id).values_list("node", flat=True)
    )
    return "" in names, names - {""}


def maintenance_windows() -> list[MaintenanceWindow]:
    return list(
        MaintenanceWindow.objects.select_related("cluster").order_by("cluster__name", "node")
    )


# --- turning it on and off ---------------------------------------------------------------------


def _target(cluster: Cluster, node: str | None) -> str:
    node = (node or "").strip()
    if node and not Node.objects.filter(cluster=cluster, name=node).exists():
        known = ", ".join(Node.objects.filter(cluster=cluster).values_list("name", flat=True))
        raise MaintenanceInputError(
            f'node "{node}" is not a node of cluster {cluster.name} (its nodes: {known or "none"})'
        )
    return node


def maintenance_start(
    *, cluster: Cluster, node: str | None = None, reason: str, user: User, via: str = "command"
) -> MaintenanceWindow:
    """Turn maintenance on for the cluster (``node`` blank) or one of its nodes. Turning on a
    switch that is on keeps when and by whom it was turned on and takes the new reason."""
    node = _target(cluster, node)
    reason = " ".join((reason or "").split())
    if not reason:
        raise MaintenanceInputError("reason is required: say why, it is shown on every page")
    if len(reason) > REASON_MAX:
        raise MaintenanceInputError(
            f"reason is {len(reason)} characters long; at most {REASON_MAX} are allowed"
        )
    with transaction.atomic():
        window, created = MaintenanceWindow.objects.get_or_create(
            cluster=cluster,
            node=node,
            defaults={
                "reason": reason,
                "started_by": requester_name(user, via) or via,
                "started_at": db_now(),
            },
        )
        if not created and window.reason != reason:
            window.reason = reason
            window.save(update_fields=["reason"])
    log.info(
        "maintenance on",
        extra={"cluster": cluster.name, "node": node, "by": window.started_by},
    )
    return window


def maintenance_end(*, cluster: Cluster, node: str | None = None) -> bool:
    """Turn the switch off; returns whether it was on. Every operation of the cluster that
    maintenance held is sent its next step after commit (one still held by another switch
    waits again)."""
    node = _target(cluster, node)
    with transaction.atomic():
        ended, _ = MaintenanceWindow.objects.filter(cluster=cluster, node=node).delete()
        if ended:
            resumed = _resume_paused(cluster, db_now())
            log.info(
                "maintenance off",
                extra={"cluster": cluster.name, "node": node, "resumed": resumed},
            )
    return bool(ended)


def _resume_paused(cluster: Cluster, now: datetime) -> int:
    """Give each paused operation of the cluster a fresh message due now. The dispatch token
    changes only on a row no delivery holds (claim empty), so a running step is never doubled:
    the one running finds the switch off itself."""
    resumed = 0
    for op in Operation.objects.filter(
        cluster=cluster, state__in=ACTIVE_STATES, paused_since__isnull=False, claim_token=""
    ).only("pk", "trace_parent"):
        token = secrets.token_hex(8)
        if Operation.objects.filter(pk=op.pk, claim_token="").update(
            dispatch_token=token, dispatched_at=now, next_step_at=now, redispatches=0
        ):
            dispatch.send_after_commit(str(op.pk), token, 0.0, op.trace_parent)
            resumed += 1
    return resumed


# --- the driver's gate -------------------------------------------------------------------------


def nodes_written(op: Operation) -> tuple[str, ...] | None:
    """The nodes the operation's next step may write to; None when it only reads (its task is
    already running and it polls it, or it waits for a booted VM's address). An empty tuple:
    a write whose node is not chosen yet (a create before placement), paused by the cluster's
    switch alone."""
    progress = op.progress or {}
    if progress.get("stage") == "address" or slots.need_of(op).in_flight:
        return None
    record = slots.step_record(str(op.kind), progress) or {}
    nodes: list[Any] = [record.get("node"), record.get("template_node")]
    target = progress.get("target") or {}
    nodes.extend(target.get("earlier_nodes") or ())
    proxy = op.proxy
    if op.kind in (OperationKind.CREATE, OperationKind.REPLACE):
        nodes.append(progress.get("zone"))
        if proxy is not None and "zone" not in progress:
            nodes.append(proxy.zone)
    if op.kind not in (OperationKind.CREATE, OperationKind.TEMPLATE_BUILD) and proxy is not None:
        # What is acted on in place, or deleted first, is the VM where it was last seen.
        nodes.append(proxy.node)
    return tuple(dict.fromkeys(str(n) for n in nodes if n))


def with_switches_flag(operations: QuerySet[Operation]) -> QuerySet[Operation]:
    """``operations``, each also telling whether any switch of its cluster is on
    (``cluster_switched``): the driver reads its operation this way, so a step on a cluster with
    none asks nothing more (issue 12: the switches' own read was one statement per writing
    step). A switch turned on after that read holds the next step, as one turned on right
    after the switches' own read did."""
    return operations.annotate(
        cluster_switched=Exists(MaintenanceWindow.objects.filter(cluster_id=OuterRef("cluster_id")))
    )


def no_switch_read(op: Operation) -> bool:
    """Whether the operation's read (``with_switches_flag``) found no switch on in its cluster;
    False when it was read without the flag, which then says nothing."""
    return getattr(op, "cluster_switched", True) is False


def operation_blocking(op: Operation) -> Blocking | None:
    """The switch that holds the operation's next step, or None when it may run."""
    if op.cluster_id is None or no_switch_read(op):
        return None
    nodes = nodes_written(op)
    if nodes is None:
        return None
    return maintenance_blocking(op.cluster_id, nodes)


def pause_updates(operation: Operation, blocking: Blocking, now: datetime) -> dict[str, Any]:
    """What a paused operation's row shows besides its deferral: ``waiting``, the switch's note,
    and when the pause began (unless it already ran)."""
    updates: dict[str, Any] = {"state": OperationState.WAITING, "last_error": blocking.note()}
    if operation.paused_since is None:
        updates["paused_since"] = now
    log.info(
        "step waits for maintenance",
        extra={"operation": str(operation.pk), "target": blocking.target},
    )
    return updates


def operation_unpause(*, operation: Operation, now: datetime) -> None:
    """The switch is off: add the pause to ``paused_seconds`` and clear the note."""
    if operation.paused_since is None:
        return
    paused = max(0.0, (now - operation.paused_since).total_seconds())
    operation.paused_seconds = float(operation.paused_seconds or 0.0) + paused
    operation.paused_since = None
    note = operation.last_error if not operation.last_error.startswith(WAIT_NOTE) else ""
    operation.last_error = note
    Operation.objects.filter(pk=operation.pk).update(
        paused_seconds=operation.paused_seconds, paused_since=None, last_error=note
    )


def refusal(cluster: Cluster) -> str:
    """The words for a door that refuses to write while the cluster's switch is on."""
    blocking = maintenance_blocking(cluster.pk, ())
    if blocking is None:
        return ""
    return (
        f"cluster {cluster.name} is in maintenance ({blocking.reason}, turned on by "
        f"{blocking.by}); turn it off first: manage.py maintenance off --cluster {cluster.name}"
    )
