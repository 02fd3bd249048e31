"""What a template build is given, checked before anything is written (issue 14).

Pure checks of the operator's inputs (URL, checksum, disk device, template declaration fields of
seed 003) and the two reads that judge the node's storages; each refusal names the field and
what is allowed. The build machine (``template_build``) runs the storage judgement again from its
first stage, so a build requested without a preflight (the admin action, which makes no
Proxmox call in the web request) is refused the same way before it downloads anything.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

# download-url's ``checksum-algorithm`` enum (appendix) and each digest's hex length.
HEX_LENGTHS = {"md5": 32, "sha1": 40, "sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128}
# Seed 003: the boot disk of a template declaration.
DISK_DEVICES = ("scsi0", "virtio0", "sata0")
# Seed 003's limits for the declaration's fields.
TEMPLATE_VERSION = re.compile(r"[A-Za-z0-9._+-]{1,128}")
GUEST_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
DISK_GIB_MIN, DISK_GIB_MAX = 4, 4096
# pve-reference §5.1: the schema's VMID bounds.
VMID_FLOOR, VMID_CEILING = 100, 999_999_999
# pve-storage ``normalize_content_filename`` (§7.7): odd characters become ``_``.
_UNSAFE = re.compile(r"[^-a-zA-Z0-9_.]")
# Which file names each download-url content type takes (§7.7's extension rule; ``import``
# images per pve-storage's import extensions).
IMPORT_EXTENSIONS = (".qcow2", ".raw", ".vmdk")
ISO_EXTENSIONS = (".img", ".iso")


class InputProblem(ValueError):
    """A refused input: ``field`` is the option or form field, the text says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputProblem(
            "image-url", f"{url!r} is not an http:// or https:// URL with a host (only those)"
        )
    if not image_filename(url):
        raise InputProblem("image-url", f"{url!r} names no file to download")
    return url


def parse_checksum(text: str) -> tuple[str, str]:
    """``sha256:<hex>`` → (``sha256``, lower-case hex)."""
    algorithm, sep, digest = text.partition(":")
    algorithm = algorithm.strip().lower()
    if not sep or algorithm not in HEX_LENGTHS:
        allowed = ", ".join(HEX_LENGTHS)
        raise InputProblem("checksum", f"write ALGORITHM:HEX with ALGORITHM one of {allowed}")
    digest = digest.strip().lower()
    want = HEX_LENGTHS[algorithm]
    if len(digest) != want or not re.fullmatch(r"[0-9a-f]+", digest):
        raise InputProblem("checksum", f"a {algorithm} checksum is {want} hexadecimal digits")
    return algorithm, digest


def image_filename(url: str) -> str:
    """The file the node stores: the URL's last path segment, normalised as Proxmox does."""
    name = posixpath.basename(unquote(urlsplit(url).path))
    return _UNSAFE.sub("_", name)


def contents_for(filename: str) -> tuple[tuple[str, str], ...]:
    """(content type, stored file name) the image can be downloaded as, preferred first:
    ``import`` for a disk image by its extension, else ``iso`` (``.img``, the cloud images'
    usual name, which the ``iso`` type accepts)."""
    lower = filename.lower()
    out: list[tuple[str, str]] = []
    if lower.endswith(IMPORT_EXTENSIONS):
        out.append(("import", filename))
        out.append(("iso", filename.rsplit(".", 1)[0] + ".img"))
    elif lower.endswith(ISO_EXTENSIONS):
        out.append(("iso", filename))
    return tuple(out)


def check_declaration(
    *, key: str, template_version: str, guest_user: str, disk_device: str, disk_gib: int
) -> None:
    """Seed 003's template declaration fields, with its limits."""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", key) or len(key) > 63:
        raise InputProblem("key", "lower-case letters, digits and inner hyphens (a DNS label)")
    if not TEMPLATE_VERSION.fullmatch(template_version):
        raise InputProblem(
            "template-version", "1-128 letters, digits, dots, underscores, plus signs or hyphens"
        )
    if not GUEST_USER.fullmatch(guest_user) or guest_user == "root":
        raise InputProblem(
            "guest-user",
            "1-32 lower-case letters, digits, underscores or hyphens, starting with a letter "
            "or underscore, and not root",
        )
    if disk_device not in DISK_DEVICES:
        raise InputProblem("disk-device", f"one of {', '.join(DISK_DEVICES)}")
    if not DISK_GIB_MIN <= disk_gib <= DISK_GIB_MAX:
        raise InputProblem("disk-gib", f"an integer from {DISK_GIB_MIN} to {DISK_GIB_MAX}")


def check_vmids(vmids: Sequence[int], *, proxy_range: tuple[int, int]) -> None:
    """Template VMIDs: Proxmox's range, outside the VMIDs proxyhub allocates to proxies."""
    low, high = proxy_range
    for vmid in vmids:
        if not VMID_FLOOR <= vmid <= VMID_CEILING:
            raise InputProblem("vmid", f"{vmid} is not from {VMID_FLOOR} to {VMID_CEILING}")
        if low <= vmid <= high:
            raise InputProblem(
                "vmid",
                f"{vmid} is in the cluster's vmidRange {low}-{high}, which proxies use; "
                "pick one outside it",
            )


@dataclass(frozen=True)
class Storages:
    """How the build uses the node's storages: where the disk goes and where the image lands."""

    disk_storage: str
    disk_shared: bool
    image_storage: str
    image_content: str
    filename: str

    @property
    def image_volid(self) -> str:
        return f"{self.image_storage}:{self.image_content}/{self.filename}"


def judge_storages(
    listing: Sequence[Mapping[str, Any]],
    *,
    node: str,
    storage: str,
    image_storage: str,
    filename: str,
) -> Storages:
    """Judge ``GET /nodes/{node}/storage`` (``content`` lists each storage's types): the disk
    storage must hold ``images``; the image storage (chosen, or the first that fits) must be
    file based and configured for a content type the image can be downloaded as (§7.8)."""
    by_id = {str(s.get("storage")): s for s in listing if s.get("enabled", 1)}
    target = by_id.get(storage)
    if target is None:
        raise InputProblem("storage", f"no storage {storage!r} on node {node}")
    if "images" not in _content(target):
        raise InputProblem(
            "storage", f"storage {storage!r} does not hold VM disks (content 'images')"
        )
    options = contents_for(filename)
    if not options:
        raise InputProblem(
            "image-url",
            f"{filename!r} is neither a disk image ({', '.join(IMPORT_EXTENSIONS)}) nor a "
            f"{'/'.join(ISO_EXTENSIONS)} file",
        )
    candidates = [image_storage] if image_storage else sorted(by_id)
    for candidate in candidates:
        found = by_id.get(candidate)
        if found is None:
            raise InputProblem("image-storage", f"no storage {candidate!r} on node {node}")
        for content, name in options:
            if content in _content(found) and found.get("type") in _FILE_BASED:
                return Storages(
                    storage, bool(int(target.get("shared") or 0)), candidate, content, name
                )
    wanted = " or ".join(c for c, _ in options)
    if image_storage:
        raise InputProblem(
            "image-storage", f"storage {image_storage!r} does not accept content {wanted}"
        )
    raise InputProblem(
        "image-storage", f"no file-based storage on node {node} accepts content {wanted}"
    )


# Storage types with a path, where download-url can put a file (``can't upload to storage type``).
_FILE_BASED = ("dir", "nfs", "cifs", "cephfs", "glusterfs", "btrfs")


def _content(entry: Mapping[str, Any]) -> set[str]:
    return {c for c in re.split(r"[,;\s]+", str(entry.get("content") or "")) if c}
