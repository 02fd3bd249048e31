"""The simulated cluster: nodes, storages and their volumes, guests (pve-reference §8).

Plain data plus the few lookups every handler needs. Handlers change it under the engine's
lock; nothing here knows about HTTP. Two exception types carry Proxmox's answers out of the
handlers: ``SimError`` for a synchronous error response and ``TaskError`` for a task that ends
with ``TASK ERROR: <text>``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .access import Access
from .profiles import Profile
from .vmconfig import Config, Drive, config_digest, is_disk_key, parse_drive, render_config

GuestKind = Literal["qemu", "lxc"]


class SimError(Exception):
    """A Proxmox error response: status, the message (Proxmox appends ``\\n``), 400 ``errors``."""

    def __init__(self, status: int, message: str, errors: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.message = message
        self.errors = dict(errors) if errors else None
        super().__init__(f"{status} {message}")

    @classmethod
    def params(cls, errors: Mapping[str, str]) -> SimError:
        """pve-common ``raise_param_exc``: 400 ``Parameter verification failed.``."""
        return cls(400, "Parameter verification failed.", errors)


class TaskError(Exception):
    """A task ends with ``TASK ERROR: <text>`` (its ``exitstatus`` is ``<text>``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)


def config_missing(node: str, vmid: int, kind: GuestKind = "qemu") -> SimError:
    """pve-guest-common ``load_config`` on a missing guest (pve-reference §3.1)."""
    folder = "qemu-server" if kind == "qemu" else "lxc"
    return SimError(500, f"Configuration file 'nodes/{node}/{folder}/{vmid}.conf' does not exist")


# --- storage -------------------------------------------------------------------------------


@dataclass(eq=False)
class Volume:
    """One volume on a storage. ISO bytes are kept so the agent check can read the seed."""

    volname: str
    content: str  # images, iso, vztmpl, backup, rootdir
    format: str  # raw, qcow2, iso, subvol
    size: int
    ctime: int
    vmid: int | None = None
    parent: str | None = None  # linked clones: the base volume's name
    data: bytes | None = field(default=None, repr=False)
    installs_agent: bool | None = None  # seed ISOs: cached result of reading vendor-data


@dataclass(eq=False)
class Storage:
    """A storage as ``storage.cfg`` plus its volumes. Shared storages are one object on all
    nodes; the others exist once per node."""

    id: str
    type: str  # dir, lvmthin, rbd
    content: tuple[str, ...]  # in storage.cfg order, e.g. ("iso", "vztmpl", "backup")
    shared: bool
    total: int
    base_used: int = 0
    path: str | None = None  # dir storages: where uploads land
    volumes: dict[str, Volume] = field(default_factory=dict)

    def volid(self, volname: str) -> str:
        return f"{self.id}:{volname}"

    @property
    def used(self) -> int:
        return self.base_used + sum(v.size for v in self.volumes.values())

    @property
    def avail(self) -> int:
        return max(0, self.total - self.used)

    def next_disk_name(self, vmid: int, *, base: bool = False) -> str:
        """The first free ``vm-<vmid>-disk-<n>`` (pve-storage ``find_free_diskname``)."""
        taken = set(self.volumes)
        prefix = "base" if base else "vm"
        n = 0
        while True:
            name = f"{prefix}-{vmid}-disk-{n}"
            if self.type == "dir":
                name = f"{vmid}/{name}.qcow2"
            # Linked clones live as ``base-X-disk-0/vm-Y-disk-n``; their leaf counts as taken.
            if name not in taken and not any(t.endswith("/" + name) for t in taken):
                return name
            n += 1


# --- nodes ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Node:
    name: str
    index: int  # 1, 2, 3: drives addresses and stats
    storages: dict[str, Storage]
    online: bool = True
    boot_epoch: int = 0  # the node's boot time (Unix seconds): uptime and UPID pstart
    maxcpu: int = 16
    maxmem: int = 135089913856
    maxdisk: int = 100861726720
    ssl_fingerprint: str = ""
    next_pid: int = 0x1F0000
    bridges: tuple[str, ...] = ("vmbr0",)

    @property
    def address(self) -> str:
        return f"10.20.0.{10 + self.index}"


# --- guests --------------------------------------------------------------------------------


