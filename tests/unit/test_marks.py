"""Seed 000 entry 8 with DESIGN §2's names: the description mark and the tag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from provisioning.proxmox.marks import TAG, Mark, has_tag, parse_mark, render_mark

UID = "2f1d7c9e-0b7a-4c57-9d1b-3e6c1c1d8f00"
CREATED = datetime(2026, 11, 30, 16, 0, 0, tzinfo=UTC)


def test_render_mark_is_the_four_lines() -> None:
    assert render_mark(UID, CREATED, "inst-1") == (
        "proxyhub-managed=true\n"
        f"proxyhub-uid={UID}\n"
        "proxyhub-created-at=2026-11-30T16:00:00Z\n"
        "proxyhub-installation=inst-1"
    )


def test_render_mark_writes_utc_whole_seconds() -> None:
    berlin = timezone(timedelta(hours=1))
    local = datetime(2026, 11, 30, 17, 0, 0, 987654, tzinfo=berlin)
    assert "proxyhub-created-at=2026-11-30T16:00:00Z" in render_mark(UID, local, "i")


def test_render_mark_refuses_a_naive_time_and_line_breaking_values() -> None:
    with pytest.raises(ValueError):
        render_mark(UID, datetime(2026, 11, 30, 16, 0), "i")
    with pytest.raises(ValueError):
        render_mark(UID, CREATED, "inst\nproxyhub-uid=forged")
    with pytest.raises(ValueError):
        render_mark(UID, CREATED, "")


def test_round_trip() -> None:
    assert parse_mark(render_mark(UID, CREATED, "inst-1")) == Mark(
        managed=True, uid=UID, created_at=CREATED, installation="inst-1"
    )


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        (None, Mark(managed=False)),
        ("", Mark(managed=False)),
        ("a VM someone made by hand", Mark(managed=False)),
        # Proxmox's stored form: CRLF from the web UI, an admin's notes around the mark,
        # blank lines, spaces around keys and values.
        (
            "Owner: team-net\r\n\r\n proxyhub-managed = true \r\n"
            f"proxyhub-uid={UID}\r\nproxyhub-created-at=2026-11-30T16:00:00Z\r\n"
            "proxyhub-installation=inst-1\r\nticket=NET-42",
            Mark(managed=True, uid=UID, created_at=CREATED, installation="inst-1"),
        ),
        # Managed only when the value is exactly "true".
        (f"proxyhub-managed=True\nproxyhub-uid={UID}", Mark(managed=False, uid=UID)),
        (f"proxyhub-managed=yes\nproxyhub-uid={UID}", Mark(managed=False, uid=UID)),
        (f"proxyhub-managed=1\nproxyhub-uid={UID}", Mark(managed=False, uid=UID)),
        # A missing uid line is an empty uid; a missing installation line likewise.
        ("proxyhub-managed=true", Mark(managed=True)),
        # An unparsable created-at is None, which GC treats as old.
        (
            "proxyhub-managed=true\nproxyhub-created-at=yesterday",
            Mark(managed=True, created_at=None),
        ),
        (
            "proxyhub-managed=true\nproxyhub-created-at=2026-11-30",
            Mark(managed=True, created_at=None),
        ),
        (
            "proxyhub-managed=true\nproxyhub-created-at=2026-11-30T17:00:00+01:00",
            Mark(managed=True, created_at=CREATED),
        ),
        # The seed's keys are not ours.
        (f"proxy-operator-managed=true\nproxy-operator-uid={UID}", Mark(managed=False)),
        # The first line of a key wins: a line appended later does not override the mark.
        (
            f"proxyhub-managed=true\nproxyhub-uid={UID}\nproxyhub-uid=other",
            Mark(managed=True, uid=UID),
        ),
    ],
)
def test_parse_mark_table(description: str | None, expected: Mark) -> None:
    assert parse_mark(description) == expected


def test_parse_mark_created_at_is_utc() -> None:
    mark = parse_mark("proxyhub-managed=true\nproxyhub-created-at=2026-11-30T17:00:00+01:00")
    assert mark.created_at is not None
    assert mark.created_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("tags", "present"),
    [
        ("proxyhub", True),
        ("managed;proxyhub", True),
        ("proxyhub,web", True),
        ("web proxyhub", True),
        ("web\tPROXYHUB", True),
        ("ProxyHub", True),
        (None, False),
        ("", False),
        ("proxyhub-old", False),
        ("proxy_operator", False),
        ("proxyhubx;web", False),
    ],
)
def test_has_tag(tags: str | None, present: bool) -> None:
    assert has_tag(tags, TAG) is present
