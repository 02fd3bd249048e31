"""What one step of each kind of operation does: the bridge from the journal to the provider.

Each runner takes the operation, its provider and the progress record to resume from, runs one
stage of the provider's step machine (seed 000 entries 10 and 11, seed 001 for power) and says,
as an ``Outcome``, what the journal and the proxy's observed fields should become. Runners never
write: the driver persists the outcome under the operation's claim.

Failures that no retry can heal are permanent here, so the operation ends and says why instead
of retrying for ever: the operation's cluster or proxy is gone, or the proxy's cloud-init cannot
be unsealed with the current key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationKind, Phase
from provisioning.proxmox import readiness
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.errors import ClassifiedError, NotFoundError, PermanentError
from provisioning.proxmox.identity import Identity
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.release import ReleaseRequest
from provisioning.proxmox.steps import TIMING, StepResult
from provisioning.proxmox.template_build import TemplateBuildRequest
from provisioning.proxmox.waits import BOOT, MARGIN, MIN_POLL, Timing, next_wait, seen_at
from provisioning.sealing import SealError

from . import maintenance, slots
from .drift import built_spec, proxy_spec
from .durations import durations_elsewhere, durations_expected
from .installation import identity_conflict
from .placement import assert_node_ready, choose_node
from .providers import provider_for
from .seeds import SEED_RELEASE_STAGE, keep_seed_iso

if TYPE_CHECKING:
    from provisioning.proxmox.power_checks import Action

# After the provider reports the VM running, how long to keep polling for its address, and
# how often (settings PROXYHUB_ADDRESS_BUDGET_SECONDS / PROXYHUB_ADDRESS_POLL_SECONDS).
ADDRESS_BUDGET = 900.0
ADDRESS_POLL = 3.0

log = logging.getLogger("proxyhub.operations")

POWER_KINDS = (OperationKind.START, OperationKind.SHUTDOWN, OperationKind.REBOOT)
# Kinds that act on the VM in place: one that cannot go on leaves the proxy as it was (never
# latched Failed), since the VM is still there and still serves.
IN_PLACE_KINDS = (*POWER_KINDS, OperationKind.REPAIR)


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
    # A stage the step ended before the one it journals: journalled as finished in the same
    # step (a create's running check, when the step goes on to wait for the boot).
    passed: StepResult | None = None
    # A template build that ended: what the catalogue records (services.template_builds).
    template: dict[str, Any] | None = None
    # The next step is cleanup nobody waits for (dispatch.PRIORITY_CAN_WAIT): not chained, and
    # sent behind work under way (services.driver).
    next_can_wait: bool = False


def run_step(op: Operation, progress: dict[str, Any], now: datetime) -> Outcome:
    """One step of ``op`` from ``progress`` (a copy the runner may change)."""
    if op.cluster is None:
        raise PermanentError(
            "the operation's cluster no longer exists",
            remediation="nothing is left to do on it; start a new operation if needed",
            op=str(op.kind),
        )
    runner = _RUNNERS[OperationKind(op.kind)]
    return runner(op, provider_for(op.cluster), progress, now)


def _run_create(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
    proxy = _proxy(op)
    if progress.get("stage") == "address":
        return _address(op, provider, progress, now)
    if progress.get("stage") == SEED_RELEASE_STAGE:
        return _release_seed(op, provider, progress)
    record = progress.get("create") or provider.new_create_progress()
    if "create" not in progress:
        conflict = identity_conflict()
        if conflict:
            raise PermanentError(conflict, op=str(op.kind))
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
        cloud_init=_cloud_init(proxy, op),
        identity=recorded_identity(proxy),
    )
    result = provider.create_step(req, record, may_follow=may_follow(op, progress))
    progress["create"] = result.progress
    observed: dict[str, Any] = {"phase": Phase.CREATING}
    if result.vm_gone:
        # The VM the proxy recorded is gone (destroyed outside proxyhub, found so mid-create or
        # by the lookup): the proxy no longer records its identity, as reconcile forgets a
        # missing VM's (reconcile._recreate). A lookup says so in its own step, so this commits
        # before any clone at the VMID.
        observed.update(NO_IDENTITY)
    if result.progress.get("vmid"):
        observed.update(vmid=result.progress["vmid"], node=result.progress.get("node") or "")
    if result.progress.get("smbios_uuid") or result.progress.get("vmgenid"):
        # Seed 001: recorded as soon as the create made or adopted the VM, so a later create
        # step, observation, power action or delete compares against it.
        found = (
            str(result.progress.get("smbios_uuid") or ""),
            str(result.progress.get("vmgenid") or ""),
        )
        observed.update(smbios_uuid=found[0], vmgenid=found[1])
        if found != (proxy.smbios_uuid, proxy.vmgenid):
            # Read from the VM's config by this step (later steps carry it in the record, and
            # must not date it later). The start comes after, so the first reconcile round
            # reads the identity once more (reconcile.py, issue 14).
            observed["identity_checked_at"] = now
    if result.status == "done":
        observed.update(
            phase=Phase.PROVISIONING,
            provider_id=result.provider_id,
            spec_hash=proxy.compute_spec_hash(),
            last_error="",
            last_error_class="",
            # Issue 14: what the VM was built with is what drift is measured against; the
            # configure step just wrote it, so it counts as compared now.
            vm_spec=built_spec(
                provider.config, proxy.machine_type, str(result.progress.get("mac") or "")
            ),
            drift=[],
            drift_checked_at=now,
            drift_listing="",
        )
        _enter_address(progress, now)
        # Seed 003's readiness: whether this VM counts as Running only once cloud-init is done,
        # as the catalogue said when it was created (a later edit affects later VMs only).
        progress["cloud_init"] = _waits_for_cloud_init(provider, proxy.image)
        booting = _first_address_wait(op, proxy, progress, now)
        if booting is not None:
            # The boot's first look is planned here, in the step that ended the create: a step
            # of its own for that plan read nothing and cost a delivery per create (issue 12).
            # The create's timing (the start's) goes along for the estimates.
            booting.result.details.update(result.details)
            return Outcome(booting.result, progress, observed, phase_name="address", passed=result)
        # Not finished: the address stage follows, so "done" becomes "continue" here. The
        # details go along: the start's wait that ended the create timed the start (TIMING).
        result = StepResult(
            "continue",
            result.progress,
            result.step,
            message=result.message,
            provider_id=result.provider_id,
            details=result.details,
            passed=result.passed,
        )
    return Outcome(result, progress, observed)


def may_follow(op: Operation, progress: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """Whether a create's step, which started from ``progress``, may go on to the next stage of
    its record (``StepMachine.follows``): only when that stage needs no task slot beyond those
    the step holds (``slots.need_of``: the same node's, and no storage slot it lacks), and the
    operation's read found no maintenance switch in its cluster (``maintenance``: a stage that
    writes is held by a switch on its node, and the driver asked only about this step's stage).
    None: every stage is a step of its own."""
    if not maintenance.no_switch_read(op):
        return None
    held = set(slots.need_of(op, progress).keys)
    if not held:
        return None

    def may(record: dict[str, Any]) -> bool:
        return set(slots.need_of(op, dict(progress, create=record)).keys) <= held

    return may


def _run_template_build(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
    """One stage of a template build (issue 14): the machine's record is ``progress.record``;
    the build's inputs, ``progress.build``, never change."""
    req = TemplateBuildRequest.from_record(progress["build"])
    record = progress.get("record") or provider.new_template_build_progress()
    result = provider.template_build_step(req, record)
    progress["record"] = result.progress
    if result.status == "done":
        return Outcome(result, progress, finished=True, template=dict(result.details))
    return Outcome(result, progress)


def _cloud_init(proxy: Proxy, op: Operation) -> bytes:
    try:
        return proxy.cloud_init
    except SealError as err:
        raise PermanentError(
            f"the cloud-init of {proxy.name} cannot be unsealed: {err}",
            remediation="put the key it was sealed with back into the settings, or set the "
            "proxy's cloud-init again, then retry",
            op=str(op.kind),
        ) from None


def _enter_address(progress: dict[str, Any], now: datetime) -> None:
    """Move the record to the wait for the address; the boot's timer starts now."""
    progress.update(stage="address", address_since=now.timestamp())
    progress.pop("address_look_at", None)
    progress.pop("address_seen", None)


def _address(op: Operation, provider: Provider, progress: dict[str, Any], now: datetime) -> Outcome:
    """Boot to address: poll ``get`` until the guest agent reports an IPv4 (entry 7). When the
    image's boot time is known, the first look waits for it without reading anything."""
    proxy = _proxy(op)
    if progress.get("address_look_at") is None:
        booting = _first_address_wait(op, proxy, progress, now)
        if booting is not None:
            return booting
    reading = time.monotonic()
    if progress.get("cloud_init_ip"):
        # The address is known; the look is cloud-init's result file alone (one read).
        ready = _cloud_init_look(op, provider, proxy, progress, now, reading)
        if ready is not None:
            return ready
        if progress.get("cloud_init_ip"):
            observed: dict[str, Any] = {"phase": Phase.PROVISIONING, "observed_at": now}
            waited, landed = _waited(progress, now, reading)
            return _address_wait(op, proxy, progress, observed, waited, landed, "Provisioning")
    try:
        # A VM this create started is watched with one agent read a look (issue 12); what that
        # read cannot settle, and every other VM, gets the full read. The node is known (the
        # create just started the VM there): no listing per poll.
        instance = None
        if op.kind in (OperationKind.CREATE, OperationKind.REPLACE):
            instance = provider.observe_boot(
                proxy.provider_id, progress.get("create") or {}, uid=str(proxy.uid)
            )
        if instance is None:
            instance = provider.get(
                proxy.provider_id, node=proxy.node or None, identity=recorded_identity(proxy)
            )
    except NotFoundError:
        # The VM vanished after it started: create it again from the lookup.
        progress.pop("create", None)
        progress["stage"] = "provider"
        result = StepResult("continue", progress, "address", message="the VM vanished")
        return Outcome(
            result,
            progress,
            {"phase": Phase.PENDING, "provider_id": "", **NO_IDENTITY},
            phase_name="address",
        )
    observed = observed_fields(instance, now)
    if instance.state == "Running" and progress.get("cloud_init"):
        # Seed 003: the address counts once cloud-init is done; this look reads that too.
        progress.update(cloud_init_ip=instance.ip, cloud_init_node=instance.node)
        ready = _cloud_init_look(op, provider, proxy, progress, now, reading)
        if ready is not None:
            return ready
        observed.update(phase=Phase.PROVISIONING, ip=None)
        waited, landed = _waited(progress, now, reading)
        return _address_wait(op, proxy, progress, observed, waited, landed, "Provisioning")
    waited, landed = _waited(progress, now, reading)
    if instance.state == "Running":
        return _ready(op, provider, proxy, progress, observed, waited, landed, instance.ip)
    return _address_wait(op, proxy, progress, observed, waited, landed, instance.state)


def _waited(progress: dict[str, Any], now: datetime, reading: float) -> tuple[float, float]:
    """Seconds since the start when the look was sent (``now``) and when its answer came back.
    The wait is measured on the database's clock, like every other age in the loop."""
    waited = now.timestamp() - float(progress.get("address_since") or now.timestamp())
    return waited, waited + (time.monotonic() - reading)


def _ready(
    op: Operation,
    provider: Provider,
    proxy: Proxy,
    progress: dict[str, Any],
    observed: dict[str, Any],
    waited: float,
    landed: float,
    ip: str | None,
) -> Outcome:
    """The proxy is Running at ``ip``: the boot's timing is learnt and the seed released."""
    details = {TIMING: _boot_timing(proxy, progress, waited, landed).as_dict()}
    release = op.kind in (OperationKind.CREATE, OperationKind.REPLACE) and not keep_seed_iso()
    if release:
        # The boot that needed the seed is over: release it (issue 11), as cleanup that waits
        # its turn. The address stage is done either way ("done" closes its journal row: the
        # proxy runs from here).
        progress.update(stage=SEED_RELEASE_STAGE, release=provider.new_release_progress())
    result = StepResult("done", progress, "address", message=f"address {ip}", details=details)
    return Outcome(
        result,
        progress,
        observed,
        finished=not release,
        phase_name="address",
        next_can_wait=release,
    )


def _address_wait(
    op: Operation,
    proxy: Proxy,
    progress: dict[str, Any],
    observed: dict[str, Any],
    waited: float,
    landed: float,
    state: str,
) -> Outcome:
    """Not ready at this look: the next one is planned, or, past the budget, the wait ends.

    Past the budget without an address the proxy stays Provisioning and reconcile keeps
    watching it. Past it with the address but cloud-init never done (seed 003), reconcile would
    take the address for readiness, so the create fails and says what to check."""
    if waited > address_budget():
        if progress.get("cloud_init_ip"):
            raise PermanentError(
                f"cloud-init did not report done within {int(waited)} s of the start "
                f"(the guest has its address {progress['cloud_init_ip']}, but "
                f"{readiness.RESULT_FILE} is missing)",
                remediation="check in the guest that cloud-init is installed and enabled in "
                "the template and what /var/log/cloud-init.log says; or clear "
                "waitForCloudInit for this template; then retry the proxy",
                op=str(op.kind),
            )
        result = StepResult(
            "done",
            progress,
            "address",
            message=f"no address after {int(waited)} s; reconcile keeps watching it",
        )
        return Outcome(result, progress, observed, finished=True, phase_name="address")
    # Still booting when the look went out: a fact, whatever the plan was (``waits.seen_at``).
    progress["address_seen"] = seen_at(
        planned=progress.get("address_look_at"), sent=waited, landed=landed, running=True
    )
    message = f"waiting for the guest agent ({state})"
    if progress.get("cloud_init_ip"):
        message = f"waiting for cloud-init to report done (address {progress['cloud_init_ip']})"
    result = StepResult(
        "wait",
        progress,
        "address",
        delay=_plan_address_look(op, proxy, progress, waited),
        message=message,
    )
    return Outcome(result, progress, observed, phase_name="address")


def _waits_for_cloud_init(provider: Provider, image: str) -> bool:
    """Whether the catalogue's template for ``image`` asks for cloud-init's done (seed 003)."""
    ref = provider.config.templates.get(image)
    return bool(ref is not None and ref.wait_for_cloud_init)


def _cloud_init_look(
    op: Operation,
    provider: Provider,
    proxy: Proxy,
    progress: dict[str, Any],
    now: datetime,
    reading: float,
) -> Outcome | None:
    """One read of cloud-init's result file for a VM whose address is known (``readiness``).

    Done: Running at that address. Failed: the create ends (no wait heals it) with the errors,
    summarised without the user-data. Not yet: None, the address kept (the caller plans the
    next look). A read that fails otherwise (the VM stopped, vanished, the privilege is
    missing) drops the known address and returns None, so the caller's full look decides, as
    for any VM still booting."""
    ip = str(progress["cloud_init_ip"])
    node = str(progress.get("cloud_init_node") or proxy.node)
    try:
        status = provider.cloud_init_status(proxy.provider_id, node=node)
    except ClassifiedError as err:
        if err.kind == "permanent":
            raise  # the privilege missing (403): no look heals it; the error names it
        progress.pop("cloud_init_ip", None)
        return None
    if status.state == "done":
        observed = {"phase": Phase.RUNNING, "ip": ip, "node": node, "observed_at": now}
        return _ready(op, provider, proxy, progress, observed, *_waited(progress, now, reading), ip)
    if status.state == "failed":
        raise PermanentError(
            f"cloud-init reported {len(status.errors)} error(s) in the guest: "
            + readiness.summarise(status.errors, user_data=_user_data_or_nothing(proxy)),
            remediation="read /var/log/cloud-init.log and /var/log/cloud-init-output.log in "
            "the guest, correct the proxy's cloud-init (or the template), then retry the proxy",
            op=str(op.kind),
        )
    return None


def _user_data_or_nothing(proxy: Proxy) -> bytes:
    """The proxy's cloud-init, to hide it in an error; nothing when it cannot be unsealed (then
    no error text can be checked against it, and the summary's bounds still apply)."""
    try:
        return proxy.cloud_init
    except SealError:
        return b""


def _first_address_wait(
    op: Operation, proxy: Proxy, progress: dict[str, Any], now: datetime
) -> Outcome | None:
    """A wait for the image's expected boot, or None when there is no estimate or it is due."""
    assert op.cluster is not None
    expected = _boot_expected(op, proxy)
    waited = now.timestamp() - float(progress.get("address_since") or now.timestamp())
    if expected is None or expected * (1 + MARGIN) - waited < MIN_POLL:
        return None
    result = StepResult(
        "wait",
        progress,
        "address",
        delay=_plan_address_look(op, proxy, progress, waited, expected=expected),
        message="waiting for the guest to boot",
    )
    return Outcome(result, progress, {}, phase_name="address")


def address_budget() -> float:
    """How long after its start a VM's address is waited for (then reconcile watches it)."""
    return _setting("PROXYHUB_ADDRESS_BUDGET_SECONDS", ADDRESS_BUDGET)


def _plan_address_look(
    op: Operation,
    proxy: Proxy,
    progress: dict[str, Any],
    waited: float,
    *,
    expected: float | None = None,
) -> float:
    """The delay to the next look for the address: when the image's boot is expected to be
    over, then a short interval doubling up to ``PROXYHUB_ADDRESS_POLL_SECONDS``
    (``proxmox.waits``). The plan is kept in the record for the boot's timing. ``expected``:
    the boot's estimate when the caller just read it (read here otherwise)."""
    assert op.cluster is not None
    delay = next_wait(
        expected=expected if expected is not None else _boot_expected(op, proxy),
        elapsed=waited,
        cap=_setting("PROXYHUB_ADDRESS_POLL_SECONDS", ADDRESS_POLL),
        limit=address_budget(),
    )
    progress["address_look_at"] = waited + delay
    return delay


def _boot_expected(op: Operation, proxy: Proxy) -> float | None:
    """The image's expected boot to address; for an image that never booted on the cluster, the
    shortest of the other images' (``waits.Durations.elsewhere``), as a task on a new node
    plans from the other nodes. Without it the first look came right after the start and the
    next ones doubled from 50 ms, each finding a real guest still booting (issue 12); what this
    image's boot then takes is learned as its own."""
    assert op.cluster is not None
    expected = durations_expected(cluster_id=op.cluster.pk, kind=BOOT, scope=proxy.image)
    if expected is None:
        expected = durations_elsewhere(cluster_id=op.cluster.pk, kind=BOOT, scope=proxy.image)
    return expected


def _boot_timing(proxy: Proxy, progress: dict[str, Any], waited: float, landed: float) -> Timing:
    """What this boot taught about the image's start to address: the look that found the
    address stands for its plan when it landed about on time (``waits.seen_at``)."""
    return Timing(
        kind=BOOT,
        scope=proxy.image,
        seen_running=float(progress.get("address_seen") or 0.0),
        seen_done=seen_at(
            planned=progress.get("address_look_at"), sent=waited, landed=landed, running=False
        ),
    )


def _release_seed(op: Operation, provider: Provider, progress: dict[str, Any]) -> Outcome:
    """Eject the seed from the booted VM and remove it from storage (``proxmox.release``).

    The proxy runs and has its address: this step never changes its phase. A refusal that no
    retry heals (a permission the token lacks, say) ends the operation as succeeded with the
    reason in the journal, so a running proxy is never latched Failed over its seed; the seed
    then stays until the proxy is deleted, which removes it."""
    proxy = _proxy(op)
    seed_node = str((progress.get("create") or {}).get("node") or proxy.node)
    req = ReleaseRequest(
        vm_name=proxy.vm_name,
        uid=str(proxy.uid),
        vmid=int(proxy.vmid or 0),
        node=proxy.node,
        seed_node=seed_node,
    )
    result = provider.release_seed_step(
        req, progress.get("release") or provider.new_release_progress()
    )
    progress["release"] = result.progress
    if result.status == "error" and result.error is not None and result.error.kind != "transient":
        log.warning(
            "seed release refused",
            extra={"operation": str(op.pk), "proxy": proxy.name, "error": str(result.error)},
        )
        result = StepResult(
            "done",
            result.progress,
            result.step,
            message=f"seed ISO kept: {result.error}",
        )
    return Outcome(
        result, progress, {}, finished=result.status == "done", phase_name=SEED_RELEASE_STAGE
    )


def _delete_request(op: Operation, progress: dict[str, Any]) -> DeleteRequest:
    target = progress.get("target")
    if target:
        return DeleteRequest(
            vm_name=target["vm_name"],
            uid=target.get("uid", ""),
            vmid=target.get("vmid"),
            earlier_nodes=tuple(target.get("earlier_nodes") or ()),
            identity=Identity(
                str(target.get("smbios_uuid") or ""), str(target.get("vmgenid") or "")
            ),
            expected_digest=str(progress.get("expected_digest") or ""),
        )
    proxy = _proxy(op)
    return DeleteRequest(
        vm_name=proxy.vm_name,
        uid=str(proxy.uid),
        vmid=proxy.vmid,
        identity=recorded_identity(proxy),
        expected_digest=str(progress.get("expected_digest") or ""),
    )


def _run_delete(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
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


def _run_replace(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
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
                    **NO_IDENTITY,
                }
                return Outcome(result, progress, observed)
            return Outcome(result, progress, {"phase": Phase.DELETING})
    return _run_create(op, provider, progress, now)


def _run_power(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
    from provisioning.proxmox.power_checks import PowerRequest

    if progress.get("stage") == "address":
        return _address(op, provider, progress, now)
    proxy = _proxy(op)
    # _RUNNERS sends only the power kinds here, and PowerRequest checks the action again.
    action = cast("Action", str(op.kind))
    req = replace(
        PowerRequest.from_provider_id(
            action, proxy.provider_id, str(proxy.uid), recorded_identity(proxy)
        ),
        # The digest the confirmation page showed (seed 001, issue 14); judged before the
        # intent and again right before dispatch.
        expected_digest=str(progress.get("expected_digest") or ""),
    )
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
    _enter_address(progress, now)
    result = StepResult("continue", result.progress, result.step, message=result.message)
    return Outcome(result, progress, {"phase": Phase.PROVISIONING})


def _run_repair(
    op: Operation, provider: Provider, progress: dict[str, Any], now: datetime
) -> Outcome:
    """Set the VM's drifted cores, memory and net0 back to its spec (``proxmox/repair.py``);
    after a reboot, or on a running VM, follow it to its address as a start does."""
    from provisioning.proxmox.repair import RepairRequest

    if progress.get("stage") == "address":
        return _address(op, provider, progress, now)
    proxy = _proxy(op)
    spec = proxy_spec(proxy, provider.config)
    if spec is None:
        raise PermanentError(
            f"the machine type {proxy.machine_type!r} of {proxy.name} is not in the catalogue "
            "and no spec was recorded for its VM, so there is nothing to repair it to",
            remediation="put the machine type back into the catalogue, or replace the proxy",
            op=str(op.kind),
        )
    req = RepairRequest.from_provider_id(
        proxy.provider_id, spec, str(proxy.uid), recorded_identity(proxy)
    )
    result = provider.repair_step(req, progress.get("repair") or provider.new_repair_progress())
    progress["repair"] = result.progress
    if result.status != "done":
        return Outcome(result, progress, {})
    # The repair wrote the config: the digest seen before it is stale (issue 14), blanked until
    # the next read records the new one.
    observed: dict[str, Any] = {
        "drift": [],
        "drift_checked_at": now,
        "drift_listing": "",
        "config_digest": "",
    }
    if not result.details.get("rebooted"):
        return Outcome(result, progress, observed, finished=True)
    # Rebooted: the guest comes back and reports its address again.
    _enter_address(progress, now)
    result = StepResult("continue", result.progress, result.step, message=result.message)
    return Outcome(result, progress, {**observed, "phase": Phase.PROVISIONING})


Runner = Callable[[Operation, Provider, dict[str, Any], datetime], Outcome]

_RUNNERS: dict[OperationKind, Runner] = {
    OperationKind.CREATE: _run_create,
    OperationKind.DELETE: _run_delete,
    OperationKind.REPLACE: _run_replace,
    OperationKind.START: _run_power,
    OperationKind.SHUTDOWN: _run_power,
    OperationKind.REBOOT: _run_power,
    OperationKind.REPAIR: _run_repair,
    OperationKind.TEMPLATE_BUILD: _run_template_build,
}


def _proxy(op: Operation) -> Proxy:
    if op.proxy is None:
        raise PermanentError(
            "the operation's proxy no longer exists",
            remediation="nothing is left to do for it",
            op=str(op.kind),
        )
    return op.proxy


def _target_of(op: Operation) -> dict[str, Any]:
    proxy = _proxy(op)
    return {
        "vm_name": proxy.vm_name,
        "uid": str(proxy.uid),
        "vmid": proxy.vmid,
        "earlier_nodes": _nodes_created_on(proxy),
        # The VM the delete was asked for is the one with this identity (seed 001).
        "smbios_uuid": proxy.smbios_uuid,
        "vmgenid": proxy.vmgenid,
    }


def _nodes_created_on(proxy: Proxy) -> list[str]:
    """Every node the journal shows a VM of this proxy created on: each got a seed ISO, and
    one whose VM was destroyed outside proxyhub (then created again elsewhere) still has it."""
    nodes: dict[str, None] = {}
    for progress in Operation.objects.filter(
        proxy=proxy, kind__in=(OperationKind.CREATE, OperationKind.REPLACE)
    ).values_list("progress", flat=True):
        node = ((progress or {}).get("create") or {}).get("node")
        if node:
            nodes[str(node)] = None
    return list(nodes)


# What a proxy whose VM is gone records of its identity: nothing, until a create makes one.
# With the identity goes the config digest last seen of that VM (issue 14): a digest of a VM
# that is gone or replaced is never offered on a confirmation page.
NO_IDENTITY: dict[str, Any] = {
    "smbios_uuid": "",
    "vmgenid": "",
    "identity_checked_at": None,
    "config_digest": "",
}


def recorded_identity(proxy: Proxy) -> Identity:
    """The VM identity recorded on the proxy (seed 001); empty for a proxy from before."""
    return Identity(proxy.smbios_uuid, proxy.vmgenid)


def observed_fields(instance: Any, now: datetime) -> dict[str, Any]:
    """The proxy's observed fields from a provider ``Instance`` read at ``now``. The identity
    read is the recorded one (``get`` compared them) or, for a proxy from before identity was
    kept, the first one recorded."""
    phase = {"Running": Phase.RUNNING, "Provisioning": Phase.PROVISIONING}.get(
        instance.state, Phase.STOPPED
    )
    fields = {
        "phase": phase,
        "ip": instance.ip,
        "node": instance.node,
        "vmid": instance.vmid,
        "provider_id": instance.provider_id,
        "vm_created_at": instance.created_at,
        "observed_at": now,
    }
    # The boot watch (``proxmox/boot.py``) reads no config, so its instance carries no identity:
    # keep what is recorded rather than blank it (net0's MAC vouched for the VM there).
    if instance.smbios_uuid or instance.vmgenid:
        fields.update(smbios_uuid=instance.smbios_uuid, vmgenid=instance.vmgenid)
    return fields
