"""The NoCloud seed ISO that hands a proxy its cloud-init (seed 000 entry 5).

Proxmox's storage upload accepts ISO images but never snippets, so ``cicustom`` would need
shell access to the node; a seed ISO built here and uploaded through the API needs none. The
image is what cloud-init's NoCloud datasource looks for: volume label ``cidata`` with the files
``user-data``, ``meta-data`` and, when there is anything to say, ``vendor-data``.

The ISO carries Joliet and Rock Ridge so those names reach the guest as written (plain
ISO 9660 would turn them into ``USER_DATA.;1``), the same layout ``cloud-localds`` makes.

It is deterministic: the same inputs give the same bytes, so a re-upload after a retry writes
an identical file and tests can compare images byte for byte. pycdlib stamps every record with
the current local time; ``_pin_timestamps`` overwrites those stamps with one fixed UTC instant
after the image is written.

Nothing here logs, and no error carries the user-data or vendor-data: both may hold secrets.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from dataclasses import dataclass
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from uuid import UUID

VOLUME_LABEL = "cidata"

# ISO 9660 level 3 names (d-characters only) for the three files; Joliet and Rock Ridge
# carry the real names.
_FILES = {
    "user-data": "/USER_DATA.;1",
    "meta-data": "/META_DATA.;1",
    "vendor-data": "/VENDOR_DATA.;1",
}

# Seed 000 entry 7: without the guest agent no address is ever reported. Installing it needs a
# package mirror; a template that ships the agent can turn this off (installGuestAgent: false).
AGENT_VENDOR_DATA = (
    "#cloud-config\n"
    "packages:\n"
    "  - qemu-guest-agent\n"
    "runcmd:\n"
    "  - systemctl enable --now qemu-guest-agent\n"
)

# cloud-init's part types by the first line of a part (its handlers' ``INCLUSION_TYPES_MAP``);
# the longest matching prefix wins, so ``#cloud-config-archive`` is not ``#cloud-config``.
_PART_TYPES = (
    ("#cloud-config-archive", "cloud-config-archive"),
    ("#cloud-config-jsonp", "cloud-config-jsonp"),
    ("#cloud-config", "cloud-config"),
    ("#cloud-boothook", "cloud-boothook"),
    ("#include-once", "x-include-once-url"),
    ("#include", "x-include-url"),
    ("#part-handler", "part-handler"),
    ("## template: jinja", "jinja2"),
    ("#!", "x-shellscript"),
)

# meta-data is YAML written by hand here: keep both values to characters that need no quoting.
_META_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# The one instant every timestamp in the image carries: 2000-01-01T00:00:00Z.
_FIXED_VD_DATE = b"2000010100000000" + b"\x00"  # ECMA-119 8.4.26.1, GMT offset 0
_FIXED_DR_DATE = bytes((100, 1, 1, 0, 0, 0, 0))  # ECMA-119 9.1.5, years since 1900

_SECTOR = 2048
_FIRST_VD_SECTOR = 16
_VD_PRIMARY, _VD_SUPPLEMENTARY, _VD_TERMINATOR = 1, 2, 255
_VD_ROOT_RECORD = 156
_VD_DATE_OFFSETS = (813, 830, 864)  # creation, modification, effective (expiration stays unset)


# A seed's name says whose it is: ``<vm name>_<installation tag>_<uid tag>-seed.iso``. The VM
# name is a DNS label (``[a-z0-9-]``), so the ``_`` separators and the two fixed-width hex tags
# parse back without ambiguity even when the proxy name holds dashes, and no name of the old form
# (``<vm name>-seed.iso``, no ``_``) is ever read as one of the new. ``_`` and ``.`` survive
# Proxmox's upload file-name rule (pve-storage ``normalize_content_filename`` keeps
# ``[-a-zA-Z0-9_.]``). The longest name is 6 + 57 + 1 + 8 + 1 + 12 + 9 = 94 characters.
INSTALLATION_TAG_LEN = 8
UID_TAG_LEN = 12
SEED_SUFFIX = "-seed.iso"
_SEED_NAME = re.compile(
    rf"^(?P<vm>proxy-[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)"
    rf"_(?P<inst>[0-9a-f]{{{INSTALLATION_TAG_LEN}}})_(?P<uid>[0-9a-f]{{{UID_TAG_LEN}}})-seed\.iso$"
)
_LEGACY_SEED_NAME = re.compile(r"^(?P<vm>proxy-[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)-seed\.iso$")


def installation_tag(installation_id: str) -> str:
    """The installation's mark in seed names: 8 hex digits of the SHA-256 of its id (the id
    itself may hold ``_`` and ``.``, which would make names ambiguous)."""
    return hashlib.sha256(installation_id.encode("utf-8")).hexdigest()[:INSTALLATION_TAG_LEN]


def uid_tag(uid: str) -> str:
    """The proxy's mark in seed names: the first 12 hex digits of its UUID (the uid as
    ``proxies list`` prints it, dashes left out); a uid that is not a UUID is hashed."""
    try:
        return UUID(uid).hex[:UID_TAG_LEN]
    except ValueError:
        return hashlib.sha256(uid.encode("utf-8")).hexdigest()[:UID_TAG_LEN]


def seed_iso_name(vm_name: str, *, installation_id: str, uid: str) -> str:
    """The seed's file name on ``isoStorage``, naming its installation and proxy (issue 11):
    two installations sharing a cluster never write, use or remove each other's seeds."""
    return f"{vm_name}_{installation_tag(installation_id)}_{uid_tag(uid)}{SEED_SUFFIX}"


