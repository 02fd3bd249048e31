"""Running an operation one step per delivery (DESIGN.md §6).

Each delivery of the step task calls ``operation_run_step``:

1. **claim** the operation with a conditional UPDATE: only the message carrying the current
   ``dispatch_token``, for an unfinished operation whose step is due and that no other delivery
   is running, gets it; a duplicate or stale message exits as a no-op;
2. **lease** the proxy for this operation (one chain per proxy across all workers), again by a
   conditional UPDATE; a proxy leased by another operation makes this one wait;
3. run **one** step of the provider's step machine, with no transaction or row lock held;
4. **journal** the step (its UPID before any wait), the progress record and the proxy's
   observed state in one transaction, release the claim, and send the next message after
   commit, with a countdown while Proxmox works. No worker slot waits on Proxmox.

A transient failure retries the step with a capped exponential backoff, visible in the
journal; a permanent one ends the operation and latches the proxy ``Failed``.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredState,
    ErrorClass,
    OperationKind,
    OperationState,
    Phase,
    StepState,
)
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.errors import ClassifiedError, NotFoundError, classify
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.steps import StepResult

from .placement import assert_node_ready, choose_node
from .providers import provider_for

if TYPE_CHECKING:
    from provisioning.proxmox.power_checks import Action

log = logging.getLogger("proxyhub.operations")

# A delivery's claim outlives the step task's hard time limit, so a killed worker's claim
# expires and the sweeper can send the step again (setting PROXYHUB_STEP_CLAIM_SECONDS; only
# tests that kill workers shorten it, to see recovery without waiting four minutes).
CLAIM_SECONDS = 240
# How early a countdown message may arrive and still count as due (clock skew between hosts).
DUE_SLACK = timedelta(seconds=2)
# After the provider reports the VM running, how long to keep polling for its address, and
# how often (settings PROXYHUB_ADDRESS_BUDGET_SECONDS / PROXYHUB_ADDRESS_POLL_SECONDS).
ADDRESS_BUDGET = 900.0
ADDRESS_POLL = 3.0


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass
class Outcome:
    """What one step did, in the journal's terms."""

    result: StepResult
    progress: dict[str, Any]
    proxy: dict[str, Any] = field(default_factory=dict)  # observed fields to write
    finished: bool = False
    delete_proxy: bool = False
    phase_name: str = ""  # the journal step name; defaults to the provider's stage


def operation_run_step(*, operation_id: str, token: str) -> None:
    """Run at most one step of the operation; see the module docstring."""
    now = timezone.now()
    claim = secrets.token_hex(8)
    claimed = (
        Operation.objects.filter(pk=operation_id, dispatch_token=token, state__in=ACTIVE_STATES)
        .filter(Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=now))
        .filter(Q(next_step_at__isnull=True) | Q(next_step_at__lte=now + DUE_SLACK))
        .update(
            claim_token=claim,
            claim_expires_at=now
            + timedelta(seconds=_setting("PROXYHUB_STEP_CLAIM_SECONDS", CLAIM_SECONDS)),
            dispatch_token="",
        )
    )
    if not claimed:
        log.debug("step delivery ignored", extra={"operation": operation_id})
        return
    op = Operation.objects.select_related("proxy", "cluster").get(pk=operation_id)
    if op.started_at is None:
        Operation.objects.filter(pk=op.pk).update(started_at=now, state=OperationState.RUNNING)
        op.started_at = now
    if op.proxy_id is not None and not _take_lease(op, now):
        _wait_for_lease(op, claim)
        return
    started = time.monotonic()
    try:
        outcome = _run(op)
    except ClassifiedError as err:  # an expected failure outside the provider (placement, ...)
        log.info("step failed", extra={"operation": operation_id, "error": str(err)})
        stage = str(op.progress.get("stage", "step"))
        outcome = Outcome(
            StepResult("error", dict(op.progress), stage, error=err), dict(op.progress)
        )
    except Exception as err:  # a bug or an unexpected failure: keep the operation alive
        log.exception("step failed unexpectedly", extra={"operation": operation_id})
        stage = str(op.progress.get("stage", "step"))
        error = classify(str(op.kind), err)
        outcome = Outcome(
            StepResult("error", dict(op.progress), stage, error=error), dict(op.progress)
        )
    _persist(op, claim, outcome, time.monotonic() - started)


