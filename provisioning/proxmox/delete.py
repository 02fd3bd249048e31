"""Delete, as a resumable step machine: seed 000 entry 11.

Stages: ``inspect`` (one listing, then the config: is the VM there and ours?), ``stop`` and
``stop_wait``, ``destroy`` and ``destroy_wait`` (``purge=1&destroy-unreferenced-disks=1``), then
``seed`` and ``seed_wait`` for the seed ISO on each node that may hold it.

Only this installation's seed of this proxy is ever removed (issue 11): its name carries both
(``seed.seed_iso_name``). A seed of the name earlier versions used, ``<vm name>-seed.iso``,
says nothing of whose it is; it goes only when the VM this delete destroys (ours by name,
installation and uid) has it attached.

Name and mark are checked again right before every stop and every destroy, not only at
``inspect``: between two steps our VM may be destroyed by someone else and its VMID given to
another VM, and a late delete must never destroy that one (the stale-VMID bug CAPMOX #856).
A VM that is not ours is left alone and only our seed ISO is removed. A VM with our name and
mark but another SMBIOS UUID or vmgenid than recorded (seed 001: restored from a backup, or
created again at our VMID) is neither ours nor gone: the delete stops with ``IdentityMismatch``
and touches nothing, neither the VM nor the seed it may boot from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config_digest import REMEDY as DIGEST_REMEDY
from .config_digest import digest_changed
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import ApiError, PermanentError, ProxmoxError, TaskFailed, TransientError
from .identity import Identity, check_identity
from .ids import parse_provider_id
from .marks import parse_mark
from .ownership import is_missing
from .seed import legacy_seed_iso_name, seed_iso_name, seed_volid
from .steps import Progress, StepMachine, StepResult, advance, fail, warm

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "delete"


@dataclass(frozen=True)
class DeleteRequest:
    """Which VM to delete: its name, its proxy's UID, and its VMID when one was recorded.

    Without a VMID (a create that never recorded one) the VM is looked up by name.
    """

    vm_name: str
    uid: str = ""
    vmid: int | None = None
    # Nodes an earlier VM of this proxy was created on (a VM destroyed outside proxyhub and
    # created again elsewhere, a create superseded and tried again): each may still hold the
    # proxy's seed ISO, which step 7 removes along with the one on the VM's node.
    earlier_nodes: tuple[str, ...] = ()
    # The identity recorded for the VM (seed 001); empty for a record made before it was kept.
    identity: Identity = field(default_factory=Identity)
    # Seed 001, issue 14: the config digest the replace's confirmation page showed; a VM whose
    # config has another digest now is refused before it is stopped or destroyed.
    expected_digest: str = ""

    @classmethod
    def from_provider_id(cls, provider_id: str, uid: str = "") -> DeleteRequest:
        parsed = parse_provider_id(provider_id)
        return cls(vm_name=parsed.name, uid=uid, vmid=parsed.vmid)


def new_progress() -> Progress:
    return {"v": 1, "stage": "inspect", "upid": None, "since": None, "destroyed": False}


class DeleteMachine(StepMachine[DeleteRequest]):
    """Runs one stage of a delete per call. Stateless: everything lives in the record."""

    op = OP
    first_stage = "inspect"

    def on_done(self, req: DeleteRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox vm deleted",
            extra={
                "vmid": progress.get("vmid") or req.vmid,
                "vm_name": req.vm_name,
                "node": progress.get("node"),
                "destroyed": bool(progress.get("destroyed")),
            },
        )

    # --- inspect ----------------------------------------------------------------------

    def _inspect(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        listing = self.api.cluster_resources(deadline=deadline)
        entry = _find(listing, req)
        if entry is None or entry.get("type") != "qemu":
            return self._seeds_everywhere(req, progress, "inspect", "no VM of ours at that VMID")
        vmid, node = int(entry["vmid"]), str(entry["node"])
        lock = entry.get("lock")
        if (lock and lock != "suspended") or entry.get("status") == "unknown":
            why = f"locked ({lock})" if lock else "on a node that does not answer"
            return self._wait(progress, "inspect", f"VM {vmid} is {why}", vmid=vmid, node=node)
        try:
            config = self.api.vm_config(node, vmid, deadline=deadline)
        except ApiError as err:
            if is_missing(err):
                return self._seeds_everywhere(
                    req, progress, "inspect", f"VM {vmid} is already gone"
                )
            raise
        verdict = self._ours(req, vmid, node, config)
        if verdict is not None:
            return self._seeds_everywhere(req, progress, "inspect", verdict)
        _refuse_changed(req, vmid, node, config)
        config_lock = config.get("lock")
        if config_lock == "suspended":
            raise PermanentError(
                f"VM {vmid} on {node} ({req.vm_name}) is hibernated (lock: suspended)",
                remediation="resume or destroy it in Proxmox; the delete then completes",
                op=OP,
            )
        if config_lock:
            return self._wait(
                progress, "inspect", f"VM {vmid} is locked ({config_lock})", vmid=vmid, node=node
            )
        stage = "destroy" if entry.get("status") == "stopped" else "stop"
        legacy = seed_volid(self.config.iso_storage, legacy_seed_iso_name(req.vm_name))
        return StepResult(
            "continue",
            advance(
                progress,
                stage,
                vmid=vmid,
                node=node,
                ours=True,
                # A VM of an earlier version boots from a seed named for the VM alone: it is
                # this VM's to remove only because this VM, ours, has it attached.
                legacy_seed=legacy if _attached(config, legacy) else None,
            ),
            "inspect",
            message=f"VM {vmid} on {node} is ours",
        )

    def _ours(
        self, req: DeleteRequest, vmid: int, node: str, config: Mapping[str, str]
    ) -> str | None:
        """None when the VM is ours; else why it is left alone (logged, never destroyed).
        Raises ``IdentityMismatch`` for our name and mark on another VM (seed 001)."""
        if config.get("name") != req.vm_name:
            why = f"VM {vmid} is now named {config.get('name')!r}: its VMID was reused; left alone"
        else:
            mark = parse_mark(config.get("description"))
            if not mark.managed:
                why = f"VM {vmid} ({req.vm_name}) carries no proxyhub mark; left alone"
            elif not mark.uid or not req.uid:
                # Issue 11: a mark without a uid could be anyone's (create adopts one only by
                # writing the whole mark first); a request without one can prove nothing.
                why = f"VM {vmid} ({req.vm_name}) has no uid to match in its mark; left alone"
            elif mark.uid != req.uid:
                why = f"VM {vmid} ({req.vm_name}) belongs to proxy uid {mark.uid}; left alone"
            elif mark.installation != self.config.installation_id:
                why = (
                    f"VM {vmid} ({req.vm_name}) belongs to proxyhub installation "
                    f"{mark.installation or '(none)'}; left alone"
                )
            else:
                # Ours by name and mark; the hardware identity must agree too, or this is a
                # restored or re-created VM: IdentityMismatch, and nothing is done to it.
                check_identity(req.identity, config, vmid=vmid, vm_name=req.vm_name, op=OP)
                return None
        log.info(
            "proxmox vm not ours",
            extra={"vmid": vmid, "vm_name": req.vm_name, "node": node, "reason": why},
        )
        return why

    def _recheck(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult | Mapping[str, str]:
        """Read the config right before a stop or destroy: still there, still ours?"""
        vmid, node = int(progress["vmid"]), str(progress["node"])
        try:
            config = self.api.vm_config(node, vmid, deadline=deadline)
        except ApiError as err:
            if is_missing(err):
                return self._seeds_on(req, progress, progress["stage"], node, f"VM {vmid} is gone")
            raise
        verdict = self._ours(req, vmid, node, config)
        if verdict is not None:
            return self._seeds_everywhere(
                req,
                advance(progress, progress["stage"], ours=False, legacy_seed=None),
                progress["stage"],
                verdict,
            )
        _refuse_changed(req, vmid, node, config)
        return config

    # --- stop and destroy -------------------------------------------------------------

    def _status_if_ours(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult | str:
        """Right before a stop or a destroy: the VM's run state if it is still ours, else the
        step that leaves it alone (a reused VMID is never touched)."""
        checked = self._recheck(req, progress, deadline)
        if isinstance(checked, StepResult):
            return checked
        vmid, node = int(progress["vmid"]), str(progress["node"])
        if warm(progress):
            # Issue 12: the step before just saw the run state this stage follows from (the
            # listing said running, so ``stop``; the stop task ended, or the VM was stopped, so
            # ``destroy``), and nothing of ours was sent since. Wrong only if someone started
            # or stopped it meanwhile: Proxmox then refuses the destroy of a running VM, or
            # stops a stopped one, and the retry, cold, reads the status.
            return "running" if progress["stage"] == "stop" else "stopped"
        try:
            status = self.api.vm_status(node, vmid, deadline=deadline)
        except ApiError as err:
            if is_missing(err):
                # Gone between the config read and this one (a destroy whose reply was lost
                # ending just now): gone, not a fault to retry.
                return self._seeds_on(req, progress, progress["stage"], node, f"VM {vmid} is gone")
            raise
        return str(status.get("status", ""))

    def _stop(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        status = self._status_if_ours(req, progress, deadline)
        if isinstance(status, StepResult):
            return status
        vmid, node = int(progress["vmid"]), str(progress["node"])
        if status == "stopped":
            return StepResult(
                "continue", advance(progress, "destroy"), "stop", message="already stopped"
            )
        # Stop (not shutdown): it works on a paused VM too, which the listing shows as running.
        try:
            return self.submit_task(
                progress,
                "stop",
                "stop_wait",
                "qmstop",
                lambda: self.api.stop(node, vmid, deadline=deadline),
                f"stopping VM {vmid}",
                deadline,
            )
        except ApiError as err:
            if is_missing(err):
                # Gone since the recheck (a warm stop reads no status that would have said so).
                return self._seeds_on(req, progress, "stop", node, f"VM {vmid} is gone")
            raise

    def _stop_wait(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        return self.poll(
            progress,
            "stop_wait",
            self.budgets.stop,
            "destroy",
            deadline,
            lambda err: fail(advance(progress, "stop"), "stop_wait", err, op=OP),
        )

    def _destroy(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        status = self._status_if_ours(req, progress, deadline)
        if isinstance(status, StepResult):
            return status
        vmid, node = int(progress["vmid"]), str(progress["node"])
        if status != "stopped":
            return StepResult(
                "continue",
                advance(progress, "stop"),
                "destroy",
                message="running again; stopping first",
            )
        try:
            return self.submit_task(
                progress,
                "destroy",
                "destroy_wait",
                "qmdestroy",
                lambda: self.api.destroy(
                    node, vmid, purge=True, destroy_unreferenced_disks=True, deadline=deadline
                ),
                f"destroying VM {vmid}",
                deadline,
            )
        except ApiError as err:
            if is_missing(err):
                return self._seeds_on(req, progress, "destroy", node, f"VM {vmid} is gone")
            raise

    def _destroy_wait(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node = str(progress["node"])

        def failed(err: TaskFailed) -> StepResult:
            if "does not exist" in err.exitstatus:
                return self._seeds_on(req, progress, "destroy_wait", node, "VM already gone")
            return fail(advance(progress, "destroy"), "destroy_wait", err, op=OP)

        result = self.poll(progress, "destroy_wait", self.budgets.destroy, "seed", deadline, failed)
        if result.status == "continue" and result.progress["stage"] == "seed":
            result.progress.update(
                destroyed=True,
                seed_targets=self._targets_on(req, progress, node),
                seed_everywhere=False,
            )
        return result

    # --- the seed ISO (entry 11 step 7) -----------------------------------------------

    def _seed(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        targets = self._targets(req, progress)
        if not targets:
            return StepResult(
                "done",
                advance(progress, "done"),
                "seed",
                message="deleted" if progress.get("destroyed") else "nothing to destroy",
            )
        node, volid = targets[0]
        try:
            upid = self.api.delete_volume(node, self.config.iso_storage, volid, deadline=deadline)
        except (Cancelled, DeadlineExceeded):
            raise
        except ProxmoxError as err:
            return self._seed_failed(req, progress, "seed", node, err)
        if upid is None:
            return StepResult("continue", self._skip_target(req, progress), "seed")
        return self._submitted(
            progress,
            "seed",
            "seed_wait",
            upid,
            f"deleting {volid.split('/', 1)[-1]} on {node}",
        )

    def _seed_wait(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        targets = self._targets(req, progress)
        node = targets[0][0] if targets else ""
        try:
            result = self.poll(
                progress,
                "seed_wait",
                self.budgets.seed_delete,
                "seed",
                deadline,
                lambda err: self._seed_failed(req, progress, "seed_wait", node, err),
            )
        except (Cancelled, DeadlineExceeded):
            raise
        except ProxmoxError as err:
            return self._seed_failed(req, progress, "seed_wait", node, err)
        if result.status == "continue" and result.progress["stage"] == "seed":
            result.progress["seed_targets"] = [list(t) for t in targets[1:]]
            result.progress.pop("seed_nodes", None)
        return result

    def _targets(self, req: DeleteRequest, progress: Progress) -> list[tuple[str, str]]:
        """The seeds still to delete, as (node, volid). A record written by an earlier version
        lists nodes only (``seed_nodes``): on each, this proxy's seed of this installation."""
        if "seed_targets" in progress:
            return [(str(n), str(v)) for n, v in progress.get("seed_targets") or []]
        own = self._own_seed(req)
        return [(str(n), own) for n in progress.get("seed_nodes") or []] if own else []

    def _skip_target(self, req: DeleteRequest, progress: Progress) -> Progress:
        rest = self._targets(req, progress)[1:]
        out = advance(progress, "seed", seed_targets=[list(t) for t in rest])
        out.pop("seed_nodes", None)
        return out

    def _own_seed(self, req: DeleteRequest) -> str | None:
        """This proxy's seed in this installation; None without a uid to name it by."""
        if not req.uid:
            return None
        name = seed_iso_name(req.vm_name, installation_id=self.config.installation_id, uid=req.uid)
        return seed_volid(self.config.iso_storage, name)

    def _targets_on(self, req: DeleteRequest, progress: Progress, node: str) -> list[list[str]]:
        """Once a VM of ours on ``node`` is gone: our seed there and wherever an earlier VM of
        the proxy was created (``_seed_nodes``), then the legacy seed it had attached."""
        own = self._own_seed(req)
        targets = [[n, own] for n in _seed_nodes(req, node)] if own else []
        legacy = progress.get("legacy_seed")
        if legacy and progress.get("ours"):
            targets.append([node, str(legacy)])
        return targets

    def _seed_failed(
        self, req: DeleteRequest, progress: Progress, step: str, node: str, err: Exception
    ) -> StepResult:
        """A missing volume is a successful task, so a failure here is real. On the every-node
        path it is logged and the node skipped; on the VM's own node it fails the delete."""
        if not progress.get("seed_everywhere"):
            return fail(advance(progress, "seed"), step, err, op=OP)
        log.info("proxmox seed delete skipped", extra={"node": node, "reason": str(err)})
        return StepResult(
            "continue",
            self._skip_target(req, progress),
            step,
            message=f"seed delete on {node} skipped: {err}",
        )

    # --- helpers ----------------------------------------------------------------------

    def _seeds_everywhere(
        self, req: DeleteRequest, progress: Progress, step: str, message: str
    ) -> StepResult:
        """No VM of ours to destroy: our own seed on every node, and nothing else (issue 11:
        never a seed whose name does not say it is this installation's, this proxy's)."""
        own = self._own_seed(req)
        targets = [[n, own] for n in self.config.nodes] if own else []
        out = advance(progress, "seed", seed_targets=targets, seed_everywhere=True)
        out.pop("seed_nodes", None)
        return StepResult("continue", out, step, message=message)

    def _seeds_on(
        self, req: DeleteRequest, progress: Progress, step: str, node: str, message: str
    ) -> StepResult:
        """On to step 7 once a VM of ours on ``node`` is gone (``_targets_on`` says which)."""
        out = advance(
            progress,
            "seed",
            seed_targets=self._targets_on(req, progress, node),
            seed_everywhere=False,
        )
        out.pop("seed_nodes", None)
        return StepResult("continue", out, step, message=message)

    def _wait(self, progress: Progress, step: str, message: str, **changes: Any) -> StepResult:
        since = progress.get("since") or self.clock()
        if self.clock() - since > self.budgets.lock_wait:
            raise TransientError(
                f"{message} for more than {int(self.budgets.lock_wait)} s",
                remediation="the delete is retried; clear a stuck lock with `qm unlock <vmid>`",
                op=OP,
            )
        return StepResult(
            "wait",
            dict(progress, since=since, **changes),
            step,
            delay=self.budgets.poll_interval,
            message=message,
        )

    def _submitted(
        self, progress: Progress, step: str, next_stage: str, upid: str, message: str
    ) -> StepResult:
        return StepResult(
            "wait",
            advance(progress, next_stage, upid=upid, since=self.clock()),
            step,
            delay=self.budgets.poll_interval,
            upid=upid,
            submitted=True,
            message=message,
        )


