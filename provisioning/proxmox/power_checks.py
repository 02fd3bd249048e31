"""Whether a power action may run on a VM now, and what its confirmation page shows: seed 001.

Seed 001's adapter refuses "templates, locked or suspended configurations, pending configuration
changes, hook scripts and HA-managed VMs", and its "power requests produce a host confirmation
preview". ``inspect_power`` is that judgement, read-only: the admin's confirmation page shows
its ``PowerPreview`` for each target, and the power machine (``power.py``) makes the same
judgement through ``judge_power`` before it records an intent and again right before dispatch.
A refusal is a ``PermanentError`` that says what to do; a VM already in the wanted state is a
no-op, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from .api import Api
from .config_digest import REMEDY as DIGEST_REMEDY
from .config_digest import digest_changed
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import NotFoundError, PermanentError, ProxmoxError, TransientError
from .errors import classify as classify_error
from .identity import Identity, IdentityMismatch, check_identity
from .ids import parse_provider_id
from .marks import parse_mark

OP = "power"

Action = Literal["start", "shutdown", "reboot"]
ACTIONS: tuple[Action, ...] = ("start", "shutdown", "reboot")

# pve-reference §7.17: QMP run states in which QEMU runs but the guest does not.
HALTED = frozenset({"paused", "suspended", "prelaunch"})


@dataclass(frozen=True)
class PowerRequest:
    """Which power action, on which VM: its VMID, its name and its proxy's UID.

    The name and UID are checked against the VM's config before anything is sent (the same
    check ``delete`` makes), because a VMID can be reused by a VM that is not ours; so are the
    SMBIOS UUID and vmgenid recorded for it (seed 001), when there are any.
    """

    action: Action
    vmid: int
    vm_name: str
    uid: str = ""
    smbios_uuid: str = ""
    vmgenid: str = ""
    # Seed 001: "configuration digests are additional confirmation conditions". The config
    # ``digest`` the confirmation page showed; when set, a VM whose config has another digest
    # now is refused (issue 14). Empty: no page showed one (a command, reconcile).
    expected_digest: str = ""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"power action must be one of {', '.join(ACTIONS)}: {self.action!r}")

    @classmethod
    def from_provider_id(
        cls, action: Action, provider_id: str, uid: str = "", identity: Identity | None = None
    ) -> PowerRequest:
        parsed = parse_provider_id(provider_id)  # malformed: PermanentError
        known = identity or Identity()
        return cls(
            action=action,
            vmid=parsed.vmid,
            vm_name=parsed.name,
            uid=uid,
            smbios_uuid=known.smbios_uuid,
            vmgenid=known.vmgenid,
        )

    @property
    def identity(self) -> Identity:
        return Identity(self.smbios_uuid, self.vmgenid)


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
    # The config's ``digest`` as read (empty when the config was not read).
    digest: str = ""


@dataclass(frozen=True)
class Refusal:
    """A refusal split as ``ClassifiedError`` wants it: what is wrong, and what to do."""

    message: str
    remediation: str
    identity: bool = False  # the VM is not the one recorded: ``IdentityMismatch``

    def __str__(self) -> str:
        return f"{self.message}. {self.remediation}"

    def error(self) -> PermanentError:
        if self.identity:
            return IdentityMismatch(self.message, remediation=self.remediation, op=OP)
        return PermanentError(self.message, remediation=self.remediation, op=OP)


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
    preview, _ = judge_power(api, request, listing=listing, deadline=deadline)
    return preview


def judge_power(
    api: Api,
    request: PowerRequest,
    *,
    listing: Sequence[Mapping[str, Any]] | None = None,
    deadline: Deadline | None = None,
) -> tuple[PowerPreview, Refusal | None]:
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
) -> tuple[PowerPreview, Refusal | None]:
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
    digest = str(config.get("digest") or "")
    preview = PowerPreview(vmid, name, node, st, qmp, str(lock) if lock else None, digest=digest)
    label = f"VM {vmid} ({name}) on {node}"

    try:
        refused = ownership_refusal(
            req, req.identity, label=label, lock=lock, config=config, remedies=_REMEDIES, op=OP
        )
    except IdentityMismatch as err:
        refusal = Refusal(err.message, err.remediation, identity=True)
        return replace(preview, refusal=str(refusal)), refusal
    if refused:
        return _refused(preview, *refused)
    changed = digest_changed(req.expected_digest, digest)
    if changed:
        return _refused(preview, f"{label}: {changed}", DIGEST_REMEDY)

    if req.action == "start" and st == "running" and qmp == "running":
        return _skipped(preview, f"{label} is already running; start skipped")
    if req.action == "shutdown" and st == "stopped":
        return _skipped(preview, f"{label} is already stopped; shutdown skipped")

    refused = guard_refusal(
        vmid, label=label, entry=entry, config=config, status=status, remedies=_REMEDIES
    )
    if refused:
        return _refused(preview, *refused)
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


@dataclass(frozen=True)
class Remedies:
    """What an operator is told to do about each of seed 001's refusals, in the words of the
    action refused: a power action here, a drift repair in ``repair.py``. ``{vmid}`` is filled
    in where it stands."""

    not_ours: str
    hibernated: str
    locked: str
    template: str
    halted: str
    ha: str
    hookscript: str


_REMEDIES = Remedies(
    not_ours=_NOT_OURS,
    hibernated="resume it in Proxmox (a start there resumes it from disk) or destroy it, then "
    "retry; proxyhub does not power hibernated VMs",
    locked="wait for the Proxmox task holding the lock to finish, or clear a stale lock with "
    "`qm unlock {vmid}`, then retry",
    template="templates are never powered; pick the proxy's own VM",
    halted="resume it in Proxmox (`qm resume {vmid}`) or stop it there, then retry",
    ha="power it through Proxmox HA, or remove it from HA resources, then retry; "
    "proxyhub does not drive HA-managed VMs",
    hookscript="remove the hookscript option from the VM's options in Proxmox, then retry; "
    "proxyhub does not run power actions through hook scripts",
)


def ownership_refusal(
    req: Target,
    identity: Identity,
    *,
    label: str,
    lock: object,
    config: Mapping[str, str],
    remedies: Remedies,
    op: str,
) -> tuple[str, str] | None:
    """Seed 001's first refusals, first match deciding: a lock (``suspended`` means
    hibernated; a locked VM's config may be a clone's temporary file, so nothing else about it
    can be judged), then not ours, then templates. Another VM at our VMID with our name and
    mark raises ``IdentityMismatch``. The message and what to do, or None."""
    if lock == "suspended":
        return f"{label} is hibernated (lock: suspended)", remedies.hibernated
    if lock:
        return f"{label} is locked ({lock})", remedies.locked.format(vmid=req.vmid)
    why = not_ours(req, config)
    if why:
        return why, remedies.not_ours
    check_identity(identity, config, vmid=req.vmid, vm_name=req.vm_name, op=op)
    if str(config.get("template", "0")) == "1":
        return f"{label} is a template", remedies.template
    return None


def guard_refusal(
    vmid: int,
    *,
    label: str,
    entry: Mapping[str, Any],
    config: Mapping[str, str],
    status: Mapping[str, Any],
    remedies: Remedies,
) -> tuple[str, str] | None:
    """Seed 001's refusals that guard a lifecycle call, first match deciding: a paused or
    suspended guest, HA, a hook script. The message and what to do, or None."""
    st, qmp = str(status.get("status", "")), str(status.get("qmpstatus", ""))
    if st == "running" and qmp in HALTED:
        return (
            f"{label} is {qmp} (QEMU runs, the guest does not)",
            remedies.halted.format(vmid=vmid),
        )
    ha_state = ha_state_of(entry, status)
    if ha_state:
        return f"{label} is managed by Proxmox HA (state {ha_state})", remedies.ha
    if config.get("hookscript"):
        return f"{label} has a hook script ({config['hookscript']})", remedies.hookscript
    return None


class Target(Protocol):
    """Which VM a request means: its VMID, its name and its proxy's UID."""

    @property
    def vmid(self) -> int: ...
    @property
    def vm_name(self) -> str: ...
    @property
    def uid(self) -> str: ...


def not_ours(req: Target, config: Mapping[str, str]) -> str | None:
    """Why the VM is not this proxy's, or None: the name and mark check of ``delete`` (shared
    with ``repair.py``)."""
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


def _refused(preview: PowerPreview, message: str, remediation: str) -> tuple[PowerPreview, Refusal]:
    refusal = Refusal(message, remediation)
    return replace(preview, refusal=str(refusal)), refusal


def _skipped(preview: PowerPreview, noop: str) -> tuple[PowerPreview, None]:
    return replace(preview, noop=noop), None


def ha_state_of(entry: Mapping[str, Any], status: Mapping[str, Any]) -> str | None:
    """The HA state of a VM managed by Proxmox HA, or None: ``ha.managed`` in status/current,
    ``hastate`` in the listing (pve-reference §7.9, §7.17)."""
    ha = status.get("ha")
    state = entry.get("hastate")
    if isinstance(ha, Mapping) and truthy(ha.get("managed")):
        state = ha.get("state") or state or "managed"
    return str(state) if state else None


def truthy(value: object) -> bool:
    """Proxmox booleans arrive as 0/1 numbers or strings (pve-reference §8.1)."""
    return value not in (None, "", 0, "0")
