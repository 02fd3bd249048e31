"""Reconcile: make Proxmox hold what the database asks for (DESIGN.md §5).

One ``/cluster/resources`` listing per cluster per round serves all its proxies. A proxy is read
further (config, status, agent) only when the listing cannot settle it: not yet ``Running``
with an address, or its VM's entry changed (not running, locked, renamed). So a round over a
converged fleet makes one request per cluster and no mutation.

What a round does per idle proxy (no operation running):
* asked to be deleted: a delete;
* no VM yet, or its VM vanished: a create (the create adopts a VM of ours if one exists);
* a VM that can never report an address (its agent config was removed): a replace;
* power: a stopped VM that should run is started; a running one that should not is shut
  down. A deliberately stopped proxy (``desired_power`` off) stays stopped;
* drift (issue 14): cores, memory or net0 that differ from what the VM was built with are
  recorded on the proxy; under the cluster's ``repair`` drift policy a ``repair`` operation
  sets them back (``proxmox/repair.py``). When the config is read for drift is
  ``services/drift.py``'s rule, which keeps a converged round at one listing.
Where maintenance is on (issue 14, ``services/maintenance.py``) a round observes and records as
usual but starts nothing. Proxies latched ``Failed`` are left for an operator, and so is a power
action or replace whose latest try failed: the proxy shows why, and the next try is the
operator's (every retry has a ceiling; reconcile's is one).

**Decisions on fresh state** (issue 10). A listing can take seconds to minutes; meanwhile an
operator may shut a proxy down, replace it or retry it. So the snapshot only nominates: every
decision is taken again under the proxy's row lock, on the row as it is then, and applied only
if no operation started or ended on the proxy since the snapshot (its ``generation`` did not
move), nothing the operator asks for changed, and it is still idle. Reconcile never changes
``desired_*``, never supersedes an operation, and starts its own operations through
``operations.proxy_converge``. The round stops starting new work at its deadline.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from provisioning.models import CircuitBreaker, Cluster, Operation, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredPower,
    DesiredState,
    DriftPolicy,
    ErrorClass,
    OperationKind,
    OperationState,
    Phase,
)
from provisioning.proxmox.drift import Spec, read_sizing
from provisioning.proxmox.errors import ClassifiedError, NotFoundError, classify
from provisioning.proxmox.identity import IdentityMismatch
from provisioning.proxmox.observe import Instance

from . import circuit, drift, maintenance, operations
from .clock import db_now
from .leases import job_lease
from .providers import provider_for
from .rounds import round_timing
from .runners import NO_IDENTITY, recorded_identity

log = logging.getLogger("proxyhub.reconcile")

_PHASE = {"Running": Phase.RUNNING, "Provisioning": Phase.PROVISIONING, "Stopped": Phase.STOPPED}
# What an operator asks for: a decision is void when any of it changed since the snapshot.
_INTENT = ("desired_state", "desired_power", "spec_hash", "provider_id", "vmid", "phase")


@dataclass
class Decision:
    """What reconcile wants for one proxy: a name for the round's counts, observed fields to
    write, and an operation to start (``kind``) with the reason the journal shows."""

    name: str
    observed: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    reason: str = ""


def reconcile_round() -> Counter[str]:
    """Reconcile every cluster once, holding the ``reconcile`` lease, within the deadline."""
    timing = round_timing()
    stop_at = time.monotonic() + timing.deadline
    totals: Counter[str] = Counter()
    with job_lease("reconcile", seconds=timing.lease):
        for cluster in Cluster.objects.all():
            if time.monotonic() > stop_at:
                totals["past_deadline"] += 1
                continue
            try:
                totals.update(reconcile_cluster(cluster, stop_at=stop_at))
            except ClassifiedError as err:
                # One unreachable cluster must not stop the others.
                log.warning(
                    "reconcile skipped a cluster",
                    extra={"cluster": cluster.name, "error": str(err)},
                )
                totals["cluster_errors"] += 1
    return totals


def reconcile_cluster(cluster: Cluster, *, stop_at: float | None = None) -> Counter[str]:
    counts: Counter[str] = Counter()
    proxies = list(Proxy.objects.filter(cluster=cluster).exclude(phase=Phase.FAILED))
    if not proxies:
        return counts
    breaker = CircuitBreaker.objects.filter(pk=cluster.pk).first()
    now = db_now()
    # A cluster that went silent would hold this worker for a whole request timeout on the
    # listing; a cold one is probed first, which costs a few seconds and counts the failure.
    admission = circuit.circuit_admit(cluster=cluster, breaker=breaker, now=now)
    if not admission.allowed:
        counts["unreachable" if admission.cold else "circuit_open"] += len(proxies)
        return counts
    busy = set(
        Operation.objects.filter(
            proxy__in=[p.pk for p in proxies], state__in=ACTIVE_STATES
        ).values_list("proxy_id", flat=True)
    )
    provider = provider_for(cluster)
    started = time.monotonic()
    try:
        listing = provider.api.cluster_resources()
    except Exception as err:
        error = classify("list", err)
        if error.unreachable:
            circuit.circuit_record_failure(
                cluster_id=cluster.pk,
                error=str(error),
                now=db_now(),
                seconds=time.monotonic() - started,
            )
        raise error from err
    circuit.circuit_record_success(cluster_id=cluster.pk, breaker=breaker, now=db_now())
    by_vmid = {int(e["vmid"]): e for e in listing if "vmid" in e}
    # The listing's uptimes are as of no later than this: a start they date is never dated
    # earlier than it was (``_started_since_identity_read``).
    now = db_now()
    due = drift.rotation_due((p for p in proxies if p.pk not in busy), now)
    for proxy in proxies:
        if stop_at is not None and time.monotonic() > stop_at:
            counts["past_deadline"] += 1
            continue
        if proxy.pk in busy:
            counts["busy"] += 1
            continue
        decision = _decide(proxy, provider, listing, by_vmid, now, drift_due=proxy.pk in due)
        counts[_apply(proxy, decision)] += 1
    return counts


# --- deciding on the snapshot (no lock held: it may read Proxmox) ------------------------------


def _decide(
    proxy: Proxy,
    provider: Any,
    listing: list[dict[str, Any]],
    by_vmid: Mapping[int, Mapping[str, Any]],
    now: datetime,
    *,
    drift_due: bool = False,
) -> Decision:
    if proxy.desired_state == DesiredState.DELETED:
        return Decision("delete", kind=OperationKind.DELETE, reason="the proxy is to be deleted")
    if not proxy.provider_id:
        return Decision("create", kind=OperationKind.CREATE, reason="the proxy has no VM")
    entry = by_vmid.get(proxy.vmid or -1)
    if entry is None or (entry.get("name") and entry.get("name") != proxy.vm_name):
        return _recreate("its VM is gone")
    spec = drift.proxy_spec(proxy, provider.config)
    if not _needs_read(proxy, entry, now):
        if _started_since_identity_read(proxy, entry, now):
            # Seed 001: the listing cannot show identity, and a VM started since it was last
            # read may be another one (restored, re-created at the VMID): one config read.
            return _drift_check(proxy, provider, entry, spec, now)
        if spec is None or not (drift_due or drift.listing_suggests_drift(proxy, entry, spec)):
            return Decision("converged")
        return _drift_check(proxy, provider, entry, spec, now)
    try:
        instance = provider.get(
            proxy.provider_id, listing=listing, identity=recorded_identity(proxy)
        )
    except NotFoundError:
        return _recreate("its VM is gone")
    except IdentityMismatch as err:
        return _identity_mismatch(err)
    except ClassifiedError as err:
        return Decision(
            "unreadable",
            observed={"last_error": str(err), "last_error_class": ErrorClass.TRANSIENT},
        )
    observed = _observed(instance)
    observed["identity_checked_at"] = now  # ``get`` compared it (or recorded the first one)
    if spec is not None and instance.sizing is not None:
        observed.update(drift.drift_observed(proxy, spec, instance.sizing, entry, now))
    if proxy.desired_power == DesiredPower.ON and instance.state == "Stopped":
        if instance.lock == "suspended":
            # Never clears by itself; an operator resumes or destroys it.
            return Decision("hibernated", observed)
        if instance.status == "running" and instance.qmpstatus in ("paused", "suspended"):
            return Decision("paused", observed)  # an operator paused it in Proxmox
        if not instance.agent:
            # No agent configured: this VM can never report an address (seed 000 entry 7).
            return Decision(
                "replace",
                observed,
                OperationKind.REPLACE,
                "its VM has no guest agent, so it can never report an address",
            )
        if instance.status == "stopped":
            return Decision("start", observed, OperationKind.START, "it should run and is stopped")
    if proxy.desired_power == DesiredPower.OFF and instance.status == "running":
        return Decision(
            "shutdown", observed, OperationKind.SHUTDOWN, "it should be off and is running"
        )
    settled = observed["phase"] in (Phase.RUNNING, Phase.STOPPED)
    return _with_drift(provider, Decision("observed", observed), settled=settled)


def _identity_mismatch(err: IdentityMismatch) -> Decision:
    """Seed 001: our name and mark on another VM (restored, or re-created at the VMID). It is
    neither ours nor gone: shown on the proxy, latched Failed so no round acts on it, and never
    recreated over, started, stopped, repaired or destroyed."""
    observed = {
        "phase": Phase.FAILED,
        "last_error": str(err),
        "last_error_class": ErrorClass.IDENTITY,
    }
    return Decision("identity_mismatch", observed)


def _drift_check(
    proxy: Proxy, provider: Any, entry: Mapping[str, Any], spec: Spec | None, now: datetime
) -> Decision:
    """One config read of a converged proxy, for its drift (``services/drift.py``) and its
    identity (seed 001): ``read_sizing`` compares the recorded identity with the config's.
    Without a spec (its machine type left the catalogue), for the identity alone."""
    try:
        sizing = read_sizing(
            provider.api,
            proxy.provider_id,
            node=str(entry.get("node", "")),
            identity=recorded_identity(proxy),
        )
    except IdentityMismatch as err:
        return _identity_mismatch(err)
    except ClassifiedError:
        # Locked, moving, or gone since the listing: the next round's listing tells; the drift
        # check is not due any less for it.
        return Decision("converged")
    if spec is None:
        return Decision("identity_checked", {"identity_checked_at": now})
    observed = drift.drift_observed(proxy, spec, sizing, entry, now)
    observed["identity_checked_at"] = now
    return _with_drift(provider, Decision("drift_checked", observed), settled=True)


def _with_drift(provider: Any, decision: Decision, *, settled: bool) -> Decision:
    """``decision`` (which starts nothing) turned into a repair when the observation found drift,
    the VM is settled (running with its address, or stopped) and the cluster's policy says
    ``repair``; otherwise it only records the drift."""
    found = decision.observed.get("drift")
    if not found:
        return decision
    if not settled or provider.config.drift_policy != DriftPolicy.REPAIR:
        return Decision("drift", decision.observed)
    return Decision(
        "repair",
        decision.observed,
        OperationKind.REPAIR,
        "its VM differs from its spec: " + drift.drift_summary(found),
    )


def _recreate(why: str) -> Decision:
    observed = {
        "provider_id": "",
        "vmid": None,
        "ip": None,
        "phase": Phase.PENDING,
        **NO_IDENTITY,
    }
    return Decision("recreate", observed, OperationKind.CREATE, why)


def _needs_read(proxy: Proxy, entry: Mapping[str, Any], now: datetime) -> bool:
    """Whether the listing alone cannot confirm the proxy's state."""
    if not (proxy.smbios_uuid or proxy.vmgenid) and _started_since_identity_read(proxy, entry, now):
        # A proxy from before identity was kept: the full read records the first one.
        return True
    running = entry.get("status") == "running" and not entry.get("lock")
    if proxy.desired_power == DesiredPower.OFF:
        return running or proxy.phase != Phase.STOPPED
    return not (running and proxy.phase == Phase.RUNNING and proxy.ip)


