"""Seed 000 entry 5: the NoCloud seed ISO, read back the way a guest's kernel reads it."""

from __future__ import annotations

import email
import io
import re
import time
from collections.abc import Iterator
from email.message import Message

import pycdlib
import pytest
import yaml

from provisioning.proxmox.seed import (
    AGENT_VENDOR_DATA,
    SeedName,
    build_seed_iso,
    installation_tag,
    legacy_seed_iso_name,
    parse_seed_name,
    seed_iso_name,
    seed_volid,
)

UID = "2f1d7c9e-0b7a-4c57-9d1b-3e6c1c1d8f00"
USER_DATA = (
    b"#cloud-config\npackages: [squid]\nwrite_files:\n  - path: /etc/x\n    content: caf\xc3\xa9\n"
)


def _build(**overrides: object) -> bytes:
    kwargs: dict[str, object] = {
        "user_data": USER_DATA,
        "instance_id": UID,
        "hostname": "proxy-fra-1",
        "vendor_data": None,
        "install_guest_agent": True,
    }
    kwargs.update(overrides)
    return build_seed_iso(**kwargs)  # type: ignore[arg-type]


class Iso:
    """An opened image; files by their Rock Ridge and Joliet names."""

    def __init__(self, image: bytes) -> None:
        self.iso = pycdlib.PyCdlib()
        self.iso.open_fp(io.BytesIO(image))

    def rr(self, name: str) -> bytes:
        out = io.BytesIO()
        self.iso.get_file_from_iso_fp(out, rr_path="/" + name)
        return out.getvalue()

    def joliet(self, name: str) -> bytes:
        out = io.BytesIO()
        self.iso.get_file_from_iso_fp(out, joliet_path="/" + name)
        return out.getvalue()

    def rr_names(self) -> set[str]:
        return {
            child.rock_ridge.name().decode()
            for child in self.iso.list_children(rr_path="/")
            if child.rock_ridge is not None and not (child.is_dot() or child.is_dotdot())
        }

    def joliet_names(self) -> set[str]:
        return {
            child.file_identifier().decode("utf-16-be").split(";")[0]
            for child in self.iso.list_children(joliet_path="/")
            if not (child.is_dot() or child.is_dotdot())
        }


@pytest.fixture
def opened() -> Iterator[list[Iso]]:
    isos: list[Iso] = []
    yield isos
    for iso in isos:
        iso.iso.close()


def _open(image: bytes, opened: list[Iso]) -> Iso:
    iso = Iso(image)
    opened.append(iso)
    return iso


def test_names_label_and_content_survive(opened: list[Iso]) -> None:
    iso = _open(_build(), opened)
    assert iso.rr_names() == {"user-data", "meta-data", "vendor-data"}
    assert iso.joliet_names() == {"user-data", "meta-data", "vendor-data"}
    assert iso.iso.pvd.volume_identifier.decode().strip() == "cidata"
    assert iso.iso.joliet_vd is not None
    assert iso.iso.joliet_vd.volume_identifier.decode("utf-16-be").strip() == "cidata"
    assert iso.rr("user-data") == USER_DATA
    assert iso.joliet("user-data") == USER_DATA
    meta = iso.rr("meta-data")
    assert meta == f"instance-id: {UID}\nlocal-hostname: proxy-fra-1\n".encode()
    assert yaml.safe_load(meta) == {"instance-id": UID, "local-hostname": "proxy-fra-1"}


def test_large_binary_user_data_round_trips_byte_for_byte(opened: list[Iso]) -> None:
    user_data = bytes(range(256)) * 40  # 10 KiB, every byte value, not valid UTF-8
    iso = _open(_build(user_data=user_data), opened)
    assert iso.rr("user-data") == user_data
    assert iso.joliet("user-data") == user_data


def test_agent_only_vendor_data_installs_and_starts_the_agent(opened: list[Iso]) -> None:
    vendor = _open(_build(), opened).rr("vendor-data")
    assert vendor == AGENT_VENDOR_DATA.encode()
    assert vendor.startswith(b"#cloud-config\n")
    parsed = yaml.safe_load(vendor)
    assert parsed["packages"] == ["qemu-guest-agent"]
    assert parsed["runcmd"] == ["systemctl enable --now qemu-guest-agent"]


def test_configured_vendor_data_alone_when_the_agent_install_is_off(opened: list[Iso]) -> None:
    own = "#cloud-config\nntp:\n  enabled: true\n"
    iso = _open(_build(vendor_data=own, install_guest_agent=False), opened)
    assert iso.rr("vendor-data") == own.encode()


def test_no_vendor_data_file_when_there_is_nothing_to_say(opened: list[Iso]) -> None:
    iso = _open(_build(vendor_data=None, install_guest_agent=False), opened)
    assert iso.rr_names() == {"user-data", "meta-data"}
    assert iso.joliet_names() == {"user-data", "meta-data"}