def legacy_seed_iso_name(vm_name: str) -> str:
    """The name earlier versions gave a seed, ``<vm name>-seed.iso``: it says nothing of whose
    it is, so only the delete of a VM of ours that has it attached removes it."""
    return f"{vm_name}{SEED_SUFFIX}"


def seed_volid(iso_storage: str, iso_name: str) -> str:
    """A seed's volume id, as attached to ``ide2``: ``<isoStorage>:iso/<seed file name>``."""
    return f"{iso_storage}:iso/{iso_name}"


@dataclass(frozen=True)
class SeedName:
    """What a seed's file name says: its VM's name and, for the current form, the tags of the
    installation and proxy it was made for (empty for the legacy form)."""

    vm_name: str
    installation_tag: str = ""
    uid_tag: str = ""

    @property
    def legacy(self) -> bool:
        return not self.installation_tag


def parse_seed_name(filename: str) -> SeedName | None:
    """The seed name in ``filename`` (either form), or None when it is not a seed's."""
    match = _SEED_NAME.match(filename)
    if match:
        return SeedName(match["vm"], match["inst"], match["uid"])
    match = _LEGACY_SEED_NAME.match(filename)
    if match:
        return SeedName(match["vm"])
    return None


def part_type(text: str) -> str:
    """The MIME type cloud-init expects for a vendor-data part, from its first line."""
    for prefix, subtype in _PART_TYPES:
        if text.startswith(prefix):
            return f"text/{subtype}"
    return "text/plain"


def vendor_data_for(vendor_data: str | None, *, install_guest_agent: bool) -> bytes | None:
    """The ``vendor-data`` file, or None when there is nothing to put in it.

    The agent part and the configured ``vendorData`` are joined as a MIME multipart when both
    are there (each part typed so cloud-init runs it with the right handler); either alone is
    written as it is.
    """
    parts: list[tuple[str, str]] = []
    if install_guest_agent:
        parts.append(("proxyhub-guest-agent", AGENT_VENDOR_DATA))
    if vendor_data:
        parts.append(("vendor-data", vendor_data))
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0][1].encode("utf-8")
    return _multipart(parts)


def _multipart(parts: list[tuple[str, str]]) -> bytes:
    """A ``multipart/mixed`` document as cloud-init's ``make-mime`` writes one.

    ASCII parts stay readable (7bit), so an operator (or the simulator) can read the seed;
    others are base64 in UTF-8. The boundary is derived from the content, which keeps the
    output deterministic; it is re-derived in the (practically impossible) case that a part
    contains it.
    """
    salt = 0
    while True:
        digest = hashlib.sha256(str(salt).encode())
        for name, text in parts:
            digest.update(name.encode("utf-8") + b"\0" + text.encode("utf-8") + b"\0")
        boundary = f"==proxyhub-{digest.hexdigest()[:32]}=="
        if not any(boundary in text for _, text in parts):
            break
        salt += 1
    message = MIMEMultipart("mixed", boundary=boundary)
    for name, text in parts:
        charset = "us-ascii" if text.isascii() else "utf-8"
        part = MIMEText(text, part_type(text).removeprefix("text/"), charset)
        part.add_header("Content-Disposition", "attachment", filename=name)
        message.attach(part)
    return message.as_bytes()


def meta_data(instance_id: str, hostname: str) -> bytes:
    """``instance-id`` (the proxy's UID: a new UID makes cloud-init run again) and hostname."""
    for label, value in (("instance_id", instance_id), ("hostname", hostname)):
        if not _META_VALUE.fullmatch(value):
            raise ValueError(f"{label} must be letters, digits, '.', '_' or '-'")
    return f"instance-id: {instance_id}\nlocal-hostname: {hostname}\n".encode()


