"""A VM's hardware identity: its SMBIOS UUID and its vmgenid (seed 001, "Identity and actions").

Seed 001: "A numeric VMID can be reused", and identity is "the SMBIOS UUID and generation
UUID"; "changing either creates a different resource". Name and mark alone cannot tell our VM
from one restored from a backup of it or created again at the same VMID with our name and mark:
both carry the same description. Proxmox gives every VM it creates or clones a fresh
``smbios1`` uuid and, unless disabled, a fresh ``vmgenid`` (pve-reference §5.6 and §7.14), so
the pair recorded when a create makes or adopts the VM tells it apart from any later one.

Both come from ``GET .../config``, which every caller here reads anyway: no extra request.
A record made before identity was kept has none; the first read records it, and until then
only name and mark decide, as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import PermanentError

# ``vmgenid: 0`` disables the device (pve-reference §5.6): the VM then has no generation id.
_DISABLED = frozenset({"", "0"})


@dataclass(frozen=True)
class Identity:
    """The pair as Proxmox shows it, normalised to lower-case UUIDs; ``""`` when unknown.

    ``vmgenid`` is legitimately empty for a VM whose template disabled it; ``smbios_uuid`` is
    empty only for a VM not made by Proxmox's create or clone (both always add one).
    """

    smbios_uuid: str = ""
    vmgenid: str = ""

    @property
    def known(self) -> bool:
        return bool(self.smbios_uuid or self.vmgenid)

    def describe(self) -> str:
        return f"SMBIOS UUID {self.smbios_uuid or '(none)'}, vmgenid {self.vmgenid or '(none)'}"


def _uuid_or_empty(text: str) -> str:
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        return ""


def smbios_uuid(value: object) -> str:
    """The ``uuid=`` of an ``smbios1`` property string (pve-reference §5.6), lower-case."""
    if not isinstance(value, str):
        return ""
    for option in value.split(","):
        key, sep, val = option.partition("=")
        if sep and key.strip() == "uuid":
            return _uuid_or_empty(val)
    return ""


def identity_of(config: Mapping[str, object]) -> Identity:
    """The identity a VM's config shows."""
    raw_genid = str(config.get("vmgenid") or "").strip()
    genid = "" if raw_genid in _DISABLED else _uuid_or_empty(raw_genid)
    return Identity(smbios_uuid=smbios_uuid(config.get("smbios1")), vmgenid=genid)


class IdentityMismatch(PermanentError):
    """The VM at our VMID carries our name and mark but another identity: not ours.

    A distinct class of permanent failure: nothing is ever done to that VM (no stop, start,
    destroy or config write), and the proxy shows this message until an operator decides.
    ``kind`` stays ``permanent`` so every caller that stops on a permanent error stops here.
    """


MISMATCH_REMEDIATION = (
    "proxyhub leaves this VM alone: it was restored from a backup or created again at the "
    "same VMID. If it should not exist, remove it in Proxmox and retry the proxy (a new VM is "
    "created); if it is meant to be this proxy's VM, use the admin action \"Accept the VM "
    "found\" on the proxy, which records the VM's identity, then retry"
)


def check_identity(
    expected: Identity, config: Mapping[str, object], *, vmid: int, vm_name: str, op: str
) -> Identity:
    """The identity ``config`` shows, or ``IdentityMismatch`` when it is not ``expected``.

    An ``expected`` without any part (an old record) accepts whatever is found. A part recorded
    empty is compared too: a vmgenid appearing where there was none is another VM as well.
    """
    found = identity_of(config)
    if not expected.known or found == expected:
        return found
    raise IdentityMismatch(
        f"VM {vmid} ({vm_name}) carries this proxy's name and mark but is not the VM proxyhub "
        f"made: expected {expected.describe()}, found {found.describe()}",
        remediation=MISMATCH_REMEDIATION,
        op=op,
    )
