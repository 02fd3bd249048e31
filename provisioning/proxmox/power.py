"""Power actions (start, graceful shutdown, reboot) as a resumable step machine: seed 001.

Seed 001's adapter runs start and graceful shutdown as registered Proxmox tasks "with a durable
intent written before dispatch" and "the exact UPID recorded as a receipt"; it refuses
"templates, locked or suspended configurations, pending configuration changes, hook scripts and
HA-managed VMs", and "a lost task result stays unknown; reading or repeating a receipt never
repeats the mutation". DESIGN.md §5 adds reboot and fixes the shutdown: 60 s, no force.

Stages (each call runs one; see ``steps.StepResult``):

``inspect``  read the VM and judge it (``inspect_power``): a refusal is a ``PermanentError``, a
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from .api import Api
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import NotFoundError, PermanentError, ProxmoxError, TaskFailed, TransientError
from .errors import classify as classify_error
from .ids import parse_provider_id
from .marks import parse_mark
from .steps import Progress, StepMachine, StepResult, advance, fail, submit_once
from .tasks import parse_upid

log = logging.getLogger("proxyhub.proxmox.provider")

OP = "power"

Action = Literal["start", "shutdown", "reboot"]
ACTIONS: tuple[Action, ...] = ("start", "shutdown", "reboot")

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
# pve-reference §7.17: QMP run states in which QEMU runs but the guest does not.
_HALTED = frozenset({"paused", "suspended", "prelaunch"})


@dataclass(frozen=True)
class PowerRequest:
    """Which power action, on which VM: its VMID, its name and its proxy's UID.

    The name and UID are checked against the VM's config before anything is sent (the same
    check ``delete`` makes), because a VMID can be reused by a VM that is not ours.
    """

    action: Action
    vmid: int
    vm_name: str
    uid: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"power action must be one of {', '.join(ACTIONS)}: {self.action!r}")

    @classmethod
    def from_provider_id(cls, action: Action, provider_id: str, uid: str = "") -> PowerRequest:
        parsed = parse_provider_id(provider_id)  # malformed: PermanentError
        return cls(action=action, vmid=parsed.vmid, vm_name=parsed.name, uid=uid)


@dataclass(frozen=True)
class PowerPreview:
    """What a confirmation page shows for one target (seed 001: "power requests produce a host
    confirmation preview"): where the VM is, its state, and what will happen to the request.

    ``refusal`` is the sentence saying why the action is refused and what to do; ``noop`` the
    sentence saying the VM is already in the wanted state, so the action is skipped. At most one
    of them is set; neither means the action will be submitted.
    """

    vmid: int
    name: str
    node: str
    status: str
    qmpstatus: str
    lock: str | None
    refusal: str | None = None
    noop: str | None = None


@dataclass(frozen=True)
class _Refusal:
    """A refusal split as ``ClassifiedError`` wants it: what is wrong, and what to do."""

    message: str
    remediation: str

    def __str__(self) -> str:
        return f"{self.message}. {self.remediation}"

    def error(self) -> PermanentError:
        return PermanentError(self.message, remediation=self.remediation, op=OP)


def new_progress() -> Progress:
    """The record a fresh power action starts from."""
    return {"v": 1, "stage": "inspect", "upid": None, "since": None}


def inspect_power(
    api: Api,
    request: PowerRequest,
    *,
    listing: Sequence[Mapping[str, Any]] | None = None,
    deadline: Deadline | None = None,
) -> PowerPreview:
    """Read-only: judge ``request`` against the VM as Proxmox shows it now.

    A VM that is gone raises ``NotFoundError``; anything that cannot be read raises the
    classified error. Pass the ``/cluster/resources`` listing when previewing many targets.
    """
    preview, _ = _judge(api, request, listing=listing, deadline=deadline)
    return preview


def _judge(
    api: Api,
    request: PowerRequest,
    *,
    listing: Sequence[Mapping[str, Any]] | None = None,
    deadline: Deadline | None = None,
) -> tuple[PowerPreview, _Refusal | None]:
    """The preview and, when refused, the refusal with its remediation kept apart."""
    try:
        return _examine(api, request, listing, deadline)
    except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
        raise classify_error(OP, err) from err


def _examine(
    api: Api,
    req: PowerRequest,
    listing: Sequence[Mapping[str, Any]] | None,
    deadline: Deadline | None,
) -> tuple[PowerPreview, _Refusal | None]:
    """The judgement, first match deciding:

    1. a lock (``suspended`` means hibernated): the config of a locked VM may be a clone's
       temporary file, so nothing else about it can be judged;
    2. not ours (a container, another name, no mark, another proxy's UID) and templates;
    3. the no-ops: a skipped action sends nothing, so the guards below, which protect a
       lifecycle call, have nothing to protect;
    4. paused or suspended guests, HA, a hook script, pending changes (seed 001's list), and a
       reboot of a stopped VM (Proxmox: ``VM <vmid> not running``).
    """
    vmid = req.vmid
    if listing is None:
        listing = api.cluster_resources(deadline=deadline)
    entry = next((e for e in listing if int(e.get("vmid", -1)) == vmid), None)
    if entry is None:
        raise NotFoundError(f"VM {vmid} ({req.vm_name}) does not exist", op=OP)
    node = str(entry.get("node", ""))
    listed_name = str(entry.get("name") or "")
    if entry.get("type") != "qemu":
        preview = PowerPreview(vmid, listed_name, node, str(entry.get("status", "")), "", None)
        return _refused(
            preview,
            f"VMID {vmid} holds a {entry.get('type')} guest, not {req.vm_name}",
            _NOT_OURS,
        )
    if entry.get("status") == "unknown":
        raise TransientError(f"VM {vmid} is on node {node}, which does not answer", op=OP)

    config = api.vm_config(node, vmid, deadline=deadline)
    status = api.vm_status(node, vmid, deadline=deadline)
    st, qmp = str(status.get("status", "")), str(status.get("qmpstatus", ""))
    lock = config.get("lock") or status.get("lock") or entry.get("lock") or None
    name = config.get("name") or listed_name
    preview = PowerPreview(vmid, name, node, st, qmp, str(lock) if lock else None)
    label = f"VM {vmid} ({name}) on {node}"

    if lock == "suspended":
        return _refused(
            preview,
            f"{label} is hibernated (lock: suspended)",
            "resume it in Proxmox (a start there resumes it from disk) or destroy it, then "
            "retry; proxyhub does not power hibernated VMs",
        )
    if lock:
        return _refused(
            preview,
            f"{label} is locked ({lock})",
            "wait for the Proxmox task holding the lock to finish, or clear a stale lock with "
            f"`qm unlock {vmid}`, then retry",
        )
    not_ours = _not_ours(req, config)
    if not_ours:
        return _refused(preview, not_ours, _NOT_OURS)
    if str(config.get("template", "0")) == "1":
        return _refused(
            preview,
            f"{label} is a template",
            "templates are never powered; pick the proxy's own VM",
        )

    if req.action == "start" and st == "running" and qmp == "running":
        return _skipped(preview, f"{label} is already running; start skipped")
    if req.action == "shutdown" and st == "stopped":
        return _skipped(preview, f"{label} is already stopped; shutdown skipped")

    if st == "running" and qmp in _HALTED:
        return _refused(
            preview,
            f"{label} is {qmp} (QEMU runs, the guest does not)",
            f"resume it in Proxmox (`qm resume {vmid}`) or stop it there, then retry",
        )
    # ``ha.managed`` in status/current, ``hastate`` in the listing (pve-reference §7.9, §7.17).
    ha = status.get("ha")
    ha_state = entry.get("hastate")
    if isinstance(ha, Mapping) and _truthy(ha.get("managed")):
        ha_state = ha.get("state") or ha_state or "managed"
    if ha_state:
        return _refused(
            preview,
            f"{label} is managed by Proxmox HA (state {ha_state})",
            "power it through Proxmox HA, or remove it from HA resources, then retry; "
            "proxyhub does not drive HA-managed VMs",
        )
    if config.get("hookscript"):
        return _refused(
            preview,
            f"{label} has a hook script ({config['hookscript']})",
            "remove the hookscript option from the VM's options in Proxmox, then retry; "
            "proxyhub does not run power actions through hook scripts",
        )
    pending = sorted(
        str(item.get("key"))
        for item in api.vm_pending(node, vmid, deadline=deadline)
        if "pending" in item or "delete" in item
    )
    if pending:
        return _refused(
            preview,
            f"{label} has pending configuration changes ({', '.join(pending)})",
            "apply or revert them in Proxmox (Hardware or Options: Revert), then retry; a "
            "start or reboot would apply them unreviewed",
        )
    if req.action == "reboot" and st != "running":
        return _refused(
            preview,
            f"{label} is {st or 'not running'}, so it cannot be rebooted "
            f"(Proxmox: VM {vmid} not running)",
            "start it instead",
        )
    return preview, None


_NOT_OURS = (
    "proxyhub powers only the VMs it created for the proxy; if the proxy's VM was replaced, "
    "refresh the proxy and use its new VM"
)


def _not_ours(req: PowerRequest, config: Mapping[str, str]) -> str | None:
    """Why the VM is not this proxy's, or None: the name and mark check of ``delete``."""
    vmid, found = req.vmid, config.get("name")
    if found != req.vm_name:
        now = f"named {found!r}" if found else "unnamed"
        return f"VM {vmid} is {now}, not {req.vm_name}: its VMID was reused"
    mark = parse_mark(config.get("description"))
    if not mark.managed:
        return f"VM {vmid} ({req.vm_name}) carries no proxyhub mark"
    if req.uid and mark.uid and mark.uid != req.uid:
        return f"VM {vmid} ({req.vm_name}) belongs to proxy uid {mark.uid}, not {req.uid}"
    return None


def _refused(
    preview: PowerPreview, message: str, remediation: str
) -> tuple[PowerPreview, _Refusal]:
    refusal = _Refusal(message, remediation)
    return replace(preview, refusal=str(refusal)), refusal


def _skipped(preview: PowerPreview, noop: str) -> tuple[PowerPreview, None]:
    return replace(preview, noop=noop), None


def _truthy(value: object) -> bool:
    """Proxmox booleans arrive as 0/1 numbers or strings (pve-reference §8.1)."""
    return value not in (None, "", 0, "0")


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
        preview, refusal = _judge(self.api, req, deadline=deadline)
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
        preview, refusal = _judge(self.api, req, deadline=deadline)
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
            # The receipt is read, never resubmitted; a later attempt records a new intent.
            retry = advance(progress, "inspect")
            if req.action != "start" and _POWERDOWN_TIMEOUT in err.exitstatus:
                error = TransientError(
                    f"VM {req.vmid} ({req.vm_name}) did not power off within "
                    f"{SHUTDOWN_TIMEOUT} s of the graceful {req.action} (Proxmox: "
                    f"{err.exitstatus})",
                    remediation="the guest ignored the ACPI or guest-agent shutdown and nothing "
                    "was forced, so the VM still runs; check the guest (agent, ACPI), then "
                    "retry, or stop it in Proxmox",
                    op=OP,
                )
                return StepResult("error", retry, "wait", upid=err.upid, error=error)
            return fail(retry, "wait", err, op=OP)

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