def build_seed_iso(
    *,
    user_data: bytes,
    instance_id: str,
    hostname: str,
    vendor_data: str | None,
    install_guest_agent: bool,
) -> bytes:
    """The NoCloud seed image. ``user_data`` is written byte for byte, never parsed."""
    if not isinstance(user_data, bytes | bytearray):
        raise TypeError("user_data must be bytes")
    files: dict[str, bytes] = {
        "user-data": bytes(user_data),
        "meta-data": meta_data(instance_id, hostname),
    }
    vendor = vendor_data_for(vendor_data, install_guest_agent=install_guest_agent)
    if vendor is not None:
        files["vendor-data"] = vendor

    # Imported here, not at the top: only the step that builds a seed needs pycdlib, and a
    # worker's parent process (which never builds one) would otherwise hold it for nothing.
    import pycdlib

    iso = pycdlib.PyCdlib()
    iso.new(
        interchange_level=3,
        joliet=3,
        rock_ridge="1.09",
        vol_ident=VOLUME_LABEL,
        sys_ident="LINUX",
    )
    for name, content in files.items():
        iso.add_fp(
            io.BytesIO(content),
            len(content),
            _FILES[name],
            rr_name=name,
            joliet_path="/" + name,
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    image = bytearray(out.getvalue())
    _pin_timestamps(image)
    return bytes(image)


# --- determinism ---------------------------------------------------------------------------


def _pin_timestamps(image: bytearray) -> None:
    """Overwrite every timestamp pycdlib wrote with ``2000-01-01T00:00:00Z``.

    Walks what ECMA-119 and Rock Ridge define: the volume descriptors' dates, then each
    directory tree (primary and Joliet) from its root record, setting every directory
    record's date and every Rock Ridge ``TF`` time, following ``CE`` continuation areas.
    """
    sector = _FIRST_VD_SECTOR
    seen_dirs: set[int] = set()
    while (sector + 1) * _SECTOR <= len(image):
        base = sector * _SECTOR
        kind = image[base]
        if image[base + 1 : base + 6] != b"CD001" or kind == _VD_TERMINATOR:
            break
        if kind in (_VD_PRIMARY, _VD_SUPPLEMENTARY):
            for offset in _VD_DATE_OFFSETS:
                image[base + offset : base + offset + 17] = _FIXED_VD_DATE
            root = base + _VD_ROOT_RECORD
            _pin_record(image, root)
            extent, size = _extent_of(image, root)
            _pin_directory(image, extent, size, seen_dirs)
        sector += 1


def _extent_of(image: bytearray, record: int) -> tuple[int, int]:
    extent = struct.unpack_from("<I", image, record + 2)[0]
    size = struct.unpack_from("<I", image, record + 10)[0]
    return extent, size


def _pin_record(image: bytearray, record: int) -> None:
    image[record + 18 : record + 25] = _FIXED_DR_DATE


def _pin_directory(image: bytearray, extent: int, size: int, seen: set[int]) -> None:
    if extent in seen:
        return
    seen.add(extent)
    start = extent * _SECTOR
    end = start + size
    pos = start
    while pos < end:
        length = image[pos]
        if length == 0:
            # Records never cross a sector; the rest of this sector is padding.
            pos = (pos // _SECTOR + 1) * _SECTOR
            continue
        _pin_record(image, pos)
        name_len = image[pos + 32]
        name = bytes(image[pos + 33 : pos + 33 + name_len])
        system_use = pos + 33 + name_len + (1 - name_len % 2)
        _pin_susp(image, system_use, pos + length)
        is_dir = bool(image[pos + 25] & 0x02)
        if is_dir and name not in (b"\x00", b"\x01"):
            child, child_size = _extent_of(image, pos)
            _pin_directory(image, child, child_size, seen)
        pos += length


def _pin_susp(image: bytearray, start: int, end: int) -> None:
    """Pin the ``TF`` entries of one System Use area, and of its continuation areas."""
    pos = start
    while pos + 4 <= end:
        signature = bytes(image[pos : pos + 2])
        length = image[pos + 2]
        if length < 4:
            return
        if signature == b"TF":
            flags = image[pos + 4]
            width = 17 if flags & 0x80 else 7
            stamp = _FIXED_VD_DATE if width == 17 else _FIXED_DR_DATE
            at = pos + 5
            for bit in range(7):
                if flags & (1 << bit):
                    image[at : at + width] = stamp
                    at += width
        elif signature == b"CE":
            block = struct.unpack_from("<I", image, pos + 4)[0]
            offset = struct.unpack_from("<I", image, pos + 12)[0]
            size = struct.unpack_from("<I", image, pos + 20)[0]
            area = block * _SECTOR + offset
            _pin_susp(image, area, area + size)
        elif signature == b"ST":
            return
        pos += length
