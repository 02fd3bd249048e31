"""Whose VM sits at a VMID: seed 000 entry 2's ownership check.

Create probes deterministic VMIDs (``ids.vmid_for``) and must never take over a VM it did not
make, nor probe past its own VM whose clone is still running (the duplicate-VM bug Phase 0
found). The verdicts:

* ``free``: nothing there; clone onto it;
* ``foreign``: another VM, a container or a template; try the next attempt;
* ``busy``: locked by a task or still nameless (a clone in progress); wait, then judge again;
* ``ours``: the name matches, the mark's UID is ours or empty and its installation is ours or
  empty; adopt it.

The same name without our mark, with another UID or with another installation's id, is a
``PermanentError``: an operator must look. So is our VM hibernated to disk (``lock:
suspended``), which never clears by itself.

Adoption and destroy judge a mark without a UID differently, on purpose (issue 11). A create
adopts one (seed 000 entry 2: the VM sits at the name only this proxy uses in this installation)
and writes the whole mark, uid and installation, before it does anything else to the VM, so
from then on the VM is ours by its mark. A destroy (``delete.py``) has no such claim to make and
cannot undo its mistake: a mark without a UID is not ours there, and the VM is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .api import Api
from .deadline import Deadline
from .errors import ApiError, PermanentError
from .marks import parse_mark

Verdict = Literal["free", "foreign", "busy", "ours"]


@dataclass(frozen=True)
class Ownership:
    verdict: Verdict
    vmid: int
    node: str | None = None
    config: Mapping[str, str] | None = None


def is_missing(err: ApiError) -> bool:
    """Proxmox's answer for a VM whose config file is gone (pve-reference §3.1)."""
    return err.status == 500 and "does not exist" in err.message


def judge(
    api: Api,
    vmid: int,
    entry: Mapping[str, Any] | None,
    *,
    vm_name: str,
    uid: str,
    installation: str,
    deadline: Deadline | None = None,
) -> Ownership:
    """Judge the VM at ``vmid`` from its ``/cluster/resources`` entry (None: absent)."""
    if entry is None:
        return Ownership("free", vmid)
    node = str(entry.get("node", ""))
    if entry.get("type") != "qemu" or int(entry.get("template") or 0) == 1:
        # Containers and templates are never ours; no config read needed.
        return Ownership("foreign", vmid, node)
    lock = entry.get("lock")
    if lock and lock != "suspended":
        return Ownership("busy", vmid, node)
    if not entry.get("name"):
        # A clone in progress lists neither a name nor, sometimes, a lock yet.
        return Ownership("busy", vmid, node)
    try:
        config = api.vm_config(node, vmid, deadline=deadline)
    except ApiError as err:
        if is_missing(err):
            return Ownership("free", vmid)
        raise
    return judge_config(vmid, node, config, vm_name=vm_name, uid=uid, installation=installation)


def judge_config(
    vmid: int,
    node: str,
    config: Mapping[str, str],
    *,
    vm_name: str,
    uid: str,
    installation: str,
) -> Ownership:
    """The verdict once the config has been read."""
    lock = config.get("lock")
    if lock and lock != "suspended":
        return Ownership("busy", vmid, node, config)
    if config.get("name") != vm_name:
        return Ownership("foreign", vmid, node, config)
    mark = parse_mark(config.get("description"))
    if not mark.managed or (mark.uid and mark.uid != uid):
        found = mark.uid if mark.managed and mark.uid else "no proxyhub mark"
        raise PermanentError(
            f"VM {vmid} on {node} is named {vm_name} but is not this proxy's "
            f"(expected uid {uid}, found {found})",
            remediation="proxyhub never takes over a VM it did not create: rename or remove "
            "that VM in Proxmox, then retry",
        )
    if mark.installation and mark.installation != installation:
        # Two installations sharing a cluster, each with a proxy of this name (issue 11).
        raise PermanentError(
            f"VM {vmid} on {node} is named {vm_name} but belongs to proxyhub installation "
            f"{mark.installation}, not this one ({installation})",
            remediation="two installations sharing a cluster need distinct proxy names: rename "
            "this proxy, or remove that VM from the other installation",
        )
    if lock == "suspended":
        raise PermanentError(
            f"VM {vmid} on {node} ({vm_name}) is hibernated (lock: suspended)",
            remediation="resume or destroy it in Proxmox, then retry",
        )
    return Ownership("ours", vmid, node, config)
