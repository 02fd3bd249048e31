"""Delete, as a resumable step machine: seed 000 entry 11.

Stages: ``inspect`` (one listing, then the config: is the VM there and ours?), ``stop`` and
``stop_wait``, ``destroy`` and ``destroy_wait`` (``purge=1&destroy-unreferenced-disks=1``), then
``seed`` and ``seed_wait`` for the seed ISO on each node that may hold it.

Name and mark are checked again right before every stop and every destroy, not only at
``inspect``: between two steps our VM may be destroyed by someone else and its VMID given to
another VM, and a late delete must never destroy that one (the stale-VMID bug CAPMOX #856).
A VM that is not ours is left alone and only our seed ISO is removed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import ApiError, PermanentError, ProxmoxError, TaskFailed, TransientError
from .ids import parse_provider_id
from .marks import parse_mark
from .ownership import is_missing
from .seed import seed_iso_name, seed_volid
from .steps import Progress, StepMachine, StepResult, advance, fail

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
            return self._seeds_everywhere(progress, "inspect", "no VM of ours at that VMID")
        vmid, node = int(entry["vmid"]), str(entry["node"])
        lock = entry.get("lock")
        if (lock and lock != "suspended") or entry.get("status") == "unknown":
            why = f"locked ({lock})" if lock else "on a node that does not answer"
            return self._wait(progress, "inspect", f"VM {vmid} is {why}", vmid=vmid, node=node)
        try:
            config = self.api.vm_config(node, vmid, deadline=deadline)
        except ApiError as err:
            if is_missing(err):
                return self._seeds_everywhere(progress, "inspect", f"VM {vmid} is already gone")
            raise
        verdict = self._ours(req, vmid, node, config)
        if verdict is not None:
            return self._seeds_everywhere(progress, "inspect", verdict)
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
        return StepResult(
            "continue",
            advance(progress, stage, vmid=vmid, node=node, ours=True),
            "inspect",
            message=f"VM {vmid} on {node} is ours",
        )

    def _ours(
        self, req: DeleteRequest, vmid: int, node: str, config: Mapping[str, str]
    ) -> str | None:
        """None when the VM is ours; else why it is left alone (logged, never destroyed)."""
        if config.get("name") != req.vm_name:
            why = f"VM {vmid} is now named {config.get('name')!r}: its VMID was reused; left alone"
        else:
            mark = parse_mark(config.get("description"))
            if not mark.managed:
                why = f"VM {vmid} ({req.vm_name}) carries no proxyhub mark; left alone"
            elif req.uid and mark.uid and mark.uid != req.uid:
                why = f"VM {vmid} ({req.vm_name}) belongs to proxy uid {mark.uid}; left alone"
            else:
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
                advance(progress, progress["stage"], ours=False), progress["stage"], verdict
            )
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
        return self.submit_task(
            progress,
            "stop",
            "stop_wait",
            "qmstop",
            lambda: self.api.stop(node, vmid, deadline=deadline),
            f"stopping VM {vmid}",
            deadline,
        )

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
                destroyed=True, seed_nodes=_seed_nodes(req, node), seed_everywhere=False
            )
        return result

    # --- the seed ISO (entry 11 step 7) -----------------------------------------------

    def _seed(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        nodes = list(progress.get("seed_nodes") or [])
        if not nodes:
            return StepResult(
                "done",
                advance(progress, "done"),
                "seed",
                message="deleted" if progress.get("destroyed") else "nothing to destroy",
            )
        node = nodes[0]
        volid = seed_volid(self.config.iso_storage, req.vm_name)
        try:
            upid = self.api.delete_volume(node, self.config.iso_storage, volid, deadline=deadline)
        except (Cancelled, DeadlineExceeded):
            raise
        except ProxmoxError as err:
            return self._seed_failed(progress, "seed", node, err)
        if upid is None:
            return StepResult("continue", dict(progress, seed_nodes=nodes[1:]), "seed")
        return self._submitted(
            progress, "seed", "seed_wait", upid, f"deleting {seed_iso_name(req.vm_name)} on {node}"
        )

    def _seed_wait(
        self, req: DeleteRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        nodes = list(progress.get("seed_nodes") or [])
        node = nodes[0] if nodes else ""
        try:
            result = self.poll(
                progress,
                "seed_wait",
                self.budgets.seed_delete,
                "seed",
                deadline,
                lambda err: self._seed_failed(progress, "seed_wait", node, err),
            )
        except (Cancelled, DeadlineExceeded):
            raise
        except ProxmoxError as err:
            return self._seed_failed(progress, "seed_wait", node, err)
        if result.status == "continue" and result.progress["stage"] == "seed":
            result.progress["seed_nodes"] = nodes[1:]
        return result

    def _seed_failed(self, progress: Progress, step: str, node: str, err: Exception) -> StepResult:
        """A missing volume is a successful task, so a failure here is real. On the every-node
        path it is logged and the node skipped; on the VM's own node it fails the delete."""
        if not progress.get("seed_everywhere"):
            return fail(advance(progress, "seed"), step, err, op=OP)
        log.info("proxmox seed delete skipped", extra={"node": node, "reason": str(err)})
        nodes = list(progress.get("seed_nodes") or [])
        return StepResult(
            "continue",
            advance(progress, "seed", seed_nodes=nodes[1:]),
            step,
            message=f"seed delete on {node} skipped: {err}",
        )

    # --- helpers ----------------------------------------------------------------------

    def _seeds_everywhere(self, progress: Progress, step: str, message: str) -> StepResult:
        return StepResult(
            "continue",
            advance(progress, "seed", seed_nodes=list(self.config.nodes), seed_everywhere=True),
            step,
            message=message,
        )

    def _seeds_on(
        self, req: DeleteRequest, progress: Progress, step: str, node: str, message: str
    ) -> StepResult:
        """On to step 7 once a VM of ours on ``node`` is gone (``_seed_nodes`` says where)."""
        return StepResult(
            "continue",
            advance(progress, "seed", seed_nodes=_seed_nodes(req, node), seed_everywhere=False),
            step,
            message=message,
        )

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


def _seed_nodes(req: DeleteRequest, node: str) -> list[str]:
    """Where step 7 deletes the seed once a VM of ours is gone: the VM's node (the seed's
    rule), then any node an earlier VM of the proxy was created on."""
    return [node] + [n for n in dict.fromkeys(req.earlier_nodes) if n and n != node]


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
