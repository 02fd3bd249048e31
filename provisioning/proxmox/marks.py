"""The ownership mark proxyhub writes into a VM's description, and the tag it sets.

Seed 000 entry 8: the mark is ``key=value`` lines in ``description``, passed in the clone call
itself so no VM of ours ever exists without it. DESIGN §2 renames the seed's keys to
``proxyhub-*`` and adds an installation line, so two proxyhub installations sharing a cluster
never collect each other's VMs. The tag is a UI filter and a listing hint, never the mark:
tags cannot be passed to the clone call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

TAG = "proxyhub"

MANAGED_KEY = "proxyhub-managed"
UID_KEY = "proxyhub-uid"
CREATED_AT_KEY = "proxyhub-created-at"
INSTALLATION_KEY = "proxyhub-installation"
MANAGED_YES = "true"

# pve-reference §5.2: a tag list may be separated by ``;`` (the stored form), ``,`` or
# whitespace (what a request may send).
_TAG_SEPARATORS = re.compile(r"[;,\s]+")


@dataclass(frozen=True)
class Mark:
    """What a description says about ownership.

    ``managed`` only when the managed line says exactly ``true``. ``uid`` and ``installation``
    are empty when their line is missing. ``created_at`` is None when missing or unparsable,
    which GC treats as old (seed 000 entry 8 accepts that).
    """

    managed: bool
    uid: str = ""
    created_at: datetime | None = None
    installation: str = ""


def format_created_at(created_at: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` and whole seconds: ``2026-11-30T16:00:00Z``.

    A naive datetime is refused: guessing its zone would shift GC's age by hours.
    """
    if created_at.tzinfo is None or created_at.utcoffset() is None:
        raise ValueError("created_at must be timezone-aware")
    return created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_mark(uid: UUID | str, created_at: datetime, installation_id: str) -> str:
    """The four mark lines for the clone's ``description``.

    No trailing newline: Proxmox returns the description without trailing whitespace
    (pve-reference §5.6), so what we write is what we read back.
    """
    uid_text = str(uid)
    for label, value in (("uid", uid_text), ("installation_id", installation_id)):
        if not value or any(ch.isspace() or ch == "=" for ch in value):
            # A newline here would forge or break a line of the mark.
            raise ValueError(f"{label} must be non-empty without whitespace or '='")
    return "\n".join(
        (
            f"{MANAGED_KEY}={MANAGED_YES}",
            f"{UID_KEY}={uid_text}",
            f"{CREATED_AT_KEY}={format_created_at(created_at)}",
            f"{INSTALLATION_KEY}={installation_id}",
        )
    )


def parse_created_at(text: str) -> datetime | None:
    """An RFC 3339 timestamp with a zone, in UTC; None for anything else."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        # A date alone or a zoneless time is not what proxyhub writes.
        return None
    return value.astimezone(UTC)


def parse_mark(description: str | None) -> Mark:
    """Read the mark out of a description an admin may also have written in.

    Tolerates CRLF, blank lines, lines that are not ``key=value``, any other keys, and spaces
    around keys and values. The first occurrence of a key wins: the mark is written first, at
    clone time, and a line an admin appends later must not override it.
    """
    values: dict[str, str] = {}
    for line in (description or "").splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        key = key.strip()
        if key in (MANAGED_KEY, UID_KEY, CREATED_AT_KEY, INSTALLATION_KEY):
            values.setdefault(key, value.strip())
    created = values.get(CREATED_AT_KEY)
    return Mark(
        managed=values.get(MANAGED_KEY) == MANAGED_YES,
        uid=values.get(UID_KEY, ""),
        created_at=parse_created_at(created) if created else None,
        installation=values.get(INSTALLATION_KEY, ""),
    )


def complete_mark(
    description: str | None, uid: UUID | str, installation_id: str, now: datetime
) -> str | None:
    """The description with a whole mark, or None when its mark is whole already.

    Seed 000 entry 2 adopts a VM whose mark carries no uid; such a VM is tied to its proxy by
    nothing but its name. The mark is written again with the uid and installation, keeping the
    mark's creation time (GC's age) when it has one and every line an admin added."""
    mark = parse_mark(description)
    if mark.uid and mark.installation:
        return None
    keys = (MANAGED_KEY, UID_KEY, CREATED_AT_KEY, INSTALLATION_KEY)
    kept = [
        line
        for line in (description or "").splitlines()
        if line.partition("=")[0].strip() not in keys
    ]
    head = render_mark(uid, mark.created_at or now, installation_id)
    return "\n".join([head, *kept]).rstrip()


def split_tags(tags: str | None) -> list[str]:
    """The tags of a ``tags`` value, in order, empty entries dropped."""
    return [t for t in _TAG_SEPARATORS.split(tags or "") if t]


def has_tag(tags: str | None, tag: str = TAG) -> bool:
    """Whether ``tags`` holds ``tag``, case-insensitively (Proxmox folds tags to lower case)."""
    wanted = tag.casefold()
    return any(t.casefold() == wanted for t in split_tags(tags))
