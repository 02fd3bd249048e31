"""Guest config values the way qemu-server stores and prints them (pve-reference §5).

Pure functions over strings: tags, ``netN``, drives, sizes, the boot order, and the config
file text whose SHA-1 is the ``digest``. The engine keeps config values typed as Proxmox's
JSON shows them: keys of schema type ``integer``/``boolean`` as numbers, everything else
(``memory`` included) as strings (pve-reference §1.2).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema import Schema, split_list

ConfigValue = int | str
Config = dict[str, ConfigValue]

# --- value types -----------------------------------------------------------------------------


@functools.cache
def numeric_keys(kind: str) -> frozenset[str]:
    """Config keys Proxmox returns as JSON numbers: schema type integer or boolean.

    Read from the ``returns`` of the official GET config schema, so ``memory`` (a property
    string since qemu-server 8.0.8) stays a string and ``cores`` is a number.
    """
    key = f"GET /nodes/{{node}}/{kind}/{{vmid}}/config"
    props = Schema.default().entry(key).get("returns", {}).get("properties", {})
    return frozenset(
        name for name, prop in props.items() if prop.get("type") in ("integer", "boolean")
    )


def coerce(kind: str, key: str, value: object) -> ConfigValue:
    """A parameter value (text) as the config stores it."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    if key in numeric_keys(kind):
        try:
            return int(str(value))
        except ValueError:
            return str(value)
    return str(value)


# --- tags (pve-reference §5.2) -------------------------------------------------------------


def normalise_tags(text: str) -> str:
    """pve-guest-common ``get_unique_tags``: lower-case, de-duplicated, sorted, ``;``-joined."""
    return ";".join(sorted({tag.lower() for tag in split_list(text)}))


# --- netN (pve-reference §5.3) ---------------------------------------------------------------

NET_MODELS = frozenset(
    {
        "e1000",
        "e1000-82540em",
        "e1000-82544gc",
        "e1000-82545em",
        "e1000e",
        "i82551",
        "i82557b",
        "i82559er",
        "ne2k_isa",
        "ne2k_pci",
        "pcnet",
        "rtl8139",
        "virtio",
        "vmxnet3",
    }
)
MAC_PREFIX = "BC:24:11"


def random_mac(rng: random.Random) -> str:
    """A MAC as Proxmox generates one: datacenter ``mac_prefix`` + random bytes, upper-case."""
    return MAC_PREFIX + "".join(f":{rng.randrange(256):02X}" for _ in range(3))


def parse_net(value: str) -> dict[str, str]:
    """``virtio=MAC,bridge=vmbr0`` / ``model=virtio,macaddr=..`` / ``virtio`` → keys."""
    out: dict[str, str] = {}
    for part in value.split(","):
        if not part:
            continue
        if "=" in part:
            key, val = part.split("=", 1)
            if key in NET_MODELS:
                out["model"] = key
                out["macaddr"] = val
            else:
                out[key] = val
        elif part in NET_MODELS:
            out["model"] = part
    return out


def print_net(net: Mapping[str, str]) -> str:
    """Canonical form: ``<model>=<MAC>`` first, the other keys alphabetically."""
    head = f"{net.get('model', 'virtio')}={net['macaddr'].upper()}"
    rest = [f"{k}={net[k]}" for k in sorted(net) if k not in ("model", "macaddr")]
    return ",".join([head, *rest])


def canonical_net(value: str, rng: random.Random) -> str:
    """What the update handler stores for a ``netN`` it receives: a MAC is generated if none."""
    net = parse_net(value)
    if not net.get("macaddr"):
        net["macaddr"] = random_mac(rng)
    return print_net(net)


def net_tag(net: Mapping[str, str]) -> int | None:
    tag = net.get("tag")
    return int(tag) if tag and tag.isdigit() else None


# --- drives (pve-reference §5.4) -------------------------------------------------------------

DISK_KEY = re.compile(r"(ide|sata|scsi|virtio)\d+|efidisk0|tpmstate0")
NET_KEY = re.compile(r"net\d+")
UNUSED_KEY = re.compile(r"unused(\d+)")


def is_disk_key(key: str) -> bool:
    return DISK_KEY.fullmatch(key) is not None


