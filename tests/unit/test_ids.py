"""Seed 000 entries 1 and 2: the VMID a proxy lands on and the provider id that names it."""

from __future__ import annotations

from uuid import UUID

import pytest

from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.ids import (
    MAX_ATTEMPTS,
    ProviderId,
    fnv1a64,
    format_provider_id,
    parse_provider_id,
    vm_name,
    vmid_for,
)

UID = "2f1d7c9e-0b7a-4c57-9d1b-3e6c1c1d8f00"


def _fnv1a64_by_hand(data: bytes) -> int:
    # The published algorithm, written out independently of the module under test.
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Vectors from the FNV reference test suite (Fowler/Noll/Vo).
        ("", 0xCBF29CE484222325),
        ("a", 0xAF63DC4C8601EC8C),
        ("foobar", 0x85944171F73967E8),
    ],
)
def test_fnv1a64_known_vectors(text: str, expected: int) -> None:
    assert fnv1a64(text) == expected


def test_fnv1a64_hashes_utf8_bytes() -> None:
    assert fnv1a64("zürich") == _fnv1a64_by_hand("zürich".encode())


def test_vmid_for_is_fnv1a64() -> None:
    hashed = _fnv1a64_by_hand(UID.encode("ascii"))
    span = 199999 - 100000 + 1
    expected = 100000 + hashed % span
    assert vmid_for(UID, 0, 100000, 199999) == expected
    # The same number from a UUID object and from upper-case text: the hash is over the
    # canonical lower-case hyphenated form, so a retry with either lands on the same VMID.
    assert vmid_for(UUID(UID), 0, 100000, 199999) == expected
    assert vmid_for(UID.upper(), 0, 100000, 199999) == expected
    assert vmid_for(UID, 5, 100000, 199999) == 100000 + (hashed + 5) % span


def test_vmid_for_walks_consecutive_vmids_and_wraps_inside_the_range() -> None:
    vmid_min, vmid_max = 1000, 1009
    seen = [vmid_for(UID, attempt, vmid_min, vmid_max) for attempt in range(MAX_ATTEMPTS)]
    assert all(vmid_min <= v <= vmid_max for v in seen)
    # Ten attempts visit every VMID of a ten-wide range once.
    assert sorted(seen[:10]) == list(range(vmid_min, vmid_max + 1))
    assert seen[10] == seen[0]


def test_vmid_for_spreads_different_proxies() -> None:
    uids = [UUID(int=i * 7919 + 1, version=4) for i in range(200)]
    vmids = {vmid_for(uid, 0, 100000, 199999) for uid in uids}
    assert len(vmids) > 190


@pytest.mark.parametrize(
    ("attempt", "vmid_min", "vmid_max"),
    [(-1, 100000, 199999), (0, 99, 200), (0, 500, 500), (0, 100, 1_000_000_000)],
)
def test_vmid_for_refuses_bad_arguments(attempt: int, vmid_min: int, vmid_max: int) -> None:
    with pytest.raises(ValueError):
        vmid_for(UID, attempt, vmid_min, vmid_max)


def test_vm_name_and_provider_id_round_trip() -> None:
    name = vm_name("fra-1")
    assert name == "proxy-fra-1"
    text = format_provider_id(123456, name)
    assert text == "vms/123456/proxy-fra-1"
    parsed = parse_provider_id(text)
    assert parsed == ProviderId(vmid=123456, name="proxy-fra-1")
    assert str(parsed) == text


@pytest.mark.parametrize("bad", ["", "Fra", "-fra", "fra-", "fra_1", "a" * 58, "a.b"])
def test_vm_name_refuses_names_proxmox_would_refuse(bad: str) -> None:
    with pytest.raises(PermanentError):
        vm_name(bad)


@pytest.mark.parametrize("text", ["vms/100/x", "vms/999999999/proxy-a", "vms/123/name with spaces"])
def test_parse_provider_id_accepts_the_edges(text: str) -> None:
    assert str(parse_provider_id(text)) == text


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "segments"),
        ("vms/123", "segments"),
        ("vms/123/a/b", "segments"),
        ("/vms/123/a", "segments"),
        ("vm/123/a", "'vms'"),
        ("VMS/123/a", "'vms'"),
        ("vms/0123/a", "leading zeros"),
        ("vms/99/a", "VMID"),
        ("vms/1000000000/a", "VMID"),
        ("vms/-123/a", "VMID"),
        ("vms/+123/a", "VMID"),
        ("vms/12a/a", "VMID"),
        ("vms/ 123/a", "VMID"),
        ("vms/\uff11\uff12\uff13/a", "VMID"),  # full-width digits are not digits to Proxmox
        ("vms/123/", "name is empty"),
    ],
)
def test_parse_provider_id_malformed(text: str, why: str) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_provider_id(text)
    message = str(caught.value)
    assert why in message
    assert repr(text) in message  # the operator sees which id is bad


def test_parse_provider_id_shortens_a_huge_id_in_the_error() -> None:
    with pytest.raises(PermanentError) as caught:
        parse_provider_id("x" * 10_000)
    assert len(str(caught.value)) < 400