def _started_since_identity_read(proxy: Proxy, entry: Mapping[str, Any], now: datetime) -> bool:
    """Whether the listing shows the VM running since a start later than the last read of its
    identity (seed 001, issue 14).

    The listing's ``uptime`` comes from pvestatd's last pass, up to 10 s old (pve-reference
    §7.9), so ``now - uptime`` is never earlier than the real start: a VM restored and started
    after the last identity read always shows a start after it, however soon it came. The
    price is the other way round: a start up to 10 s before a read may look like one after
    it (the whole-second uptime adds up to 1 s more), so a VM read within that window of its
    start is read again by a later round whose listing dates the start after the read; which
    round that is depends on the listing's age, and a read made past the window is never
    repeated. A running VM listed with no uptime yet is judged at the next round. Compared
    with the last observation instead (before issue 14), a start within 10 s of it had to be
    taken for the one it saw, and a VM restored then escaped until the next config read."""
    if entry.get("status") != "running":
        return False
    uptime = entry.get("uptime")
    if not isinstance(uptime, int | float) or isinstance(uptime, bool) or uptime <= 0:
        return False
    if proxy.identity_checked_at is None:
        return True  # never read since it was recorded (or from before it was kept)
    return now - timedelta(seconds=float(uptime)) > proxy.identity_checked_at


