"""The simulator's control surface: what tests and benchmarks do to the cluster behind
proxyhub's back. Not part of Proxmox, and no token is needed.

Every public method is also reachable over HTTP: ``POST /_sim/<name>`` with a JSON object of
keyword arguments (``GET`` for the read-only ones: ``ledger``, ``faults``, ``info``, ``vm``,
with query parameters). The answer is ``{"data": <result>}``; a refused call is 400
``{"error": "<why>"}``.

Faults: ``error_rate`` (seeded), ``fail_call`` (the Nth matching call, deterministic),
``drop_reply`` (applied, then the connection resets), ``latency``. Cluster: ``node_offline``
/ ``node_online``. Guests: ``pause_vm``, ``resume_vm``, ``hibernate_vm`` (the ``suspended``
lock), ``set_lock``/``clear_lock``, ``remove_agent``, ``set_ha``, ``set_pool``, ``set_hookscript``,
``add_pending``, ``create_vms`` (bulk, for 10,000-VM benchmarks), ``recreate_vm`` (the same
VM made again at its VMID: a new SMBIOS UUID and vmgenid), ``set_guest_interfaces`` (what the
guest agent lists besides the NICs), ``set_cloud_init`` (when cloud-init reports done, with
which errors, or never). Tasks:
``fail_next_task``, ``tasks`` (every task's node, type and times, for the benchmarks' per-node
in-flight series). Permissions: ``deny``/``allow``. Time: ``advance`` (manual clock only).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from . import replies
from .access import Pool
from .clock import ManualClock
from .defaults import add_vm
from .engine import Engine
from .faults import LatencyRule
from .power import launch, power_off
from .protocol import SimRequest, SimResponse
from .simtasks import InjectedFailure
from .state import Guest
from .vmconfig import coerce

# Where the surface is served, beside the engine's /api2/json (simulator.py mounts it).
CONTROL_PREFIX = "/_sim/"


class ControlError(Exception):
    """A control call that cannot be done (unknown VM, bad argument)."""


_HTTP_POST = frozenset(
    {
        "reset",
        "error_rate",
        "fail_call",
        "drop_reply",
        "latency",
        "clear_faults",
        "node_offline",
        "node_online",
        "pause_vm",
        "resume_vm",
        "hibernate_vm",
        "set_lock",
        "clear_lock",
        "remove_agent",
        "set_guest_agent",
        "set_ha",
        "set_pool",
        "set_hookscript",
        "add_pending",
        "create_vms",
        "recreate_vm",
        "set_guest_interfaces",
        "set_cloud_init",
        "fail_next_task",
        "deny",
        "allow",
        "advance",
        "clear_ledger",
    }
)
_HTTP_GET = frozenset({"ledger", "faults", "info", "vm", "tasks"})


class Control:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # --- plumbing -----------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The engine's lock, with every task due by now completed first."""
        with self._engine.lock:
            self._engine.scheduler.advance(self._engine.clock())
            yield

    def _guest(self, vmid: int) -> Guest:
        guest = self._engine.cluster.guests.get(int(vmid))
        if guest is None:
            raise ControlError(f"no guest {vmid}")
        return guest

    def _node(self, node: str) -> Any:
        found = self._engine.cluster.nodes.get(node)
        if found is None:
            raise ControlError(f"no node {node!r}")
        return found

    # --- whole simulator ----------------------------------------------------------------

    def reset(self) -> None:
        """Back to the starting state; faults, denials, tasks and the ledger are cleared."""
        self._engine.reset()

    def info(self) -> dict[str, Any]:
        engine = self._engine
        with self._locked():
            return {
                "profile": engine.profile.name,
                "nodes": engine.node_names(),
                "tokenId": engine.token_id,
                "templateVmid": engine.default_template_vmid(),
                "manualClock": engine.manual_clock,
                "guests": len(engine.cluster.guests),
            }

    def advance(self, seconds: float) -> float:
        """Move the manual clock forward; tasks and boots due by then complete."""
        clock = self._engine.clock
        if not isinstance(clock, ManualClock):
            raise ControlError("advance needs the simulator's manual clock")
        now = clock.advance(float(seconds))
        self._engine.advance_tasks()
        return now

    # --- faults -------------------------------------------------------------------------

    def error_rate(
        self,
        rate: float,
        kind: str = "500",
        method: str | None = None,
        path: str | None = None,
        status: int | None = None,
        message: str | None = None,
        applied: bool = False,
    ) -> int:
        """Fail this fraction of matching calls (seeded: the same seed fails the same calls)."""
        with self._locked():
            rule = self._engine.faults.add(
                kind=kind,
                method=method,
                path=path,
                rate=float(rate),
                status=status,
                message=message,
                applied=applied,
            )
            return rule.id

    def fail_call(
        self,
        method: str | None,
        path: str | None,
        nth: int = 1,
        kind: str = "500",
        times: int = 1,
        status: int | None = None,
        message: str | None = None,
        applied: bool = False,
    ) -> int:
        """Fail the ``nth`` matching call from now on (and ``times - 1`` more after it)."""
        with self._locked():
            rule = self._engine.faults.add(
                kind=kind,
                method=method,
                path=path,
                nth=int(nth),
                times=int(times),
                status=status,
                message=message,
                applied=applied,
            )
            return rule.id

    def drop_reply(self, method: str | None, path: str | None, nth: int = 1) -> int:
        """The ``nth`` matching call is applied, then its connection resets: the reply is lost."""
        return self.fail_call(method, path, nth=nth, kind="drop")

    def latency(self, seconds: float, method: str | None = None, path: str | None = None) -> None:
        """Hold every matching answer back by ``seconds`` (real time)."""
        with self._locked():
            self._engine.faults.latency.append(LatencyRule(float(seconds), method, path))

    def clear_faults(self) -> None:
        with self._locked():
            self._engine.faults.clear()

    def faults(self) -> list[dict[str, Any]]:
        with self._locked():
            return [r.as_dict() for r in self._engine.faults.rules]

    # --- nodes --------------------------------------------------------------------------

    def node_offline(self, node: str) -> None:
        """The node stops answering: its requests get 595, its guests read ``unknown``."""
        with self._locked():
            self._node(node).online = False

    def node_online(self, node: str) -> None:
        with self._locked():
            self._node(node).online = True

    # --- guests -------------------------------------------------------------------------

    def vm(self, vmid: int) -> dict[str, Any]:
        """The simulator's own view of a guest (more than Proxmox shows)."""
        with self._locked():
            guest = self._guest(vmid)
            return {
                "vmid": guest.vmid,
                "node": guest.node,
                "kind": guest.kind,
                "status": guest.status,
                "qmpstatus": guest.qmpstatus,
                "config": dict(guest.config),
                "pending": dict(guest.pending),
                "pendingDelete": sorted(guest.pending_delete),
                "agentBaked": guest.agent_baked,
                "agentInstalled": guest.agent_installed,
                "haState": guest.ha_state,
                "pool": self._engine.cluster.access.pool_of(vmid),
                "bootedAt": guest.booted_at,
                "midClone": guest.temp,
            }

    def pause_vm(self, vmid: int) -> None:
        """QMP ``stop``: the VM stays ``running`` with ``qmpstatus: paused``."""
        with self._locked():
            guest = self._guest(vmid)
            if not guest.running:
                raise ControlError(f"VM {vmid} is not running")
            guest.qmpstatus = "paused"

    def resume_vm(self, vmid: int) -> None:
        with self._locked():
            guest = self._guest(vmid)
            if guest.running:
                guest.qmpstatus = "running"
                return
            if guest.lock == "suspended":
                guest.config.pop("lock", None)
                guest.config.pop("vmstate", None)
                guest.changed()
                launch(self._engine.cluster, guest, self._engine.now(), apply=False)

    def hibernate_vm(self, vmid: int) -> None:
        """Suspend to disk: stopped, ``lock: suspended`` and a ``vmstate`` volume."""
        with self._locked():
            guest = self._guest(vmid)
            guest.config["lock"] = "suspended"
            guest.config["vmstate"] = f"local-lvm:vm-{guest.vmid}-state-suspend-2026-01-01"
            guest.changed()
            power_off(guest)

    def set_lock(self, vmid: int, lock: str = "backup") -> None:
        """A lock held by somebody else's task (``backup``, ``migrate``, ``snapshot``...)."""
        with self._locked():
            guest = self._guest(vmid)
            guest.config["lock"] = lock
            guest.changed()

    def clear_lock(self, vmid: int) -> None:
        """``qm unlock``."""
        with self._locked():
            guest = self._guest(vmid)
            guest.config.pop("lock", None)
            guest.changed()

    def remove_agent(self, vmid: int) -> None:
        """Delete the ``agent`` key: the VM can never report an address (seed 000 entry 7)."""
        with self._locked():
            guest = self._guest(vmid)
            guest.config.pop("agent", None)
            guest.pending.pop("agent", None)
            guest.changed()

    def set_guest_agent(self, vmid: int, baked: bool = True) -> None:
        """Whether the guest's image ships the agent (clones made later inherit it)."""
        with self._locked():
            self._guest(vmid).agent_baked = bool(baked)

    def set_ha(self, vmid: int, managed: bool = True, state: str = "started") -> None:
        with self._locked():
            self._guest(vmid).ha_state = state if managed else None

    def set_pool(self, vmid: int, pool: str | None = None) -> None:
        """Put the guest in resource pool ``pool`` (created if new), or in none (``None``): what
        ``pvesh set /pools/<pool> --vms <vmid>`` does to user.cfg. A guest is in one pool at
        most, so it leaves its old pool first."""
        with self._locked():
            self._guest(vmid)
            access = self._engine.cluster.access
            access.forget_vm(vmid)
            if pool:
                access.pools.setdefault(str(pool), Pool()).vms.add(vmid)

    def set_hookscript(self, vmid: int, script: str = "local:snippets/hook.pl") -> None:
        with self._locked():
            guest = self._guest(vmid)
            guest.config["hookscript"] = script
            guest.changed()

    def add_pending(self, vmid: int, key: str, value: Any = None, delete: bool = False) -> None:
        """A change waiting for the next start (``cores`` on a running VM, say)."""
        with self._locked():
            guest = self._guest(vmid)
            if delete:
                guest.pending_delete[key] = False
            else:
                guest.pending[key] = coerce(guest.kind, key, value)
            guest.changed()

    def recreate_vm(self, vmid: int) -> dict[str, str]:
        """The VM destroyed and created again at its VMID with the same config (name, mark in
        the description, disks, NICs), as a re-create from a saved config or a restore from
        backup does behind proxyhub's back. Proxmox's create adds a fresh ``smbios1`` uuid and
        generates a ``vmgenid`` (pve-reference §5.6); the other ``smbios1`` fields are kept. The
        reference does not say whether ``qmrestore`` keeps them; this models the VM that must
        not be taken for the old one. The new VM is stopped. Returns the new identity."""
        with self._locked():
            guest = self._guest(vmid)
            if guest.kind != "qemu":
                raise ControlError(f"guest {vmid} is not a VM")
            rng = self._engine.cluster.rng
            kept = [
                part
                for part in str(guest.config.get("smbios1", "")).split(",")
                if part and not part.startswith("uuid=")
            ]
            smbios = ",".join([f"uuid={uuid.UUID(int=rng.getrandbits(128), version=4)}", *kept])
            genid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            power_off(guest)
            guest.config.pop("lock", None)
            guest.config["smbios1"] = smbios
            guest.config["vmgenid"] = genid
            guest.pending.clear()
            guest.pending_delete.clear()
            guest.changed()
            return {"smbios1": smbios, "vmgenid": genid}

    def set_guest_interfaces(
        self,
        vmid: int,
        interfaces: list[dict[str, Any]],
        first: bool = False,
        nic_ipv4: bool = True,
    ) -> None:
        """What the guest agent lists besides ``lo`` and the NICs (pve-reference §7.19 shape:
        ``name``, ``hardware-address``, ``ip-addresses`` of ``{ip-address, ip-address-type,
        prefix}``), e.g. ``docker0`` and ``tun0``; ``first`` lists them before the NICs;
        ``nic_ipv4`` false leaves the NICs with IPv6 only. Clones made later inherit it."""
        checked: list[dict[str, Any]] = []
        for item in interfaces:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ControlError("each interface needs a name")
            addresses = item.get("ip-addresses", [])
            if not isinstance(addresses, list) or not all(
                isinstance(a, dict) and a.get("ip-address-type") in ("ipv4", "ipv6")
                for a in addresses
            ):
                raise ControlError("ip-addresses: a list of {ip-address, ip-address-type, prefix}")
            checked.append(dict(item))
        with self._locked():
            guest = self._guest(vmid)
            guest.extra_interfaces = checked
            guest.extra_first = bool(first)
            guest.nic_ipv4 = bool(nic_ipv4)

    def set_cloud_init(
        self,
        vmid: int,
        outcome: str = "done",
        after: float | None = None,
        errors: list[str] | None = None,
    ) -> None:
        """What cloud-init does in the guest (seed 003's readiness): ``done`` writes
        ``/run/cloud-init/result.json`` without errors, ``errors`` with ``errors`` in it (a
        default one when none are given), ``never`` never writes it; ``after``: seconds from
        the address to the file (None: the profile's ``cloud_init``). Clones made later
        inherit it, so a test scripts the template before the create."""
        if outcome not in ("done", "errors", "never"):
            raise ControlError("outcome: one of done, errors, never")
        if after is not None and (
            isinstance(after, bool) or not isinstance(after, int | float) or after < 0
        ):
            raise ControlError("after: a number of seconds of at least 0, or null")
        found = list(errors or [])
        if not all(isinstance(e, str) for e in found):
            raise ControlError("errors: a list of texts")
        if outcome == "errors" and not found:
            found = [
                "('scripts_user', RuntimeError('Runparts: 1 failures (part-001) in 1 "
                "attempted commands'))"
            ]
        with self._locked():
            guest = self._guest(vmid)
            guest.cloud_init_outcome = "never" if outcome == "never" else "done"
            guest.cloud_init_after = None if after is None else float(after)
            guest.cloud_init_errors = found if outcome == "errors" else []

    def create_vms(
        self,
        count: int,
        start_vmid: int = 100000,
        node: str | None = None,
        name_prefix: str = "proxy-bench-",
        running: bool = False,
        description: str | None = None,
        tags: str | None = "proxyhub",
    ) -> list[int]:
        """Add ``count`` VMs at once (fast path for 10,000-VM benchmarks).

        Free VMIDs from ``start_vmid`` up; nodes round-robin unless ``node`` is given; disks on
        the shared ``vmstore``. ``description`` may use ``{vmid}``, ``{name}`` and ``{i}``.
        """
        engine = self._engine
        with self._locked():
            cluster = engine.cluster
            nodes = [node] if node else list(cluster.nodes)
            for name in nodes:
                self._node(name)
            now = engine.now()
            created: list[int] = []
            vmid = int(start_vmid)
            for i in range(int(count)):
                while vmid in cluster.guests:
                    vmid += 1
                name = f"{name_prefix}{vmid}"
                text = description.format(vmid=vmid, name=name, i=i) if description else None
                add_vm(
                    cluster,
                    vmid,
                    name,
                    nodes[i % len(nodes)],
                    storage="vmstore",
                    size_gib=3,
                    running=running,
                    now=now,
                    description=text,
                    tags=tags,
                )
                created.append(vmid)
                vmid += 1
            return created

    # --- tasks --------------------------------------------------------------------------

    def fail_next_task(
        self, task_type: str, message: str, node: str | None = None, applied: bool = False
    ) -> None:
        """The next task of ``task_type`` fails with ``message`` (a clone: ``clone failed:
        <message>``, its target removed). ``applied``: the effect happens anyway."""
        with self._locked():
            self._engine.scheduler.inject(
                InjectedFailure(task_type, message, node=node, applied=bool(applied))
            )

    def tasks(self, since: float | str | None = None) -> list[dict[str, Any]]:
        """Every task submitted at or after ``since`` (the engine's clock, as the ledger's
        ``time``), in submission order: node, type, when it was submitted, began (got one of
        the node's ``node_task_limit`` slots; ``None`` while queued) and ended."""
        floor = float(since) if since is not None else float("-inf")
        with self._locked():
            return [
                {
                    "upid": t.upid,
                    "node": t.node,
                    "type": t.type,
                    "submitted": t.submitted,
                    "startedAt": t.started_at,
                    "endedAt": t.ended_at,
                    "exitstatus": t.exitstatus,
                }
                for t in self._engine.scheduler.tasks.values()
                if t.submitted >= floor
            ]

    # --- permissions --------------------------------------------------------------------

    def deny(self, path: str, privilege: str) -> None:
        """Take ``privilege`` away on ``path`` and below (``*``: every privilege)."""
        with self._locked():
            self._engine.permissions.deny(path, privilege)

    def allow(self, path: str | None = None, privilege: str | None = None) -> None:
        with self._locked():
            self._engine.permissions.allow(path, privilege)

    # --- ledger and volumes -------------------------------------------------------------

    def ledger(self, method: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
        return [e.as_dict() for e in self._engine.ledger.calls(method, key)]

    def clear_ledger(self) -> None:
        self._engine.ledger.clear()

    def volume_data(self, node: str, volid: str) -> bytes | None:
        """The bytes of an uploaded volume (Python only: tests read back a seed ISO)."""
        with self._locked():
            found = self._engine.cluster.volume(node, volid)
            return None if found is None else found[1].data

    # --- HTTP ---------------------------------------------------------------------------

    def http(self, request: SimRequest) -> SimResponse:
        path = request.path.split("?", 1)[0]
        name = unquote(path[len(CONTROL_PREFIX) :]).strip("/")
        method = request.method.upper()
        allowed = _HTTP_GET if method == "GET" else _HTTP_POST if method == "POST" else set()
        if name not in allowed:
            return _control_error(404, f"no control call {method} {CONTROL_PREFIX}{name}")
        if method == "GET":
            kwargs: dict[str, Any] = dict(request.query)
        else:
            body = request.json_body if request.json_body is not None else dict(request.form)
            if not isinstance(body, dict):
                return _control_error(400, "the body must be a JSON object of arguments")
            kwargs = body
        fn: Callable[..., Any] = getattr(self, name)
        try:
            result = fn(**kwargs)
        except (ControlError, ValueError, TypeError, KeyError) as exc:
            return _control_error(400, str(exc))
        return replies.ok(result)


def _control_error(status: int, text: str) -> SimResponse:
    body = json.dumps({"error": text}).encode()
    return SimResponse(status, replies.reason_of(text), body, replies.JSON_TYPE)