# --- leases ------------------------------------------------------------------------------


def _take_lease(op: Operation, now: datetime) -> bool:
    """Hold the proxy for this operation: free, ours, expired, or held by a finished operation
    none of whose deliveries still runs."""
    lease = now + timedelta(seconds=_setting("PROXYHUB_LEASE_SECONDS", 300))
    holder_done = Q(
        lease_operation__state__in=[OperationState.SUCCEEDED, OperationState.FAILED]
    ) & (Q(lease_operation__claim_token="") | Q(lease_operation__claim_expires_at__lt=now))
    free = (
        Q(lease_operation__isnull=True)
        | Q(lease_operation=op.pk)
        | Q(lease_expires_at__lt=now)
        | holder_done
    )
    # Only called for an operation that has a proxy (operation_run_step checks proxy_id).
    ids = Proxy.objects.filter(free, pk=cast(int, op.proxy_id)).values("pk")
    return bool(
        Proxy.objects.filter(pk__in=ids).update(lease_operation=op.pk, lease_expires_at=lease)
    )


def _release_lease(op: Operation) -> None:
    if op.proxy_id is None:
        return  # the proxy is gone, and its lease with it (the filter below would match nothing)
    Proxy.objects.filter(pk=op.proxy_id, lease_operation=op.pk).update(
        lease_operation=None, lease_expires_at=None
    )


def _wait_for_lease(op: Operation, claim: str) -> None:
    delay = 2.0
    with transaction.atomic():
        token = _reschedule(op, claim, delay)
    if token:
        _send_after_commit(op, token, delay)


# --- running one step ----------------------------------------------------------------------


def _run(op: Operation) -> Outcome:
    runner = _RUNNERS[OperationKind(op.kind)]
    provider = provider_for(op.cluster) if op.cluster else None
    if provider is None:
        raise NotFoundError("the operation's cluster no longer exists", op=str(op.kind))
    return runner(op, provider, dict(op.progress))


