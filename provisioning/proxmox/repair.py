"""Repairing drift: set a VM's cores, memory and net0 back to its spec (issue 14).

Stages (each call runs one; ``steps.StepResult``):

``inspect``      read the listing, the config (with its ``digest``), the status and the pending
                 changes; judge them (refusals below); record the intent: which keys to set,
                 which pending changes to revert, and the digest the decision was made on
``write``        one ``PUT .../config`` with that ``digest``: a config changed by anyone since
                 the read is refused by Proxmox (``checksum mismatch``, pve-reference §3.4), never
                 overwritten. A retry whose earlier PUT did land meets the same refusal (the
                 digest moved with our own write) and reads back: the spec in place means ours
``check``        read the pending changes: keys of ours still pending (a running VM, a key
                 Proxmox does not hot-plug, §7.13 step 3) need a restart through Proxmox
``reboot``       submit ``status/reboot`` once (``steps.submit_once``: a lost reply is found in
                 the node's tasks, never sent twice); only when something is left pending
``reboot_wait``  poll its UPID (the receipt)
``verify``       the current values (``/pending``'s ``value``) hold the spec and nothing of ours
                 is pending; after a reboot, the VM runs again

Refused, as seed 001 refuses power actions: a VM that is locked or hibernated, not ours (name,
mark, UID, identity), a template, paused, HA-managed, with a hook script, or with pending
changes on keys the repair does not own (a reboot would apply them unreviewed). A pending change
on a key it does own is replaced; when the VM's current value already is the spec, that change
is only reverted, which needs no reboot.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .deadline import Deadline
from .drift import Spec, config_drift, repair_values
from .errors import ApiError, NotFoundError, PermanentError, TaskFailed, TransientError
from .identity import Identity
from .ids import parse_provider_id
from .power import POWERDOWN_MARGIN, SHUTDOWN_TIMEOUT
from .power_checks import Remedies, guard_refusal, ownership_refusal
from .steps import Progress, StepMachine, StepResult, advance

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "repair"
# pve-reference §3.4: the digest check of PUT/POST config.
CHECKSUM_MISMATCH = "checksum mismatch"
# Which config key each drift field lives in.
_KEY_OF = {
    "cores": "cores",
    "memory": "memory",
    "net0.bridge": "net0",
    "net0.tag": "net0",
    "net0.mac": "net0",
}


@dataclass(frozen=True)
class RepairRequest:
    """Which VM to repair (as ``PowerRequest``: VMID, name, UID, identity) and its spec."""

    vmid: int
    vm_name: str
    spec: Spec
    uid: str = ""
    smbios_uuid: str = ""
    vmgenid: str = ""

    @classmethod
    def from_provider_id(
        cls, provider_id: str, spec: Spec, uid: str = "", identity: Identity | None = None
    ) -> RepairRequest:
        parsed = parse_provider_id(provider_id)
        known = identity or Identity()
        return cls(parsed.vmid, parsed.name, spec, uid, known.smbios_uuid, known.vmgenid)

    @property
    def identity(self) -> Identity:
        return Identity(self.smbios_uuid, self.vmgenid)


def new_progress() -> Progress:
    return {"v": 1, "stage": "inspect", "upid": None, "since": None}


class RepairMachine(StepMachine[RepairRequest]):
    op = OP
    first_stage = "inspect"

    def on_refused(self, req: RepairRequest, err: PermanentError) -> None:
        log.info(
            "proxmox repair refused",
            extra={"vmid": req.vmid, "vm_name": req.vm_name, "reason": err.message},
        )

    def on_done(self, req: RepairRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox vm repaired",
            extra={
                "vmid": req.vmid,
                "vm_name": req.vm_name,
                "node": result.details.get("node"),
                "keys": result.details.get("keys"),
                "rebooted": result.details.get("rebooted"),
            },
        )

    # --- inspect: the judgement and the intent ------------------------------------------

    def _inspect(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        listing = self.api.cluster_resources(deadline=deadline)
        entry = next((e for e in listing if int(e.get("vmid", -1)) == req.vmid), None)
        if entry is None:
            raise NotFoundError(f"VM {req.vmid} ({req.vm_name}) does not exist", op=OP)
        node = str(entry.get("node", ""))
        if entry.get("type") != "qemu":
            raise self._refusal(f"VMID {req.vmid} holds a {entry.get('type')} guest", _NOT_OURS)
        if entry.get("status") == "unknown":
            raise TransientError(f"VM {req.vmid} is on node {node}, which does not answer", op=OP)
        config = self.api.vm_config(node, req.vmid, deadline=deadline)
        status = self.api.vm_status(node, req.vmid, deadline=deadline)
        items = self.api.vm_pending(node, req.vmid, deadline=deadline)
        self._judge(req, node, entry, config, status)
        values = repair_values(config, req.spec)
        if not values:
            return StepResult(
                "done",
                advance(progress, "done", node=node),
                "inspect",
                message=f"VM {req.vmid} already matches its spec; nothing to repair",
                details={"node": node, "keys": [], "rebooted": False},
            )
        pending = _pending_keys(items)
        foreign = sorted(pending - set(values))
        if foreign:
            raise self._refusal(
                f"VM {req.vmid} ({req.vm_name}) on {node} has pending configuration changes "
                f"({', '.join(foreign)})",
                "apply or revert them in Proxmox (Hardware or Options: Revert); a repair that "
                "restarts the VM would apply them unreviewed",
            )
        # A pending change whose current value already is the spec is only reverted: nothing
        # to restart for.
        current_drift = {_KEY_OF[d.field] for d in config_drift(_current(items), req.spec)}
        revert = sorted(k for k in values if k in pending and k not in current_drift)
        changes = {k: v for k, v in values.items() if k not in revert}
        return StepResult(
            "continue",
            advance(
                progress,
                "write",
                node=node,
                vmid=req.vmid,
                digest=str(config.get("digest", "")),
                set=changes,
                revert=revert,
                known_tasks=None,
            ),
            "inspect",
            message=f"repair of VM {req.vmid} on {node} recorded: "
            + ", ".join([*(f"set {k}" for k in sorted(changes)), *(f"revert {k}" for k in revert)]),
        )

    def _judge(
        self,
        req: RepairRequest,
        node: str,
        entry: Mapping[str, Any],
        config: Mapping[str, str],
        status: Mapping[str, Any],
    ) -> None:
        """Seed 001's refusals, first match deciding: the same judgement as a power action's
        (``power_checks``), told in a repair's words."""
        label = f"VM {req.vmid} ({req.vm_name}) on {node}"
        lock = config.get("lock") or status.get("lock") or entry.get("lock")
        refused = ownership_refusal(
            req, req.identity, label=label, lock=lock, config=config, remedies=_REMEDIES, op=OP
        ) or guard_refusal(
            req.vmid, label=label, entry=entry, config=config, status=status, remedies=_REMEDIES
        )
        if refused:
            raise self._refusal(*refused)

    @staticmethod
    def _refusal(message: str, remediation: str) -> PermanentError:
        return PermanentError(message, remediation=remediation, op=OP)

    # --- write: one PUT with the digest that was read ------------------------------------

    def _write(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node, changes = str(progress["node"]), dict(progress.get("set") or {})
        revert = list(progress.get("revert") or [])
        try:
            self.api.set_vm_config(
                node,
                req.vmid,
                changes,
                revert=revert,
                digest=str(progress.get("digest") or "") or None,
                deadline=deadline,
            )
        except ApiError as err:
            if CHECKSUM_MISMATCH not in err.message:
                raise
            # Either our own earlier PUT landed (its reply was lost) or someone else changed
            # the config since it was read. Only the first may go on.
            config = self.api.vm_config(node, req.vmid, deadline=deadline)
            if repair_values(config, req.spec):
                raise PermanentError(
                    f"the config of VM {req.vmid} ({req.vm_name}) changed since proxyhub read "
                    f"it (Proxmox: {err.message.strip()}); nothing was written",
                    remediation="someone else edited the VM meanwhile: check the change in "
                    "Proxmox; reconcile reads the VM again and shows what still differs, and "
                    "repairs it again only after another operation on the proxy (a reboot, a "
                    "replace): the next try is an operator's",
                    op=OP,
                ) from err
        return StepResult(
            "continue",
            advance(progress, "check"),
            "write",
            submitted=True,
            message="wrote " + ", ".join([*sorted(changes), *(f"revert {k}" for k in revert)]),
        )

    # --- check: is anything left pending? -----------------------------------------------

    def _check(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node = str(progress["node"])
        left = sorted(_pending_keys(self.api.vm_pending(node, req.vmid, deadline=deadline)))
        if not left:
            return StepResult(
                "continue", advance(progress, "verify"), "check", message="applied at once"
            )
        status = self.api.vm_status(node, req.vmid, deadline=deadline)
        if str(status.get("status")) != "running":
            # Stopped since the write: its next start applies what is pending (§7.13).
            return self._finished(req, progress, "check", rebooted=False, pending=left)
        return StepResult(
            "continue",
            advance(progress, "reboot", pending=left),
            "check",
            message=f"pending until a restart: {', '.join(left)}",
        )

    # --- reboot: only for what stays pending --------------------------------------------

    def _reboot(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node = str(progress["node"])
        result = self.submit_task(
            progress,
            "reboot",
            "reboot_wait",
            "qmreboot",
            lambda: self.api.reboot(node, req.vmid, timeout=SHUTDOWN_TIMEOUT, deadline=deadline),
            f"reboot of VM {req.vmid} on {node} submitted to apply "
            + ", ".join(progress.get("pending") or []),
            deadline,
        )
        result.progress["receipt"] = result.upid
        return result

    def _reboot_wait(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        def failed(err: TaskFailed) -> StepResult:
            # Seed 001: a failed task is read, never repeated; the operation ends with it.
            error = PermanentError(
                f"the reboot that applies the repair of VM {req.vmid} ({req.vm_name}) failed: "
                f"{err.exitstatus}",
                remediation="the change stays pending in Proxmox and applies at the VM's next "
                "start; the node's task log has details",
                op=OP,
            )
            return StepResult("error", progress, "reboot_wait", upid=err.upid, error=error)

        return self.poll(
            progress,
            "reboot_wait",
            SHUTDOWN_TIMEOUT + POWERDOWN_MARGIN,
            "verify",
            deadline,
            failed,
        )

    # --- verify ----------------------------------------------------------------------------

    def _verify(
        self, req: RepairRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node = str(progress["node"])
        items = self.api.vm_pending(node, req.vmid, deadline=deadline)
        rebooted = bool(progress.get("receipt"))
        left = sorted(_pending_keys(items) & _owned(progress))
        running = True
        if rebooted:
            status = self.api.vm_status(node, req.vmid, deadline=deadline)
            running = (status.get("status"), status.get("qmpstatus")) == ("running", "running")
        if left or not running:
            # A reboot's restart is a separate start after its task (pve-reference §7.16).
            since = progress.get("since") or self.clock()
            if self.clock() - since > self.budgets.running:
                raise TransientError(
                    f"VM {req.vmid} still shows {', '.join(left) or 'no running guest'} "
                    f"{int(self.budgets.running)} s after its repair",
                    remediation="the next attempt reads it again; nothing is resubmitted",
                    op=OP,
                )
            return StepResult(
                "wait", dict(progress, since=since), "verify", delay=self.budgets.poll_interval
            )
        still = config_drift(_current(items), req.spec)
        if still:
            raise PermanentError(
                f"VM {req.vmid} ({req.vm_name}) still differs after its repair: "
                + "; ".join(f"{d.field} is {d.have or 'unset'}, not {d.want}" for d in still),
                remediation="something else changed it meanwhile; check the VM in Proxmox",
                op=OP,
            )
        return self._finished(req, progress, "verify", rebooted=rebooted, pending=[])

    def _finished(
        self,
        req: RepairRequest,
        progress: Progress,
        step: str,
        *,
        rebooted: bool,
        pending: Sequence[str],
    ) -> StepResult:
        keys = sorted(_owned(progress))
        message = f"VM {req.vmid} repaired ({', '.join(keys)})"
        if rebooted:
            message += ", rebooted to apply it"
        if pending:
            message += f"; {', '.join(pending)} apply at its next start (it is stopped)"
        return StepResult(
            "done",
            advance(progress, "done"),
            step,
            message=message,
            details={
                "node": progress.get("node"),
                "keys": keys,
                "rebooted": rebooted,
                "upid": progress.get("receipt"),
            },
        )


_NOT_OURS = "proxyhub repairs only the VMs it created for the proxy"
_REMEDIES = Remedies(
    not_ours=_NOT_OURS,
    hibernated="resume it in Proxmox or destroy it; proxyhub does not repair hibernated VMs",
    locked="wait for the Proxmox task holding the lock to finish, or clear a stale lock with "
    "`qm unlock {vmid}`; the next reconcile round looks again",
    template="templates are never repaired",
    halted="resume it in Proxmox (`qm resume {vmid}`) or stop it there",
    ha="repair it through Proxmox, or remove it from HA resources; proxyhub does not restart "
    "HA-managed VMs",
    hookscript="remove the hookscript option in Proxmox; proxyhub does not restart VMs through "
    "hook scripts",
)


def _owned(progress: Progress) -> set[str]:
    return set(progress.get("set") or {}) | set(progress.get("revert") or [])


def _pending_keys(items: Sequence[Mapping[str, Any]]) -> set[str]:
    """Keys with a pending value or deletion in a ``/pending`` answer (§7.12)."""
    return {str(i.get("key")) for i in items if "pending" in i or "delete" in i}


def _current(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The current (not pending) config from a ``/pending`` answer (§7.12)."""
    return {str(i["key"]): i["value"] for i in items if "value" in i and "key" in i}
