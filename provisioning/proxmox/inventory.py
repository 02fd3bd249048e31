"""A read-only snapshot of every guest on a cluster, from one listing (issue 14, seed 001's
bounded inventory).

One ``GET /cluster/resources?type=vm`` gives every field but ownership (pve-reference §7.9:
``name``, ``vmid``, ``node``, ``type``, ``status``, ``lock``, ``tags``, ``hastate``,
``template``, ``pool``). The listing does not carry the description, and the mark that says
whose a proxy is lives only there (``marks``). So ownership is decided this way:

1. **From the listing alone, no read**: a guest that is not a GC candidate (seed 000 entry 12,
   ``observe.is_candidate``: a container, a template, a nameless clone in progress, or a VM
   neither named ``proxy-*`` nor tagged ``proxyhub``) is ``foreign``. proxyhub names every VM
   ``proxy-<name>`` and tags it ``proxyhub``; a VM of ours that lost both is not one proxyhub
   would recognise anywhere else either.
2. **From an earlier read**: a candidate whose VMID and name are those of a guest whose mark
   was read in an earlier snapshot keeps that verdict (``known``), as long as it cannot have
   been replaced since: it was running then and has run without a break since (the listing's
   ``uptime`` covers the time since that snapshot), or it was stopped (or paused) then and
   still is. A mark is written in the clone call and never moved afterwards
   (``marks.complete_mark`` only fills in a missing uid or installation), so a steady cluster
   costs no read at all; a guest that started, stopped or restarted since is read again, which
   is how a VM destroyed and re-created at the same VMID and name is found out. The one case
   left is a guest destroyed and re-created *and left stopped* between two snapshots: it keeps
   the old verdict until it first runs. The snapshot is for people, so that gap is said in
   the operator guide rather than closed with a read of every stopped guest on every refresh.
3. **One config read** (``GET /nodes/{node}/qemu/{vmid}/config``) for each other candidate:
   a mark with ``proxyhub-managed=true`` and this installation's id is ``this``; any other
   managed mark (another installation, or a mark older than the installation line) is
   ``other``; no mark is ``foreign``. Reads are bounded by the rows kept (at most ``limit``).
4. A candidate whose config could not be read (its node does not answer, it vanished between
   the listing and the read) is kept with owner ``foreign`` and ``mark_read`` False: not proven
   to be anyone's proxy. The next refresh reads it again.

The snapshot is for people: nothing in proxyhub acts on it (GC and reconcile read the mark
themselves, under their own rules).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from .api import Api
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import ProxmoxError, classify
from .marks import parse_mark, split_tags
from .observe import is_candidate

log = logging.getLogger("proxyhub.proxmox.provider")

Owner = Literal["this", "other", "foreign"]
OWNERS: tuple[Owner, ...] = ("this", "other", "foreign")

# Seed 001: "The local inventory limit is 4096 definitions."
INVENTORY_LIMIT = 4096


@dataclass(frozen=True)
class InventoryGuest:
    """One guest as the listing shows it, with its owner (see the module docstring)."""

    vmid: int
    name: str
    node: str
    type: str
    status: str
    lock: str = ""
    tags: tuple[str, ...] = ()
    hastate: str = ""
    template: bool = False
    pool: str = ""
    owner: Owner = "foreign"
    # Whether ``owner`` rests on the mark (read now or earlier) rather than the listing alone.
    mark_read: bool = False


@dataclass(frozen=True)
class Remembered:
    """Rule 2's memory of one guest: the owner its mark gave, the status it had in that
    snapshot, and how long ago that snapshot was taken."""

    owner: Owner
    status: str
    seconds_ago: float


@dataclass(frozen=True)
class Inventory:
    """One cluster's snapshot. ``listed`` counts every guest in the listing; ``guests`` holds
    at most ``limit`` of them (the lowest VMIDs), and ``truncated`` says when some were left
    out. ``mark_reads`` counts the config reads made, ``unread`` the candidates whose mark
    could not be read."""

    guests: tuple[InventoryGuest, ...]
    listed: int
    truncated: bool
    mark_reads: int
    unread: int


def parse_guest(entry: Mapping[str, Any]) -> InventoryGuest:
    """The fields of one ``/cluster/resources`` guest entry (pve-reference §7.9).

    A nameless entry (a clone before pvestatd's first pass) keeps an empty name; ``template``
    is a 0/1 number and absent before the first pass; ``lock``, ``tags``, ``pool`` and
    ``hastate`` are present only when set."""
    return InventoryGuest(
        vmid=int(entry["vmid"]),
        name=str(entry.get("name") or ""),
        node=str(entry.get("node") or ""),
        type=str(entry.get("type") or ""),
        status=str(entry.get("status") or "unknown"),
        lock=str(entry.get("lock") or ""),
        tags=tuple(split_tags(entry.get("tags"))),
        hastate=str(entry.get("hastate") or ""),
        template=bool(int(entry.get("template") or 0)),
        pool=str(entry.get("pool") or ""),
    )


def owner_of_mark(description: str | None, installation_id: str) -> Owner:
    """Rule 3: whose proxy the description's mark says this is."""
    mark = parse_mark(description)
    if not mark.managed:
        return "foreign"
    return "this" if mark.installation == installation_id else "other"


def read_inventory(
    api: Api,
    *,
    installation_id: str,
    known: Mapping[tuple[int, str], Remembered] | None = None,
    limit: int = INVENTORY_LIMIT,
    deadline: Deadline | None = None,
) -> Inventory:
    """One listing of the cluster's guests, plus a config read for each proxy-like guest whose
    owner ``known`` does not already give (``(vmid, name) -> Remembered`` from an earlier
    snapshot, rule 2).

    The listing failing fails the call (classified as ``list``); one guest's read failing only
    leaves that guest unread (rule 4), unless the deadline ended."""
    try:
        listing = api.cluster_resources(type="vm", deadline=deadline)
    except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
        raise classify("list", err) from err
    entries = sorted(
        (e for e in listing if e.get("type") in ("qemu", "lxc") and "vmid" in e),
        key=lambda e: int(e["vmid"]),
    )
    kept = entries[: max(0, limit)]
    known = known or {}
    guests: list[InventoryGuest] = []
    reads = unread = 0
    for entry in kept:
        guest = parse_guest(entry)
        if not is_candidate(entry):
            guests.append(guest)
            continue
        earlier = known.get((guest.vmid, guest.name))
        if earlier is not None and unchanged_since(entry, earlier):
            guests.append(_owned(guest, earlier.owner))
            continue
        reads += 1
        try:
            config = api.vm_config(guest.node, guest.vmid, deadline=deadline)
        except (Cancelled, DeadlineExceeded) as err:
            raise classify("list", err) from err
        except ProxmoxError as err:
            unread += 1
            log.info(
                "proxmox inventory mark unread",
                extra={"vmid": guest.vmid, "node": guest.node, "reason": str(err)},
            )
            guests.append(guest)
            continue
        guests.append(_owned(guest, owner_of_mark(config.get("description"), installation_id)))
    log.info(
        "proxmox inventory read",
        extra={
            "listed": len(entries),
            "kept": len(guests),
            "mark_reads": reads,
            "unread": unread,
        },
    )
    return Inventory(
        guests=tuple(guests),
        listed=len(entries),
        truncated=len(entries) > len(kept),
        mark_reads=reads,
        unread=unread,
    )


def unchanged_since(entry: Mapping[str, Any], earlier: Remembered) -> bool:
    """Rule 2: whether the listed guest is, beyond doubt, the one whose mark was read then."""
    status = str(entry.get("status") or "unknown")
    if status != earlier.status:
        return False
    if status != "running":
        return True
    return float(entry.get("uptime") or 0) >= earlier.seconds_ago


def _owned(guest: InventoryGuest, owner: Owner) -> InventoryGuest:
    return replace(guest, owner=owner, mark_read=True)