def _parts(vendor: bytes) -> list[Message]:
    message = email.message_from_bytes(vendor)
    assert message.get_content_type() == "multipart/mixed"
    assert message.is_multipart()
    payload = message.get_payload()
    assert isinstance(payload, list)
    return payload


@pytest.mark.parametrize(
    ("own", "content_type"),
    [
        ("#cloud-config\nntp: {enabled: true}\n", "text/cloud-config"),
        ("#!/bin/sh\necho hello\n", "text/x-shellscript"),
        ("#cloud-boothook\necho early\n", "text/cloud-boothook"),
        ("just some text\n", "text/plain"),
        ("#cloud-config\nbootcmd: [echo caf\u00e9]\n", "text/cloud-config"),
    ],
)
def test_agent_and_configured_vendor_data_are_a_mime_multipart(
    own: str, content_type: str, opened: list[Iso]
) -> None:
    vendor = _open(_build(vendor_data=own), opened).rr("vendor-data")
    parts = _parts(vendor)
    assert [p.get_content_type() for p in parts] == ["text/cloud-config", content_type]
    decoded = []
    for part in parts:
        body = part.get_payload(decode=True)
        assert isinstance(body, bytes)
        decoded.append(body.decode(part.get_content_charset() or "utf-8"))
    assert decoded == [AGENT_VENDOR_DATA, own]


def test_the_same_inputs_give_the_same_bytes_at_any_time_in_any_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kwargs = {"vendor_data": "#!/bin/sh\necho hi\n"}
    first = _build(**kwargs)
    # Another moment, another local zone: pycdlib would stamp both into the image.
    monkeypatch.setattr(time, "time", lambda: 1_900_000_000.0)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        second = _build(**kwargs)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert second == first
    assert first != _build(vendor_data="#!/bin/sh\necho bye\n")
    assert first != _build(**kwargs, hostname="proxy-fra-2")


def test_timestamps_are_pinned_in_every_record(opened: list[Iso]) -> None:
    iso = _open(_build(), opened)
    assert iso.iso.pvd.volume_creation_date.record().startswith(b"2000010100000000")
    assert iso.iso.pvd.volume_modification_date.record().startswith(b"2000010100000000")
    for child in iso.iso.list_children(rr_path="/"):
        assert child.date.record() == bytes((100, 1, 1, 0, 0, 0, 0))


@pytest.mark.parametrize(
    "overrides",
    [
        {"instance_id": "a\ninstance-id: b"},
        {"hostname": "x: y"},
        {"hostname": ""},
        {"user_data": "#cloud-config\n"},
    ],
)
def test_refuses_inputs_that_would_corrupt_meta_data(overrides: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        _build(**overrides)


def test_seed_names() -> None:
    uid = "0123abcd-ef01-4a23-8b45-6789abcdef01"
    name = seed_iso_name("proxy-fra-1", installation_id="inst-a", uid=uid)
    assert name == f"proxy-fra-1_{installation_tag('inst-a')}_0123abcdef01-seed.iso"
    assert seed_volid("proxy-seeds", name) == f"proxy-seeds:iso/{name}"


@pytest.mark.parametrize("vm_name", ["proxy-a", "proxy-fra-1", "proxy-x-" + "9" * 55, "proxy-a-b"])
def test_seed_names_parse_back_whatever_dashes_the_name_holds(vm_name: str) -> None:
    uid = "fedcba98-7654-4321-8abc-def012345678"
    parsed = parse_seed_name(seed_iso_name(vm_name, installation_id="inst.a_b-1", uid=uid))
    assert parsed == SeedName(vm_name, installation_tag("inst.a_b-1"), "fedcba987654")
    assert not parsed.legacy
    assert parse_seed_name(legacy_seed_iso_name(vm_name)) == SeedName(vm_name)


def test_a_legacy_name_that_looks_tagged_is_never_read_as_the_new_form() -> None:
    """A proxy may be named ``x-deadbeef-0123456789ab``: its old-form seed stays old-form."""
    parsed = parse_seed_name("proxy-x-deadbeef-0123456789ab-seed.iso")
    assert parsed == SeedName("proxy-x-deadbeef-0123456789ab")
    assert parse_seed_name("not-a-seed.iso") is None
    assert parse_seed_name("proxy-A_deadbeef_0123456789ab-seed.iso") is None


def test_the_longest_seed_name_survives_the_upload_name_rule() -> None:
    name = seed_iso_name("proxy-" + "a" * 57, installation_id="i" * 64, uid="x")
    assert len(name) == 94
    assert re.fullmatch(r"[-a-zA-Z0-9_.]+\.iso", name)
