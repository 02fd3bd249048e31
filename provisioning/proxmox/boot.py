"""Watching a VM this create just started boot to its address, one agent read per look.

``observe.get`` decides a VM's state from scratch (seed 000 entry 9): config (name and mark),
``status/current``, then the guest agent, three reads a look. Right after a create that is
mostly known (issue 12: keep what the last observation says): the create cloned the VM, wrote
its mark, read its config (``net0``'s MAC is in the record) and saw it running. What can change
is the boot, so a look reads the agent alone:

* an interface with ``net0``'s MAC and a usable IPv4: Running at that address. Proxmox drew the
  MAC at random for this clone, so a VM answering with it is this VM, running (the agent answers
  only from a running guest);
* that interface without IPv4 yet, or "QEMU guest agent is not running" (entry 7's table): still
  Provisioning, nothing decided, look again;
* anything else (the VM stopped, gone, moved, another VM at the VMID, no agent configured, an
  answer without our MAC): not settled here, and ``observe.get`` reads it all, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from .addresses import pick_address
from .api import Api
from .deadline import Deadline
from .errors import ApiError, ProxmoxError
from .ids import parse_provider_id
from .observe import Instance, log_fetched

_AGENT_NOT_RUNNING = "QEMU guest agent is not running"


def observe_boot(
    api: Api,
    provider_id: str,
    record: Mapping[str, Any],
    *,
    uid: str,
    installation: str,
    deadline: Deadline | None = None,
) -> Instance | None:
    """The VM's state from one agent read, or None when only a full ``get`` can tell.

    ``record`` is the create's step record: its ``vmid``, ``node``, ``mac`` (net0's, from the
    configure step) and ``created_at`` (the mark the clone wrote). A record without them (an
    adopted VM, a record of an older version) is never settled here."""
    mac, created, node = record.get("mac"), record.get("created_at"), record.get("node")
    pid = parse_provider_id(provider_id)
    if not (mac and created and node) or record.get("vmid") != pid.vmid:
        return None
    base = Instance(
        provider_id=provider_id,
        vmid=pid.vmid,
        name=pid.name,
        node=str(node),
        state="Provisioning",
        uid=uid,
        created_at=datetime.strptime(str(created), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
        installation=installation,
        status="running",
        qmpstatus="running",
        agent="1",
    )
    try:
        interfaces = api.agent_network_interfaces(str(node), pid.vmid, deadline=deadline)
    except ApiError as err:
        if err.status == 500 and _AGENT_NOT_RUNNING in err.message:
            return log_fetched(base)
        return None
    except ProxmoxError:
        return None
    ours = [
        i
        for i in interfaces
        if isinstance(i, Mapping) and str(i.get("hardware-address", "")).upper() == str(mac).upper()
    ]
    if not ours:
        return None
    # Seed 003's readiness rule: only an IPv4 of net0's interface counts.
    ip = pick_address(ours, mac=str(mac))
    return log_fetched(replace(base, state="Running", ip=ip) if ip else base)
