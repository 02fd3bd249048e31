"""Reads a NoCloud seed ISO the way a booting guest's cloud-init would, to decide one thing:
does its ``vendor-data`` install ``qemu-guest-agent``?

A guest whose template lacks the agent only gets one when the seed attached as its CD-ROM
carries vendor-data that installs it (seed 000 entries 5 and 7); otherwise the agent never
answers and proxyhub must notice. The ISO is opened from bytes with pycdlib and the file is
looked up by its Rock Ridge name, then its Joliet name, then the plain ISO 9660 directory.
Vendor-data may be a MIME multipart (when proxyhub joins its agent script with an operator's
``vendorData``) and parts may be base64 or gzip encoded; all of it is decoded before looking.
"""

from __future__ import annotations

import email
import gzip
import logging
from io import BytesIO

import pycdlib
from pycdlib.pycdlibexception import PyCdlibException

log = logging.getLogger("proxyhub.pvesim.seed")

AGENT_PACKAGE = b"qemu-guest-agent"


def read_seed_file(iso: bytes, name: str) -> bytes | None:
    """The content of ``/<name>`` on the ISO, or ``None`` when the ISO or the file is missing."""
    cd = pycdlib.PyCdlib()
    try:
        cd.open_fp(BytesIO(iso))
    except (PyCdlibException, OSError, ValueError) as exc:
        log.debug("seed ISO unreadable: %s", type(exc).__name__)
        return None
    try:
        for kwargs in _lookups(cd, name):
            out = BytesIO()
            try:
                cd.get_file_from_iso_fp(out, **kwargs)
            except PyCdlibException:
                continue
            return out.getvalue()
        return None
    finally:
        cd.close()


def _lookups(cd: pycdlib.PyCdlib, name: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if cd.has_rock_ridge():
        out.append({"rr_path": f"/{name}"})
    if cd.has_joliet():
        out.append({"joliet_path": f"/{name}"})
    # Plain ISO 9660: upper-case 8.3-ish names with a version, ``-`` mapped to ``_``.
    wanted = name.upper().replace("-", "_")
    try:
        for child in cd.list_children(iso_path="/"):
            ident = child.file_identifier().decode("ascii", "replace")
            plain = ident.split(";", 1)[0].rstrip(".")
            if plain.replace("-", "_") == wanted:
                out.append({"iso_path": f"/{ident}"})
    except PyCdlibException:
        pass
    return out


def decoded_parts(data: bytes) -> list[bytes]:
    """Vendor-data as cloud-init reads it: gunzipped, MIME parts decoded."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return [data]
    head = data.lstrip()[:200].lower()
    if not (head.startswith(b"content-type:") or head.startswith(b"mime-version:")):
        return [data]
    message = email.message_from_bytes(data)
    parts: list[bytes] = []
    for part in message.walk():
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            parts.extend(decoded_parts(payload))
    return parts or [data]


def installs_guest_agent(iso: bytes) -> bool:
    """Whether the seed's vendor-data installs ``qemu-guest-agent``."""
    vendor_data = read_seed_file(iso, "vendor-data")
    if not vendor_data:
        return False
    return any(AGENT_PACKAGE in part for part in decoded_parts(vendor_data))
