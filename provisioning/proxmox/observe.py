"""Reading what Proxmox holds: get (seed 000 entries 7 and 9), list (entry 12), orphan seeds.

None of these write. ``get`` and ``list_managed`` accept a ``/cluster/resources`` listing the
caller already has, so a reconcile round makes one listing per cluster for all its proxies.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from .addresses import pick_address
from .api import Api
from .config import ProxmoxConfig
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import ApiError, NotFoundError, ProxmoxError, TransientError, classify
from .identity import Identity, check_identity
from .ids import format_provider_id, parse_provider_id
from .marks import TAG, has_tag, parse_mark
from .netcfg import net0_mac
from .ownership import is_missing
from .seed import installation_tag, parse_seed_name

log = logging.getLogger("proxyhub.proxmox.provider")

State = Literal["Running", "Provisioning", "Stopped"]

# Agent answers of entry 7 (pve-reference §3.3), matched in this order: the last is a suffix
# of the first.
_AGENT_NOT_RUNNING = "QEMU guest agent is not running"
_NO_AGENT = "No QEMU guest agent configured"
_VM_NOT_RUNNING = re.compile(r"^VM [0-9]+ is not running$")


@dataclass(frozen=True)
class Instance:
    """A VM of ours as Proxmox shows it.

    ``state`` is ``Running`` only with an address (DESIGN.md §4's phases are derived from it).
    ``uid``, ``created_at`` and ``installation`` come from the description mark on every read,
    ``smbios_uuid`` and ``vmgenid`` from the config (seed 001's identity, ``identity.py``).
    """

    provider_id: str
    vmid: int
    name: str
    node: str
    state: State
    ip: str | None = None
    uid: str = ""
    created_at: datetime | None = None
    installation: str = ""
    status: str = ""
    qmpstatus: str = ""
    lock: str | None = None
    agent: str = ""
    smbios_uuid: str = ""
    vmgenid: str = ""
    # The config keys drift is measured on (``drift.config_drift``), from the config read this
    # get made anyway; None when no config was read (the boot watch), so no drift is judged.
    sizing: Mapping[str, str] | None = field(default=None, hash=False)


# What ``Instance.sizing`` keeps of a config; ``digest`` too, so the proxy's stored config
# digest is refreshed wherever drift reads the config (issue 14, seed 001).
SIZING_KEYS = ("cores", "memory", "net0", "digest")


def map_state(status: str, qmpstatus: str) -> State | None:
    """Entry 9's ``status/current`` rows: None means "the agent decides"."""
    if status != "running":
        return "Stopped"
    if qmpstatus == "running":
        return None
    if qmpstatus == "prelaunch":
        return "Provisioning"
    return "Stopped"


def get(
    api: Api,
    provider_id: str,
    *,
    listing: Sequence[Mapping[str, Any]] | None = None,
    node: str | None = None,
    identity: Identity | None = None,
    deadline: Deadline | None = None,
) -> Instance:
    """Entry 9, in its order; the first matching row decides.

    ``identity``: the SMBIOS UUID and vmgenid recorded for the VM (seed 001). A VM with our
    name and mark but another identity raises ``IdentityMismatch`` (permanent): it is not
    ours, and it is not gone either, so nobody may create, start or destroy anything over it.

    ``node``: the VM's node when the caller knows it (a VM it just started). The listing is
    then skipped, which on a big cluster is most of the cost of polling one VM's boot. The
    node's own config answers the rows the listing entry would have: a lock is transient, a
    node that does not answer fails the read (transient). A VM that is not on that node any
    more ("does not exist" there) is looked up in the listing after all, since the ID is
    location-free so that a migrated VM stays addressable (entry 1); only a VM the listing
    lacks is not found.

    Every instance returned is logged as "proxmox vm fetched" with its state, address and uid
    (entry 20), whichever row decided it.
    """
    instance = _read(
        api, provider_id, listing=listing, node=node, identity=identity, deadline=deadline
    )
    return log_fetched(instance)


def log_fetched(instance: Instance) -> Instance:
    """Seed 000 entry 20's line for every instance a read returns, whichever read it was."""
    log.info(
        "proxmox vm fetched",
        extra={
            "vmid": instance.vmid,
            "vm_name": instance.name,
            "node": instance.node,
            "state": instance.state,
            "ip": instance.ip,
            "uid": instance.uid,
        },
    )
    return instance


def _read(
    api: Api,
    provider_id: str,
    *,
    listing: Sequence[Mapping[str, Any]] | None,
    node: str | None,
    identity: Identity | None,
    deadline: Deadline | None,
) -> Instance:
    """``get`` without its log line."""
    pid = parse_provider_id(provider_id)
    hinted = listing is None and bool(node)
    try:
        if hinted:
            listing = [{"vmid": pid.vmid, "node": node, "type": "qemu"}]
        if listing is None:
            listing = api.cluster_resources(deadline=deadline)
        entry = next((e for e in listing if int(e.get("vmid", -1)) == pid.vmid), None)
        if entry is None or entry.get("type") != "qemu":
            raise NotFoundError(f"VM {pid.vmid} ({pid.name}) does not exist", op="get")
        node = str(entry.get("node", ""))
        lock = entry.get("lock")
        if lock and lock != "suspended":
            raise TransientError(f"VM {pid.vmid} is locked ({lock})", op="get")
        if entry.get("status") == "unknown":
            raise TransientError(
                f"VM {pid.vmid} is on node {node}, which does not answer", op="get"
            )
        try:
            config = api.vm_config(node, pid.vmid, deadline=deadline)
        except ApiError as err:
            if hinted and is_missing(err):
                # Moved since the hint, or gone: the listing tells.
                return _read(
                    api,
                    provider_id,
                    listing=None,
                    node=None,
                    identity=identity,
                    deadline=deadline,
                )
            raise classify("get", err) from err
        if config.get("lock") and config["lock"] != "suspended":
            raise TransientError(f"VM {pid.vmid} is locked ({config['lock']})", op="get")
        if config.get("name") != pid.name:
            log.info(
                "proxmox vmid reused",
                extra={"vmid": pid.vmid, "vm_name": pid.name, "found": config.get("name")},
            )
            raise NotFoundError(
                f"VM {pid.vmid} is now {config.get('name')!r}, not {pid.name}: ours is gone",
                op="get",
            )
        mark = parse_mark(config.get("description"))
        if not mark.managed:
            log.info("proxmox vm not ours", extra={"vmid": pid.vmid, "vm_name": pid.name})
            raise NotFoundError(f"VM {pid.vmid} ({pid.name}) carries no proxyhub mark", op="get")
        found = check_identity(
            identity or Identity(), config, vmid=pid.vmid, vm_name=pid.name, op="get"
        )
        base = Instance(
            provider_id=provider_id,
            vmid=pid.vmid,
            name=pid.name,
            node=node,
            uid=mark.uid,
            created_at=mark.created_at,
            installation=mark.installation,
            agent=config.get("agent", ""),
            state="Stopped",
            smbios_uuid=found.smbios_uuid,
            vmgenid=found.vmgenid,
            sizing={k: config[k] for k in SIZING_KEYS if k in config},
        )
        if config.get("lock") == "suspended" or lock == "suspended":
            return replace(base, lock="suspended", status="stopped")
        status = api.vm_status(node, pid.vmid, deadline=deadline)
        st, qmp = str(status.get("status", "")), str(status.get("qmpstatus", ""))
        mapped = map_state(st, qmp)
        if mapped is not None:
            return replace(base, state=mapped, status=st, qmpstatus=qmp)
        state, ip = agent_state(
            api, node, pid.vmid, mac=net0_mac(config.get("net0")), deadline=deadline
        )
        return replace(base, state=state, ip=ip, status=st, qmpstatus=qmp)
    except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
        raise classify("get", err) from err


def agent_state(
    api: Api, node: str, vmid: int, *, mac: str | None, deadline: Deadline | None = None
) -> tuple[State, str | None]:
    """Entry 7's agent table for a VM that runs. ``mac``: net0's, the only interface whose
    address counts (``addresses.pick_address``)."""
    try:
        interfaces = api.agent_network_interfaces(node, vmid, deadline=deadline)
    except ApiError as err:
        if err.status == 500:
            if _AGENT_NOT_RUNNING in err.message:
                return "Provisioning", None
            if _NO_AGENT in err.message:
                # This VM can never report an address: Stopped, so it gets replaced.
                return "Stopped", None
            if _VM_NOT_RUNNING.match(err.message):
                raise TransientError(f"VM {vmid} stopped while being read", op="get") from err
        # The table's last row, "anything else: cannot tell", is transient: not the general
        # classifier's 403-is-permanent or does-not-exist-is-gone. The status read just before
        # found the VM; an agent answer says nothing certain about the VM or the token.
        raise TransientError(
            f"the guest agent of VM {vmid} answered {err.status} {err.message}",
            remediation="the next read asks again; if this lasts, check the guest agent in the "
            "VM and that the token may use it (VM.Monitor)",
            op="get",
        ) from err
    ip = pick_address(interfaces, mac=mac)
    return ("Running", ip) if ip else ("Provisioning", None)


@dataclass(frozen=True)
class ManagedVM:
    """A managed VM of this installation, as GC reads it (entry 12)."""

    provider_id: str
    vmid: int
    name: str
    node: str
    uid: str
    created_at: datetime | None


def is_candidate(entry: Mapping[str, Any]) -> bool:
    """Entry 12: qemu, not a template, named ``proxy-*`` or tagged ``proxyhub``; named at all."""
    if entry.get("type") != "qemu" or int(entry.get("template") or 0):
        return False
    name = entry.get("name")
    if not name:
        return False  # a clone in progress: its create is live and younger than any min age
    return str(name).startswith("proxy-") or has_tag(entry.get("tags"), TAG)


def list_managed(
    api: Api,
    config: ProxmoxConfig,
    *,
    listing: Sequence[Mapping[str, Any]] | None = None,
    skip_names: Collection[str] = frozenset(),
    deadline: Deadline | None = None,
) -> list[ManagedVM]:
    """Managed VMs of this installation only: one listing plus one config read per candidate.

    ``skip_names`` are VM names the caller has already settled from what it knows (GC: the
    names of live proxies, which are never garbage whatever their mark says); their config is
    not read and they are not returned, so a healthy fleet costs the listing alone.

    The listing failing fails the call; a candidate whose config cannot be read is skipped
    and logged (a node down, a VM destroyed mid-sweep), unless the deadline ended.
    """
    if listing is None:
        try:
            listing = api.cluster_resources(deadline=deadline)
        except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
            raise classify("list", err) from err
    found: list[ManagedVM] = []
    candidates = [e for e in listing if is_candidate(e) and str(e["name"]) not in skip_names]
    for entry in candidates:
        vmid, node, name = int(entry["vmid"]), str(entry["node"]), str(entry["name"])
        try:
            vm_config = api.vm_config(node, vmid, deadline=deadline)
        except (Cancelled, DeadlineExceeded) as err:
            raise classify("list", err) from err
        except ProxmoxError as err:
            log.info(
                "proxmox candidate skipped", extra={"vmid": vmid, "node": node, "reason": str(err)}
            )
            continue
        mark = parse_mark(vm_config.get("description"))
        if not mark.managed or mark.installation != config.installation_id:
            continue
        found.append(
            ManagedVM(format_provider_id(vmid, name), vmid, name, node, mark.uid, mark.created_at)
        )
    log.info("proxmox vms listed", extra={"candidates": len(candidates), "managed": len(found)})
    return found


@dataclass(frozen=True)
class SeedVolume:
    """A ``proxy-*-seed.iso`` on the ISO storage of one node. ``installation_tag`` and
    ``uid_tag`` are what its name says (``seed.seed_iso_name``); both are empty for a seed of
    the legacy form, which names no installation."""

    node: str
    volid: str
    vm_name: str
    ctime: int | None
    size: int | None
    installation_tag: str = ""
    uid_tag: str = ""


def list_seeds(
    api: Api, config: ProxmoxConfig, *, deadline: Deadline | None = None
) -> list[SeedVolume]:
    """Every seed ISO on ``isoStorage`` of every configured node, of any installation and of
    either name form (nodes that fail are skipped)."""
    seeds: list[SeedVolume] = []
    for node in config.nodes:
        try:
            items = api.storage_content(node, config.iso_storage, content="iso", deadline=deadline)
        except (Cancelled, DeadlineExceeded) as err:
            raise classify("list", err) from err
        except ProxmoxError as err:
            log.info("proxmox seed listing skipped", extra={"node": node, "reason": str(err)})
            continue
        for item in items:
            filename = str(item.get("volid", "")).split("/", 1)[-1]
            parsed = parse_seed_name(filename)
            if parsed is not None:
                seeds.append(
                    SeedVolume(
                        node,
                        str(item["volid"]),
                        parsed.vm_name,
                        _int_or_none(item.get("ctime")),
                        _int_or_none(item.get("size")),
                        parsed.installation_tag,
                        parsed.uid_tag,
                    )
                )
    return seeds


def orphan_seeds(
    seeds: Iterable[SeedVolume], listing: Sequence[Mapping[str, Any]], *, installation_id: str
) -> list[SeedVolume]:
    """This installation's seeds that no VM in the cluster is named for.

    Only seeds whose name carries this installation's tag are candidates (issue 11): another
    installation's are never touched, and a legacy ``<vm name>-seed.iso`` cannot be attributed
    to anyone, so GC leaves it for an operator. Any VM of the name keeps a seed, of any
    installation: names are in the listing, so this costs nothing, and a seed a VM may still
    boot from must never go."""
    ours = installation_tag(installation_id)
    names = {str(e.get("name")) for e in listing if e.get("name")}
    return [s for s in seeds if s.installation_tag == ours and s.vm_name not in names]


def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