def _observed(instance: Instance) -> dict[str, Any]:
    return {
        "phase": _PHASE.get(instance.state, Phase.STOPPED),
        "ip": instance.ip,
        "node": instance.node,
        "vm_created_at": instance.created_at,
        "last_error": "",
        "last_error_class": "",
        # The recorded identity, or the first one for a proxy from before it was kept.
        "smbios_uuid": instance.smbios_uuid,
        "vmgenid": instance.vmgenid,
    }


# --- applying on fresh state (under the proxy's row lock) --------------------------------------


def _apply(snapshot: Proxy, decision: Decision) -> str:
    if decision.name == "converged":
        return decision.name
    with transaction.atomic():
        proxy = Proxy.objects.select_for_update().filter(pk=snapshot.pk).first()
        if proxy is None:
            return "gone"
        if _stale(snapshot, proxy):
            return "changed"
        if decision.kind and _tried_and_failed(proxy, decision.kind):
            # Reconcile already tried this and it failed: the proxy keeps showing why, and the
            # next try is the operator's.
            return "held"
        observed = dict(decision.observed)
        if observed:
            observed["observed_at"] = db_now()
            Proxy.objects.filter(pk=proxy.pk).update(**observed)
            for name, value in observed.items():
                setattr(proxy, name, value)
        if decision.kind and _in_maintenance(proxy):
            # Issue 14: observed, recorded, and nothing started; the round after the switch
            # is off decides again on the state it then finds.
            return "maintenance"
        if decision.kind:
            operations.proxy_converge(proxy=proxy, kind=decision.kind, reason=decision.reason)
    return decision.name