def _run_create(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    proxy = _proxy(op)
    if progress.get("stage") == "address":
        return _address(op, provider, progress)
    record = progress.get("create") or provider.new_create_progress()
    if "zone" not in progress:
        if proxy.zone:
            # The operator chose the node; still, no new VM goes to a node known not ready.
            assert_node_ready(proxy.cluster, proxy.zone)
        progress["zone"] = proxy.zone or choose_node(proxy.cluster, provider.config)
    req = CreateRequest(
        uid=str(proxy.uid),
        vm_name=proxy.vm_name,
        machine_type=proxy.machine_type,
        image=proxy.image,
        zone=progress["zone"],
        cloud_init=proxy.cloud_init,
    )
    result = provider.create_step(req, record)
    progress["create"] = result.progress
    observed: dict[str, Any] = {"phase": Phase.CREATING}
    if result.progress.get("vmid"):
        observed.update(vmid=result.progress["vmid"], node=result.progress.get("node") or "")
    if result.status == "done":
        observed.update(
            phase=Phase.PROVISIONING,
            provider_id=result.provider_id,
            spec_hash=proxy.compute_spec_hash(),
            last_error="",
            last_error_class="",
        )
        progress.update(stage="address", address_since=time.time())
        # Not finished: the address stage follows, so "done" becomes "continue" here.
        result = StepResult(
            "continue",
            result.progress,
            result.step,
            message=result.message,
            provider_id=result.provider_id,
        )
    return Outcome(result, progress, observed)


def _address(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    """Boot to address: poll ``get`` until the guest agent reports an IPv4 (entry 7)."""
    proxy = _proxy(op)
    try:
        # The node is known (the create just started the VM there): no listing per poll.
        instance = provider.get(proxy.provider_id, node=proxy.node or None)
    except NotFoundError:
        # The VM vanished after it started: create it again from the lookup.
        progress.pop("create", None)
        progress["stage"] = "provider"
        result = StepResult("continue", progress, "address", message="the VM vanished")
        return Outcome(
            result, progress, {"phase": Phase.PENDING, "provider_id": ""}, phase_name="address"
        )
    observed = _observed(instance)
    if instance.state == "Running":
        result = StepResult("done", progress, "address", message=f"address {instance.ip}")
        return Outcome(result, progress, observed, finished=True, phase_name="address")
    waited = time.time() - float(progress.get("address_since") or time.time())
    if waited > _setting("PROXYHUB_ADDRESS_BUDGET_SECONDS", ADDRESS_BUDGET):
        result = StepResult(
            "done",
            progress,
            "address",
            message=f"no address after {int(waited)} s; reconcile keeps watching it",
        )
        return Outcome(result, progress, observed, finished=True, phase_name="address")
    poll = _setting("PROXYHUB_ADDRESS_POLL_SECONDS", ADDRESS_POLL)
    result = StepResult(
        "wait",
        progress,
        "address",
        delay=poll,
        message=f"waiting for the guest agent ({instance.state})",
    )
    return Outcome(result, progress, observed, phase_name="address")


def _delete_request(op: Operation, progress: dict[str, Any]) -> DeleteRequest:
    target = progress.get("target")
    if target:
        return DeleteRequest(
            vm_name=target["vm_name"], uid=target.get("uid", ""), vmid=target.get("vmid")
        )
    proxy = _proxy(op)
    return DeleteRequest(vm_name=proxy.vm_name, uid=str(proxy.uid), vmid=proxy.vmid)


def _run_delete(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    if "target" not in progress:
        progress["target"] = _target_of(op)
    req = _delete_request(op, progress)
    result = provider.delete_step(req, progress.get("delete") or provider.new_delete_progress())
    progress["delete"] = result.progress
    observed: dict[str, Any] = {"phase": Phase.DELETING} if op.proxy_id else {}
    done = result.status == "done"
    return Outcome(
        result, progress, observed, finished=done, delete_proxy=done and bool(op.proxy_id)
    )


def _run_replace(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    """Delete the VM the proxy had when the replace was asked for, then create a new one."""
    if progress.get("phase", "delete") == "delete":
        if "target" not in progress:
            progress["target"] = _target_of(op)
        if progress["target"].get("vmid") is None and not _proxy(op).provider_id:
            progress["phase"] = "create"
        else:
            req = _delete_request(op, progress)
            result = provider.delete_step(
                req, progress.get("delete") or provider.new_delete_progress()
            )
            progress["delete"] = result.progress
            if result.status == "done":
                progress["phase"] = "create"
                result = StepResult(
                    "continue", result.progress, result.step, message=result.message
                )
                observed = {
                    "phase": Phase.PENDING,
                    "provider_id": "",
                    "vmid": None,
                    "ip": None,
                    "node": "",
                }
                return Outcome(result, progress, observed)
            return Outcome(result, progress, {"phase": Phase.DELETING})
    outcome = _run_create(op, provider, progress)
    return outcome


def _run_power(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    from provisioning.proxmox.power_checks import PowerRequest

    if progress.get("stage") == "address":
        return _address(op, provider, progress)
    proxy = _proxy(op)
    # _RUNNERS sends only the power kinds here, and PowerRequest checks the action again.
    action = cast("Action", str(op.kind))
    req = PowerRequest.from_provider_id(action, proxy.provider_id, str(proxy.uid))
    result = provider.power_step(req, progress.get("power") or provider.new_power_progress())
    progress["power"] = result.progress
    observed: dict[str, Any] = {}
    if op.kind == OperationKind.SHUTDOWN:
        observed["phase"] = Phase.STOPPING
    if result.status != "done":
        return Outcome(result, progress, observed)
    if op.kind == OperationKind.SHUTDOWN:
        return Outcome(result, progress, {"phase": Phase.STOPPED, "ip": None}, finished=True)
    # Started or rebooted: follow the boot to its address, as a create does.
    progress.update(stage="address", address_since=time.time())
    result = StepResult("continue", result.progress, result.step, message=result.message)
    return Outcome(result, progress, {"phase": Phase.PROVISIONING})


_POWER_KINDS = (OperationKind.START, OperationKind.SHUTDOWN, OperationKind.REBOOT)

_RUNNERS: dict[OperationKind, Callable[[Operation, Provider, dict[str, Any]], Outcome]] = {
    OperationKind.CREATE: _run_create,
    OperationKind.DELETE: _run_delete,
    OperationKind.REPLACE: _run_replace,
    OperationKind.START: _run_power,
    OperationKind.SHUTDOWN: _run_power,
    OperationKind.REBOOT: _run_power,
}


def _proxy(op: Operation) -> Proxy:
    if op.proxy is None:
        raise NotFoundError("the operation's proxy no longer exists", op=str(op.kind))
    return op.proxy


def _target_of(op: Operation) -> dict[str, Any]:
    proxy = _proxy(op)
    return {"vm_name": proxy.vm_name, "uid": str(proxy.uid), "vmid": proxy.vmid}


def _observed(instance: Any) -> dict[str, Any]:
    phase = {"Running": Phase.RUNNING, "Provisioning": Phase.PROVISIONING}.get(
        instance.state, Phase.STOPPED
    )
    return {
        "phase": phase,
        "ip": instance.ip,
        "node": instance.node,
        "vmid": instance.vmid,
        "provider_id": instance.provider_id,
        "vm_created_at": instance.created_at,
        "observed_at": timezone.now(),
    }


# --- the journal -------------------------------------------------------------------------


def _persist(op: Operation, claim: str, outcome: Outcome, seconds: float) -> None:
    result = outcome.result
    now = timezone.now()
    token = ""
    delay = 0.0
    with transaction.atomic():
        if op.proxy_id is not None:
            # Lock order: the proxy row first, then its operations, as the intent services
            # do (proxy_request_delete and friends); the other order deadlocks on PostgreSQL.
            list(Proxy.objects.select_for_update().filter(pk=op.proxy_id).values_list("pk"))
        still_ours = Operation.objects.filter(
            pk=op.pk, claim_token=claim, state__in=ACTIVE_STATES
        ).exists()
        _journal(op, outcome, now)
        if not still_ours:
            # Superseded while the step ran: keep the receipt above, apply nothing else.
            Operation.objects.filter(pk=op.pk, claim_token=claim).update(
                claim_token="", claim_expires_at=None
            )
            return
        updates: dict[str, Any] = {
            "progress": outcome.progress,
            "claim_token": "",
            "claim_expires_at": None,
        }
        proxy_updates = dict(outcome.proxy)
        if result.status == "error":
            error = result.error or classify(str(op.kind), RuntimeError("unknown failure"))
            updates.update(last_error=str(error), error_class=_error_class(error))
            if error.kind == "permanent":
                updates.update(state=OperationState.FAILED, finished_at=now, next_step_at=None)
                if op.proxy_id and op.kind in _POWER_KINDS:
                    # A refused power action leaves the VM as it was: report, do not latch.
                    proxy_updates.update(
                        last_error=str(error), last_error_class=ErrorClass.PERMANENT
                    )
                elif op.proxy_id:
                    proxy_updates.update(
                        phase=Phase.FAILED,
                        last_error=str(error),
                        last_error_class=ErrorClass.PERMANENT,
                    )
            else:
                attempts = op.attempts + 1
                delay = _backoff(attempts)
                updates.update(attempts=attempts, state=OperationState.RUNNING)
                if op.proxy_id:
                    proxy_updates.update(
                        last_error=str(error), last_error_class=_error_class(error)
                    )
        elif outcome.finished:
            updates.update(
                state=OperationState.SUCCEEDED,
                finished_at=now,
                next_step_at=None,
                attempts=0,
                last_error="",
                error_class="",
            )
        else:
            delay = result.delay if result.status == "wait" else 0.0
            updates.update(
                attempts=0,
                state=OperationState.WAITING if result.status == "wait" else OperationState.RUNNING,
            )
        if updates.get("state") not in (OperationState.SUCCEEDED, OperationState.FAILED):
            token = secrets.token_hex(8)
            updates.update(
                next_step_at=now + timedelta(seconds=delay),
                dispatch_token=token,
                dispatched_at=now,
            )
        Operation.objects.filter(pk=op.pk).update(**updates)
        if op.proxy_id and proxy_updates:
            proxy_updates["observed_at"] = now
            Proxy.objects.filter(pk=op.proxy_id).update(**proxy_updates)
        if updates.get("state") in (OperationState.SUCCEEDED, OperationState.FAILED):
            _release_lease(op)
            if outcome.delete_proxy:
                # delete_proxy is set only for an operation with a proxy (_run_delete).
                Proxy.objects.filter(
                    pk=cast(int, op.proxy_id), desired_state=DesiredState.DELETED
                ).delete()
    _record_metric(op, result, seconds)
    if token:
        _send_after_commit(op, token, delay)


def _journal(op: Operation, outcome: Outcome, now: datetime) -> None:
    """One row per stage: a stage polled across deliveries updates its row until it ends."""
    result = outcome.result
    name = outcome.phase_name or result.step.removesuffix("_wait")
    last = op.steps.order_by("-seq").first()
    open_row = last if last is not None and last.finished_at is None else None
    if open_row is not None and open_row.name != name:
        open_row.finished_at = now
        if open_row.state in (StepState.RUNNING, StepState.WAITING, StepState.RETRYING):
            open_row.state = StepState.SUCCEEDED
        open_row.save(update_fields=["finished_at", "state"])
        _record_phase(op, open_row)
        open_row = None
    if open_row is None:
        open_row = OperationStep(
            operation=op, seq=(last.seq + 1) if last else 1, name=name, started_at=now
        )
    if result.upid:
        open_row.upid = result.upid
    if result.message:
        open_row.message = result.message
    if result.status == "error":
        error = result.error
        open_row.message = str(error) if error else "failed"
        if error is not None and error.kind == "permanent":
            open_row.state, open_row.finished_at = StepState.FAILED, now
        else:
            open_row.state = StepState.RETRYING
    elif result.status == "wait":
        open_row.state = StepState.WAITING
    elif result.status in ("done",) or outcome.finished:
        open_row.state, open_row.finished_at = StepState.SUCCEEDED, now
    else:
        open_row.state = StepState.RUNNING
    open_row.save()
    if open_row.finished_at is not None:
        _record_phase(op, open_row)


def _reschedule(op: Operation, claim: str, delay: float) -> str:
    token = secrets.token_hex(8)
    now = timezone.now()
    updated = Operation.objects.filter(pk=op.pk, claim_token=claim).update(
        claim_token="",
        claim_expires_at=None,
        dispatch_token=token,
        dispatched_at=now,
        next_step_at=now + timedelta(seconds=delay),
    )
    return token if updated else ""


def _send_after_commit(op: Operation, token: str, delay: float) -> None:
    from provisioning.tasks import send_step

    op_id = str(op.pk)
    transaction.on_commit(lambda: send_step(op_id, token, countdown=delay))


def _backoff(attempts: int) -> float:
    """Capped exponential backoff with jitter: 2, 4, 8 ... up to the configured maximum."""
    cap = _setting("PROXYHUB_STEP_MAX_BACKOFF_SECONDS", 300)
    base = min(cap, 2.0 ** min(attempts, 16))
    return base * random.uniform(0.8, 1.0)  # jitter, not a secret


def _error_class(error: ClassifiedError) -> str:
    return {
        "permanent": ErrorClass.PERMANENT,
        "not_found": ErrorClass.NOT_FOUND,
    }.get(error.kind, ErrorClass.TRANSIENT)


def _metrics_hook(name: str) -> Callable[..., None] | None:
    """A recorder from ``proxyhub.metrics`` when the project provides it (it is optional here,
    so the app's services stay usable from plain scripts and tests)."""
    try:
        from proxyhub import metrics
    except ImportError:
        return None
    return getattr(metrics, name, None)


def _record_metric(op: Operation, result: StepResult, seconds: float) -> None:
    hook = _metrics_hook("record_step_delivery")
    if hook is not None:
        hook(str(op.kind), result.step, result.status, seconds)


def _record_phase(op: Operation, row: OperationStep) -> None:
    hook = _metrics_hook("record_step")
    if hook is not None and row.duration is not None:
        hook(str(op.kind), row.name, row.duration)