@dataclass
class Drive:
    """A drive value: the volume (or ``none``/``cdrom``) and its options."""

    volid: str
    opts: dict[str, str]

    @property
    def is_cdrom(self) -> bool:
        return self.opts.get("media") == "cdrom"

    @property
    def is_cloudinit(self) -> bool:
        return "cloudinit" in self.volid

    @property
    def storage(self) -> str | None:
        return self.volid.split(":", 1)[0] if ":" in self.volid else None

    @property
    def volname(self) -> str | None:
        return self.volid.split(":", 1)[1] if ":" in self.volid else None

    def print(self) -> str:
        """``<volid>[,key=value...]``, the volume first and the options alphabetically."""
        rest = [f"{k}={self.opts[k]}" for k in sorted(self.opts)]
        return ",".join([self.volid, *rest])


def parse_drive(value: str) -> Drive:
    volid = ""
    opts: dict[str, str] = {}
    for i, part in enumerate(value.split(",")):
        if not part:
            continue
        if "=" in part:
            key, val = part.split("=", 1)
            if key in ("file", "volume"):
                volid = val
            else:
                opts[key] = val
        elif i == 0:
            volid = part
    return Drive(volid, opts)


# --- sizes (pve-common JSONSchema.pm parse_size / format_size) -------------------------------

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:iB)?")


def parse_size(text: str) -> int | None:
    """``3G`` → bytes; no unit means bytes. ``None`` when unreadable."""
    m = _SIZE.fullmatch(text.strip())
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(size: int) -> str:
    """The largest exact binary unit: ``4M``, ``8G``, ``4712M``, raw bytes otherwise."""
    size = int(size)
    out = str(size)
    for unit in ("K", "M", "G", "T"):
        if size % 1024:
            return out
        size //= 1024
        out = f"{size}{unit}"
    return out


# --- boot order (pve-reference §5.5) ---------------------------------------------------------


def boot_order(boot: str | None) -> list[str] | None:
    """The devices of ``order=a;b`` or ``None`` for a legacy or missing ``boot``."""
    if not boot:
        return None
    for part in boot.split(","):
        if part.startswith("order="):
            return [d for d in part[len("order=") :].split(";") if d]
    return None


def print_boot_order(devices: list[str]) -> str:
    return "order=" + ";".join(devices)


# --- agent (pve-reference §5.6) --------------------------------------------------------------


def parse_agent(value: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in str(value).split(","):
        if not part:
            continue
        key, _, val = part.partition("=")
        if val == "" and "=" not in part:
            out["enabled"] = key
        else:
            out[key] = val
    return out


def agent_enabled(value: object) -> bool:
    return parse_agent(value).get("enabled", "0") in ("1", "true", "yes", "on")


# --- the config file and its digest (pve-reference §5.6 digest, §7.11) ----------------------

_UNSAFE_DESCRIPTION = re.compile(rb"[\x00-\x1f\x7f-\xff:%]")


def _encode_description_line(line: str) -> str:
    raw = line.encode("utf-8")
    return _UNSAFE_DESCRIPTION.sub(lambda m: f"%{m.group(0)[0]:02X}".encode(), raw).decode()


def _render_section(values: Mapping[str, Any]) -> str:
    out: list[str] = []
    descr = values.get("description")
    if descr is not None:
        if descr:
            out.extend("#" + _encode_description_line(line) + "\n" for line in descr.split("\n"))
        else:
            out.append("#\n")
    for key in sorted(values):
        if key == "description":
            continue
        out.append(f"{key}: {values[key]}\n")
    return "".join(out)


def render_config(
    config: Mapping[str, ConfigValue],
    pending: Mapping[str, ConfigValue] | None = None,
    pending_delete: Mapping[str, bool] | None = None,
) -> str:
    """The raw ``<vmid>.conf`` text: description as ``#`` lines, keys sorted, ``[PENDING]``.

    Same layout as qemu-server ``write_vm_config``; for the clone's temporary file it yields
    ``# qmclone temporary file\\nlock: clone\\n``, whose SHA-1 is the digest a real node shows
    mid-clone (examples/qemu_config_midclone.json).
    """
    text = _render_section(config)
    section: dict[str, Any] = dict(pending or {})
    if pending_delete:
        section["delete"] = ",".join(
            ("!" if force else "") + k for k, force in pending_delete.items()
        )
    if section:
        text += "\n[PENDING]\n" + _render_section(section)
    return text


def config_digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()  # noqa: S324 - Proxmox's digest is SHA-1
