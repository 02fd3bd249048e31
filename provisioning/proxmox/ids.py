"""Identity on Proxmox: the VMID a proxy gets, its VM name and its provider id.

Seed 000 entry 2: Proxmox addresses VMs by VMID and ``name`` is only a label, so the VMID is
derived from the proxy's UID. A retry after a crash lands on the same number (attempt 0) and
finds, waits for and adopts its own VM instead of cloning a second one.

Seed 000 entry 1: the provider id ``vms/<vmid>/<name>`` carries no node (a VM may migrate; the
node is looked up in ``/cluster/resources`` on every call) and carries the name, so a VM that
later received the same VMID is told apart from ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID

from .errors import PermanentError

FNV64_OFFSET_BASIS = 14695981039346656037
FNV64_PRIME = 1099511628211
_MASK64 = (1 << 64) - 1

# Seed 000 entry 2: Create probes attempt 0, 1, ... and gives up (transient) after this many.
MAX_ATTEMPTS = 32

# pve-reference §5.1 ``pve-vmid``: 100 to 999 999 999, written without leading zeros.
VMID_MIN = 100
VMID_MAX = 999_999_999
_VMID_TEXT = re.compile(r"[1-9][0-9]{2,8}")

# DESIGN §2: ``Proxy.name`` is a DNS label of at most 57 characters, so ``proxy-<name>`` stays
# a valid 63-character label and a valid Proxmox ``dns-name`` (pve-reference §5.1).
VM_NAME_PREFIX = "proxy-"
PROXY_NAME_MAX = 57
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")

_PROVIDER_ID_SHAPE = "vms/<vmid>/<name>"
# A malformed id is echoed in the error so the operator can find it; a huge one is cut short.
_ECHO_MAX = 120


def fnv1a64(data: str) -> int:
    """FNV-1a, 64 bits, over the UTF-8 bytes of ``data`` (the seed's ``fnv1a64``)."""
    value = FNV64_OFFSET_BASIS
    for byte in data.encode("utf-8"):
        value ^= byte
        value = (value * FNV64_PRIME) & _MASK64
    return value


def canonical_uid(uid: UUID | str) -> str:
    """The UID's canonical text: lower-case, hyphenated (what the hash is computed over).

    Accepting a ``str`` and normalising it means ``"ABCD..."`` and ``UUID("abcd...")`` give
    the same VMID; anything that is not a UUID is a programming error (``ValueError``).
    """
    return str(uid if isinstance(uid, UUID) else UUID(uid))


def vmid_for(uid: UUID | str, attempt: int, vmid_min: int, vmid_max: int) -> int:
    """The VMID probed at ``attempt`` for the proxy ``uid`` (seed 000 entry 2).

    ``min + (fnv1a64(uid) + attempt) mod (max - min + 1)``: consecutive attempts walk
    consecutive VMIDs (wrapping inside the range), so attempt 0 of a retry is the VMID the
    crashed attempt used.
    """
    if attempt < 0:
        raise ValueError(f"attempt must not be negative, got {attempt}")
    if not VMID_MIN <= vmid_min < vmid_max <= VMID_MAX:
        raise ValueError(
            f"VMID range must satisfy {VMID_MIN} <= min < max <= {VMID_MAX}, "
            f"got {vmid_min}..{vmid_max}"
        )
    span = vmid_max - vmid_min + 1
    return vmid_min + (fnv1a64(canonical_uid(uid)) + attempt) % span


def vm_name(proxy_name: str) -> str:
    """The Proxmox VM name of a proxy: ``proxy-<name>`` (DESIGN §2).

    Refused when ``proxy_name`` is not a DNS label of at most 57 characters: the VM name ends
    up in a clone request that Proxmox checks as a ``dns-name``, and a refusal there would come
    only after work had started.
    """
    if len(proxy_name) > PROXY_NAME_MAX or not _DNS_LABEL.fullmatch(proxy_name):
        raise PermanentError(
            f"proxy name {proxy_name[:_ECHO_MAX]!r} is not a DNS label of at most "
            f"{PROXY_NAME_MAX} characters",
            remediation="use lower-case letters, digits and inner hyphens only",
        )
    return VM_NAME_PREFIX + proxy_name


@dataclass(frozen=True)
class ProviderId:
    """A parsed ``vms/<vmid>/<name>``."""

    vmid: int
    name: str

    def __str__(self) -> str:
        return format_provider_id(self.vmid, self.name)


def format_provider_id(vmid: int, name: str) -> str:
    """``vms/<vmid>/<name>`` (seed 000 entry 1)."""
    return f"vms/{vmid}/{name}"


def parse_provider_id(text: str) -> ProviderId:
    """Parse a provider id strictly (seed 000 entry 1); anything else is ``PermanentError``.

    Exactly three ``/``-separated segments, the literal ``vms``, a decimal VMID without leading
    zeros between 100 and 999999999, and a non-empty name (which therefore holds no ``/``).
    Strict because the id is what ``get`` and ``delete`` act on: a lenient parse could point a
    destroy at a VM the id never meant.
    """
    parts = text.split("/")
    problem = ""
    if len(parts) != 3:
        problem = f"it has {len(parts)} '/'-separated segments, not 3"
    elif parts[0] != "vms":
        problem = "the first segment is not 'vms'"
    elif not _VMID_TEXT.fullmatch(parts[1]):
        problem = (
            f"the VMID is not a decimal number from {VMID_MIN} to {VMID_MAX} without leading zeros"
        )
    elif not parts[2]:
        problem = "the name is empty"
    if problem:
        shown = text if len(text) <= _ECHO_MAX else text[:_ECHO_MAX] + "..."
        raise PermanentError(
            f"malformed provider id {shown!r}: {problem}",
            remediation=f"a provider id has the form {_PROVIDER_ID_SHAPE}, as proxyhub "
            "wrote it; it was changed or damaged outside proxyhub",
        )
    return ProviderId(vmid=int(parts[1]), name=parts[2])