def _in_maintenance(proxy: Proxy) -> bool:
    """Whether the node the operation would write to (the VM's, else the proxy's zone; none
    for a create still to be placed) or the whole cluster is in maintenance."""
    node = proxy.node or proxy.zone
    return maintenance.maintenance_blocking(proxy.cluster_id, node or ()) is not None


def _stale(snapshot: Proxy, now: Proxy) -> bool:
    """Whether the decision taken on ``snapshot`` no longer holds for the row as it is now."""
    if now.generation != snapshot.generation:
        return True  # an operation started or ended since the snapshot
    if any(getattr(now, name) != getattr(snapshot, name) for name in _INTENT):
        return True
    return Operation.objects.filter(proxy=now, state__in=ACTIVE_STATES).exists()


def _tried_and_failed(proxy: Proxy, kind: str) -> bool:
    """Whether the proxy's latest operation is this same kind and failed (not superseded):
    reconcile does not repeat it, whoever asked for it (seed 001: a failed power task is not
    retried); the proxy shows the failure, and an operator's new request moves it on."""
    if kind in (OperationKind.CREATE, OperationKind.DELETE):
        return False  # those latch the proxy Failed themselves when they cannot go on
    latest = (
        Operation.objects.filter(proxy=proxy)
        .order_by("-created_at")
        .values("kind", "state", "last_error")
        .first()
    )
    return bool(
        latest
        and latest["kind"] == kind
        and latest["state"] == OperationState.FAILED
        and not str(latest["last_error"]).startswith("superseded")
    )