@dataclass(eq=False)
class Guest:
    """A QEMU VM or an LXC container.

    ``config`` holds the current values, ``pending`` and ``pending_delete`` the ``[PENDING]``
    section (pve-reference §7.12). Beyond Proxmox's view it carries what the simulated guest
    does: whether its image ships the guest agent (``agent_baked``, inherited by clones) or a
    seed's vendor-data installed it (``agent_installed``), and when it last booted.
    """

    vmid: int
    node: str
    kind: GuestKind
    config: Config
    pending: Config = field(default_factory=dict)
    pending_delete: dict[str, bool] = field(default_factory=dict)
    status: Literal["running", "stopped"] = "stopped"
    qmpstatus: str = "stopped"  # QMP run state while running: running, paused, prelaunch
    booted_at: float | None = None  # engine clock
    pid: int = 0
    agent_baked: bool = False
    agent_installed: bool = False
    # What else the guest's agent lists besides ``lo`` and one ``ethN`` per ``netN`` (docker0,
    # tun0...; pve-reference §7.19), in the agent's own shape; ``extra_first`` lists them before
    # the NICs; ``nic_ipv4`` false keeps the NICs on IPv6 only. Inherited by clones, like
    # ``agent_baked``: they come with the image.
    extra_interfaces: list[dict[str, Any]] = field(default_factory=list)
    extra_first: bool = False
    nic_ipv4: bool = True
    # What cloud-init does in the guest (seed 003's readiness; ``Control.set_cloud_init``):
    # ``done`` writes /run/cloud-init/result.json ``cloud_init_after`` seconds after the address
    # (None: the profile's ``cloud_init``), with ``cloud_init_errors`` in it; ``never`` never
    # writes it. Inherited by clones: tests script the template, like the interfaces.
    cloud_init_outcome: str = "done"
    cloud_init_after: float | None = None
    cloud_init_errors: list[str] = field(default_factory=list)
    ha_state: str | None = None  # None: not HA-managed
    created_at: float = 0.0  # engine clock, for pvestatd's first report
    temp: bool = False  # a clone target still holding the temporary config
    lock_holder: Any = None  # the running task holding the config file lock (a clone's)
    _digest: str | None = field(default=None, repr=False)
    # What ``/cluster/resources`` derives from the config alone, rebuilt after a write.
    listing: dict[str, object] | None = field(default=None, repr=False)

    # --- config -------------------------------------------------------------------------

    def changed(self) -> None:
        """Every write goes through here: the digest is the SHA-1 of the new file."""
        self._digest = None
        self.listing = None

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = config_digest(
                render_config(self.config, self.pending, self.pending_delete)
            )
        return self._digest

    def merged(self) -> Config:
        """The config with pending values applied and pending deletions removed (§7.11)."""
        if not self.pending and not self.pending_delete:
            return dict(self.config)
        out = {k: v for k, v in self.config.items() if k not in self.pending_delete}
        out.update(self.pending)
        return out

    @property
    def lock(self) -> str | None:
        lock = self.config.get("lock")
        return str(lock) if lock else None

    @property
    def name(self) -> str:
        key = "name" if self.kind == "qemu" else "hostname"
        name = self.config.get(key)
        if name:
            return str(name)
        return f"VM {self.vmid}" if self.kind == "qemu" else f"CT{self.vmid}"

    @property
    def is_template(self) -> bool:
        return str(self.config.get("template", 0)) == "1"

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def paused(self) -> bool:
        return self.running and self.qmpstatus in ("paused", "prelaunch", "suspended")

    def drives(self, config: Mapping[str, object] | None = None) -> Iterator[tuple[str, Drive]]:
        """Disk keys and their parsed values, sorted by key."""
        source = self.config if config is None else config
        for key in sorted(source):
            if is_disk_key(key) or (self.kind == "lxc" and (key == "rootfs" or key[:2] == "mp")):
                yield key, parse_drive(str(source[key]))

    def memory_mib(self) -> int:
        raw = str(self.config.get("memory", "512")).replace("current=", "").split(",")[0]
        return int(raw) if raw.isdigit() else 512

    def cpus(self) -> int:
        if "vcpus" in self.config:
            return int(self.config["vcpus"])
        return int(self.config.get("sockets", 1)) * int(self.config.get("cores", 1))


# --- the cluster ---------------------------------------------------------------------------


@dataclass(eq=False)
class Cluster:
    """Everything the simulator knows. One instance per engine; mutated under its lock."""

    profile: Profile
    rng: random.Random
    epoch0: float  # Unix time at clock0
    clock0: float
    nodes: dict[str, Node] = field(default_factory=dict)
    guests: dict[int, Guest] = field(default_factory=dict)
    nextid_range: tuple[int, int] = (100, 1000000)  # datacenter.cfg next-id: [lower, upper)
    access: Access = field(default_factory=Access)  # user.cfg: users, tokens, ACLs, pools
    _order: list[int] | None = field(default=None, repr=False)

    def wall(self, now: float) -> int:
        """Unix seconds at engine time ``now`` (UPID start times, ctime, meta)."""
        return int(self.epoch0 + (now - self.clock0))

    # --- guests -------------------------------------------------------------------------

    def add_guest(self, guest: Guest) -> None:
        self.guests[guest.vmid] = guest
        self._order = None

    def remove_guest(self, vmid: int) -> None:
        if self.guests.pop(vmid, None) is not None:
            self._order = None
            self.access.forget_vm(vmid)

    def discard_unfinished(self, guest: Guest, allocated: Sequence[tuple[Storage, str]]) -> None:
        """Undo a create or clone whose task failed: the volumes it allocated go, and the guest
        too while it is still the one that task added (a failed qmcreate or qmclone leaves
        neither the VM nor its disks)."""
        for storage, volname in allocated:
            storage.volumes.pop(volname, None)
        if self.guests.get(guest.vmid) is guest:
            self.remove_guest(guest.vmid)

    def guests_in_string_order(self) -> list[Guest]:
        """Guests sorted by the *string* of their VMID, as ``/cluster/resources`` lists them."""
        if self._order is None:
            self._order = sorted(self.guests, key=str)
        return [self.guests[v] for v in self._order]

    def guest(self, node: str, vmid: int, kind: GuestKind = "qemu") -> Guest:
        """The guest whose config file is ``nodes/<node>/<kind>/<vmid>.conf``, else 500."""
        guest = self.guests.get(vmid)
        if guest is None or guest.node != node or guest.kind != kind:
            raise config_missing(node, vmid, kind)
        return guest

    # --- storage ------------------------------------------------------------------------

    def storage(self, node: str, storage_id: str) -> Storage | None:
        found = self.nodes.get(node)
        return found.storages.get(storage_id) if found else None

    def volume(self, node: str, volid: str) -> tuple[Storage, Volume] | None:
        if ":" not in volid:
            return None
        sid, volname = volid.split(":", 1)
        storage = self.storage(node, sid)
        if storage is None or volname not in storage.volumes:
            return None
        return storage, storage.volumes[volname]
