"""Power actions (start, graceful shutdown, reboot) as a resumable step machine: seed 001.

Seed 001's adapter runs start and graceful shutdown as registered Proxmox tasks "with a durable
intent written before dispatch" and "the exact UPID recorded as a receipt", and "a lost task
result stays unknown; reading or repeating a receipt never repeats the mutation". DESIGN.md §5
adds reboot and fixes the shutdown: 60 s, no force. Whether an action may run at all (seed 001's
refusals) is judged in ``power_checks.py``.

Stages (each call runs one; see ``steps.StepResult``):

``inspect``  read the VM and judge it (``judge_power``): a refusal is a ``PermanentError``, a
             no-op ends the operation; otherwise the intent is recorded: which VM, on which
             node, and which tasks of the action's type the node already lists for it
``submit``   first look for a task of that type that appeared since the intent (a submission
             whose reply was lost): it is the receipt, and only read. Otherwise judge the VM
             again, right before dispatch, and submit through ``steps.submit_once``
``wait``     poll the receipt's UPID
``settle``   read ``status/current`` until the VM is in the state the action promises (seed
             001: "observed only after a successful stopped task and the desired VM state are
             both observed")

The caller persists every ``StepResult.progress``; the inspect stage only ever returns
``continue`` to ``submit``, so the intent is on record before anything is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .deadline import Deadline
from .errors import PermanentError, TaskFailed, TransientError
from .power_checks import OP, PowerPreview, PowerRequest, judge_power
from .steps import Progress, StepMachine, StepResult, advance, submit_once
from .tasks import parse_upid

log = logging.getLogger("proxyhub.proxmox.provider")

# pve-reference §4.5: the task each action's POST starts (HA-managed VMs are refused, so the
# ``hastart``/``hastop`` variants never occur).
TASK_TYPES: Mapping[str, str] = {"start": "qmstart", "shutdown": "qmshutdown", "reboot": "qmreboot"}

# DESIGN.md §5 and seed 001: "a 60 second graceful limit with force disabled". Proxmox ends the
# task itself when the guest has not powered off by then (pve-reference §7.16), so our wait only
# has to outlast it by the time the worker needs to take the config lock and be polled.
SHUTDOWN_TIMEOUT = 60
POWERDOWN_MARGIN = 30.0

# How many of the VM's earlier tasks of the action's type the intent remembers. The node lists
# tasks newest first, so any task in a later listing that the intent does not know is newer.
KNOWN_TASKS = 10

# pve-reference §3.2, ``_do_vm_stop``: a guest that did not power off within ``timeout``.
_POWERDOWN_TIMEOUT = "got timeout"


def new_progress() -> Progress:
    """The record a fresh power action starts from."""
    return {"v": 1, "stage": "inspect", "upid": None, "since": None}


class PowerMachine(StepMachine[PowerRequest]):
    """Runs one stage of a power action per call. Stateless: everything lives in the record."""

    op = OP
    first_stage = "inspect"

    def on_refused(self, req: PowerRequest, err: PermanentError) -> None:
        log.info(
            "proxmox power refused",
            extra={
                "vmid": req.vmid,
                "vm_name": req.vm_name,
                "action": req.action,
                "reason": err.message,
            },
        )

    def on_done(self, req: PowerRequest, progress: Progress, result: StepResult) -> None:
        log.info(
            "proxmox vm powered",
            extra={
                "vmid": req.vmid,
                "vm_name": req.vm_name,
                "node": result.details.get("node"),
                "action": req.action,
                "noop": result.details.get("noop"),
                "upid": result.details.get("upid"),
            },
        )

    # --- inspect: the intent ------------------------------------------------------------

    def _inspect(
        self, req: PowerRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        preview, refusal = judge_power(self.api, req, deadline=deadline)
        if refusal is not None:
            raise refusal.error()
        if preview.noop:
            return self._skipped(req, progress, preview)
        task_type = TASK_TYPES[req.action]
        known = self.api.node_tasks(
            preview.node,
            vmid=req.vmid,
            typefilter=task_type,
            source="all",
            limit=KNOWN_TASKS,
            deadline=deadline,
        )
        return StepResult(
            "continue",
            advance(
                progress,
                "submit",
                action=req.action,
                vmid=req.vmid,
                node=preview.node,
                known_tasks=[str(t["upid"]) for t in known if t.get("upid")],
                receipt=None,
            ),
            "inspect",
            message=f"{req.action} of VM {req.vmid} on {preview.node} recorded",
        )

    # --- submit: the dispatch -----------------------------------------------------------

    def _submit(
        self, req: PowerRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        node, task_type = str(progress["node"]), TASK_TYPES[req.action]
        found = self._since_intent(req, progress, deadline)
        if found is not None:
            # A submission whose reply was lost: its task is the receipt, read and never
            # repeated, whether it still runs or has ended (seed 001).
            return StepResult(
                "wait",
                advance(progress, "wait", upid=found, since=self.clock(), receipt=found),
                "submit",
                delay=self.budgets.poll_interval,
                upid=found,
                message=f"found {task_type} task {found} submitted since the intent; reading it",
            )
        # Judged again right before dispatch: the VM may have been locked, paused, handed to
        # HA or replaced since the intent was recorded.
        preview, refusal = judge_power(self.api, req, deadline=deadline)
        if refusal is not None:
            raise refusal.error()
        if preview.noop:
            return self._skipped(req, progress, preview)
        if preview.node != node:
            return StepResult(
                "continue",
                advance(progress, "inspect"),
                "submit",
                message=f"VM {req.vmid} moved from {node} to {preview.node}; inspecting again",
            )
        result = submit_once(
            self.api,
            progress,
            step="submit",
            next_stage="wait",
            node=node,
            vmid=req.vmid,
            task_type=task_type,
            submit=lambda: self._dispatch(req, node, deadline),
            message=f"{req.action} of VM {req.vmid} on {node} submitted",
            poll_interval=self.budgets.poll_interval,
            op=OP,
            clock=self.clock,
            deadline=deadline,
        )
        result.progress["receipt"] = result.upid
        return result

    def _dispatch(self, req: PowerRequest, node: str, deadline: Deadline | None) -> str:
        if req.action == "start":
            return self.api.start(node, req.vmid, deadline=deadline)
        if req.action == "shutdown":
            return self.api.shutdown(
                node, req.vmid, timeout=SHUTDOWN_TIMEOUT, force_stop=False, deadline=deadline
            )
        return self.api.reboot(node, req.vmid, timeout=SHUTDOWN_TIMEOUT, deadline=deadline)

    def _since_intent(
        self, req: PowerRequest, progress: Progress, deadline: Deadline | None
    ) -> str | None:
        """A task of the action's type for the VM that the intent did not know, if any.

        Compared by UPID and by the node's own start times, never by our clock against the
        node's. A task somebody else started after the intent is adopted too: it does what
        the intent asked for.
        """
        task_type = TASK_TYPES[req.action]
        known = [str(u) for u in progress.get("known_tasks") or []]
        newest = max((_starttime(u) for u in known), default=0)
        tasks = self.api.node_tasks(
            str(progress["node"]),
            vmid=req.vmid,
            typefilter=task_type,
            source="all",
            limit=KNOWN_TASKS,
            deadline=deadline,
        )
        for task in tasks:
            upid = str(task.get("upid") or "")
            if (
                upid
                and upid not in known
                and task.get("type") == task_type
                and str(task.get("id")) == str(req.vmid)
                and _starttime(upid) >= newest
            ):
                return upid
        return None

    # --- wait and settle ----------------------------------------------------------------

    def _wait(self, req: PowerRequest, progress: Progress, deadline: Deadline | None) -> StepResult:
        budget = (
            self.budgets.start if req.action == "start" else SHUTDOWN_TIMEOUT + POWERDOWN_MARGIN
        )

        def failed(err: TaskFailed) -> StepResult:
            # Seed 001: "A stopped task with an error has state failed; it is not retried." The
            # receipt is read, never resubmitted, and no new intent is recorded: the operation
            # ends with the task's exit status, and a further try is the operator's.
            if req.action != "start" and _POWERDOWN_TIMEOUT in err.exitstatus:
                error = PermanentError(
                    f"VM {req.vmid} ({req.vm_name}) did not power off within "
                    f"{SHUTDOWN_TIMEOUT} s of the graceful {req.action} (Proxmox: "
                    f"{err.exitstatus})",
                    remediation="the guest ignored the ACPI or guest-agent shutdown and nothing "
                    "was forced, so the VM still runs; check the guest (agent, ACPI), then "
                    "ask again, or stop it in Proxmox",
                    op=OP,
                )
            else:
                error = PermanentError(
                    f"Proxmox ran the {req.action} of VM {req.vmid} ({req.vm_name}) and it "
                    f"stopped with an error: {err.exitstatus}",
                    remediation="the task log on the node has details; a failed power task is "
                    "not repeated (seed 001), so ask again once the cause is fixed",
                    op=OP,
                )
            return StepResult("error", progress, "wait", upid=err.upid, error=error)

        return self.poll(progress, "wait", budget, "settle", deadline, failed)

    def _settle(
        self, req: PowerRequest, progress: Progress, deadline: Deadline | None
    ) -> StepResult:
        """The task ended well; now the VM must show it. A reboot's restart is a separate
        ``qmstart`` after the ``qmreboot`` task ends (pve-reference §7.16), so ``stopped`` may
        be read for a moment and is waited through."""
        vmid, node = req.vmid, str(progress["node"])
        status = self.api.vm_status(node, vmid, deadline=deadline)
        st, qmp = str(status.get("status", "")), str(status.get("qmpstatus", ""))
        wanted = "stopped" if req.action == "shutdown" else "running"
        reached = st == "stopped" if wanted == "stopped" else (st, qmp) == ("running", "running")
        if reached:
            return StepResult(
                "done",
                advance(progress, "done"),
                "settle",
                message=f"VM {vmid} is {wanted} on {node}",
                details=_details(req, node, progress.get("receipt"), noop=False),
            )
        if req.action == "start" and st != "running":
            # Waiting cannot help: the guest stopped again, or was stopped. The next attempt
            # records a new intent and starts it again.
            return StepResult(
                "error",
                advance(progress, "inspect"),
                "settle",
                error=TransientError(
                    f"VM {vmid} is {st} after its start task succeeded",
                    remediation="the next attempt starts it again; the node's task log has details",
                    op=OP,
                ),
            )
        since = progress.get("since") or self.clock()
        if self.clock() - since > self.budgets.running:
            return StepResult(
                "error",
                dict(progress, since=None),
                "settle",
                error=TransientError(
                    f"VM {vmid} is not {wanted} {int(self.budgets.running)} s after its "
                    f"{req.action} task succeeded (status {st}, qmpstatus {qmp})",
                    remediation="the next attempt reads its state again; nothing is resubmitted",
                    op=OP,
                ),
            )
        return StepResult(
            "wait", dict(progress, since=since), "settle", delay=self.budgets.poll_interval
        )

    # --- helpers ----------------------------------------------------------------------

    def _skipped(self, req: PowerRequest, progress: Progress, preview: PowerPreview) -> StepResult:
        return StepResult(
            "done",
            advance(progress, "done", vmid=preview.vmid, node=preview.node),
            str(progress.get("stage", "inspect")),
            message=str(preview.noop),
            details=_details(req, preview.node, progress.get("receipt"), noop=True),
        )


def _starttime(upid: str) -> int:
    """The node's start time of a task, from its UPID (pve-reference §4.1); -1 when the UPID
    cannot be read, so such a task is never taken for a receipt."""
    try:
        return parse_upid(upid).starttime
    except ValueError:
        return -1


def _details(req: PowerRequest, node: str, receipt: object, *, noop: bool) -> dict[str, Any]:
    """What the journal keeps of a finished action: the target, the receipt, whether skipped."""
    return {"action": req.action, "vmid": req.vmid, "node": node, "upid": receipt, "noop": noop}
