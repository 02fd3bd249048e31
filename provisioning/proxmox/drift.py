"""Drift: a proxy VM's cores, memory and net0 against what it was built with (issue 14).

The spec (``Spec``) is what the create wrote: the machine type's cores and memory, the cluster's
bridge and VLAN tag (only when the cluster sets them: without them the create leaves net0 as
the template made it, ``netcfg.rewrite_net0``, so they are nobody's to enforce), and net0's MAC
as the create found it.

What is compared is the config Proxmox returns by default, pending values merged in
(pve-reference §7.11): what the VM runs with from its next start. An out-of-band ``cores``
change on a running VM stays pending (§7.13) and is drift all the same.

The listing (``/cluster/resources``, §7.9) shows ``maxcpu`` (sockets x cores, capped at the
host's CPUs, or ``vcpus``) and ``maxmem`` of the *current* config for free: ``figures`` is
that pair as one short string, which reconcile compares with the spec's and with the pair it
saw at its last config read to decide whether a config read is worth its request. It cannot
show net0 or a pending change, which is why reconcile also reads each VM's config on a slow
rotation (``services.drift``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .api import Api
from .config import ProxmoxConfig
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import NotFoundError, ProxmoxError, TransientError, classify
from .identity import Identity, check_identity
from .ids import parse_provider_id
from .marks import parse_mark
from .netcfg import net0_mac, net0_option, rewrite_net0, with_mac
from .observe import SIZING_KEYS

MIB = 1024 * 1024


@dataclass(frozen=True)
class Spec:
    """What a proxy's VM was built with. ``bridge``/``vlan_tag`` None: not enforced; ``mac``
    blank: not known (a proxy from before it was recorded)."""

    cores: int
    memory_mib: int
    bridge: str | None = None
    vlan_tag: int | None = None
    mac: str = ""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Spec:
        """From ``to_record``'s form (the proxy's ``vm_spec``)."""
        tag = record.get("vlanTag")
        return cls(
            cores=int(record["cores"]),
            memory_mib=int(record["memoryMiB"]),
            bridge=record.get("bridge") or None,
            vlan_tag=int(tag) if tag is not None else None,
            mac=str(record.get("mac") or "").lower(),
        )

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"cores": self.cores, "memoryMiB": self.memory_mib}
        if self.bridge is not None:
            record["bridge"] = self.bridge
        if self.vlan_tag is not None:
            record["vlanTag"] = self.vlan_tag
        if self.mac:
            record["mac"] = self.mac
        return record

    def figures(self) -> str:
        """The listing's ``maxcpu``/``maxmem`` a VM built to this spec shows (one socket)."""
        return f"{self.cores}/{self.memory_mib * MIB}"


def spec_from_catalogue(config: ProxmoxConfig, machine_type: str, mac: str = "") -> Spec | None:
    """The spec the catalogue gives today, or None when the machine type is gone from it."""
    machine = config.machine_types.get(machine_type)
    if machine is None:
        return None
    return Spec(machine.cores, machine.memory_mib, config.bridge, config.vlan_tag, mac.lower())


def figures(entry: Mapping[str, Any]) -> str:
    """The listing entry's ``maxcpu``/``maxmem``, as ``Spec.figures`` writes them."""
    return f"{_int(entry.get('maxcpu'))}/{_int(entry.get('maxmem'))}"


@dataclass(frozen=True)
class Drift:
    """One field that differs: ``cores``, ``memory`` (MiB), ``net0.bridge``, ``net0.tag`` or
    ``net0.mac``; ``have`` is ``""`` when the VM has none."""

    field: str
    want: str
    have: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "want": self.want, "have": self.have}


def memory_mib(value: object) -> int | None:
    """``memory`` is ``[current=]<MiB>`` (§5.6); unset means Proxmox's default, 512."""
    if value is None or value == "":
        return 512
    text = str(value).split(",")[0].removeprefix("current=").strip()
    return int(text) if text.isdigit() else None


def config_drift(config: Mapping[str, Any], spec: Spec) -> list[Drift]:
    """Every field of ``spec`` the config (pending merged) does not hold, in a fixed order."""
    found: list[Drift] = []
    cores = str(config.get("cores", "1"))
    if cores != str(spec.cores):
        found.append(Drift("cores", str(spec.cores), cores))
    memory = memory_mib(config.get("memory"))
    if memory != spec.memory_mib:
        have = str(memory) if memory is not None else str(config.get("memory"))
        found.append(Drift("memory", str(spec.memory_mib), have))
    net0 = config.get("net0")
    if spec.bridge is not None and net0_option(net0, "bridge") != spec.bridge:
        found.append(Drift("net0.bridge", spec.bridge, net0_option(net0, "bridge")))
    if spec.vlan_tag is not None and net0_option(net0, "tag") != str(spec.vlan_tag):
        found.append(Drift("net0.tag", str(spec.vlan_tag), net0_option(net0, "tag")))
    have_mac = net0_mac(net0) or ""
    if spec.mac and have_mac != spec.mac:
        found.append(Drift("net0.mac", spec.mac, have_mac))
    return found


def repair_values(config: Mapping[str, Any], spec: Spec) -> dict[str, str]:
    """The config keys to write so that ``config`` holds ``spec``: only drifted keys, and net0
    rewritten in place (its model and every other option kept, as the create does)."""
    drifted = {d.field for d in config_drift(config, spec)}
    values: dict[str, str] = {}
    if "cores" in drifted:
        values["cores"] = str(spec.cores)
    if "memory" in drifted:
        values["memory"] = str(spec.memory_mib)
    if drifted & {"net0.bridge", "net0.tag", "net0.mac"}:
        net0 = rewrite_net0(
            str(config.get("net0") or ""), bridge=spec.bridge, vlan_tag=spec.vlan_tag
        )
        if spec.mac:
            net0 = with_mac(net0, spec.mac)
        values["net0"] = net0
    return values


def read_sizing(
    api: Api,
    provider_id: str,
    *,
    node: str,
    identity: Identity,
    deadline: Deadline | None = None,
) -> dict[str, str]:
    """One ``GET .../config`` of a VM the listing shows running and settled, for its drift
    alone: ``SIZING_KEYS`` of it. The VM is checked as ``observe.get`` checks it (name, mark,
    identity), so the drift of a VM that is not ours is never judged."""
    pid = parse_provider_id(provider_id)
    try:
        config = api.vm_config(node, pid.vmid, deadline=deadline)
        if config.get("lock"):
            raise TransientError(f"VM {pid.vmid} is locked ({config['lock']})", op="get")
        if config.get("name") != pid.name or not parse_mark(config.get("description")).managed:
            raise NotFoundError(f"VM {pid.vmid} is not {pid.name} of proxyhub any more", op="get")
        check_identity(identity, config, vmid=pid.vmid, vm_name=pid.name, op="get")
    except (ProxmoxError, Cancelled, DeadlineExceeded) as err:
        raise classify("get", err) from err
    return {k: config[k] for k in SIZING_KEYS if k in config}


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