def _refuse_changed(req: DeleteRequest, vmid: int, node: str, config: Mapping[str, str]) -> None:
    """Right before the VM is stopped or destroyed: refuse one whose config changed since its
    confirmation page showed it (seed 001's digest condition)."""
    changed = digest_changed(req.expected_digest, str(config.get("digest") or ""))
    if changed:
        raise PermanentError(
            f"VM {vmid} on {node} ({req.vm_name}): {changed}", remediation=DIGEST_REMEDY, op=OP
        )


def _seed_nodes(req: DeleteRequest, node: str) -> list[str]:
    """Where step 7 deletes the seed once a VM of ours is gone: the VM's node (the seed's
    rule), then any node an earlier VM of the proxy was created on."""
    return [node] + [n for n in dict.fromkeys(req.earlier_nodes) if n and n != node]


def _attached(config: Mapping[str, str], volid: str) -> bool:
    """Whether a drive of ``config`` holds ``volid`` (``<volid>,media=cdrom`` and the like)."""
    return any(str(value).split(",", 1)[0] == volid for value in config.values())


def _find(listing: list[dict[str, Any]], req: DeleteRequest) -> dict[str, Any] | None:
    """The listing entry at the recorded VMID, or the one VM with the name when none was."""
    if req.vmid is not None:
        return next((e for e in listing if int(e.get("vmid", -1)) == req.vmid), None)
    named = [
        e
        for e in listing
        if e.get("type") == "qemu"
        and e.get("name") == req.vm_name
        and not int(e.get("template") or 0)
    ]
    return named[0] if len(named) == 1 else None
