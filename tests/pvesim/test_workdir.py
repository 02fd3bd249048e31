"""The simulator's working directory: what a client finds there, and what survives a restart."""

from __future__ import annotations

import ipaddress
import json
import stat
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from pvesim.workdir import (
    parse_token,
    prepare_workdir,
    ready_line,
    write_catalogue,
)


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificates(path.read_bytes())[0]


def san(cert: x509.Certificate) -> set[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in names.get_values_for_type(x509.DNSName)} | {
        str(v) for v in names.get_values_for_type(x509.IPAddress)
    }


def test_a_missing_workdir_is_created_with_every_file(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path / "a" / "pvesim", "127.0.0.1")
    for path in (workdir.ca_file, workdir.cert_file, workdir.key_file, workdir.token_file):
        assert path.is_file(), path
        assert path.is_absolute()


def test_the_token_file_holds_one_proxmox_token_line(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path)
    text = workdir.token_file.read_text()
    assert text.count("\n") == 1
    assert parse_token(text) == (workdir.token_id, workdir.token_secret)
    assert workdir.token_id == "proxyhub@pve!sim"
    assert len(workdir.token_secret) == 36  # a UUID, as Proxmox's secrets are


def test_secrets_are_owner_only(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path)
    for path in (workdir.token_file, workdir.key_file, workdir.ca_key_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_secret_is_not_in_the_repr(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path)
    assert workdir.token_secret not in repr(workdir)


def test_the_certificate_covers_loopback_localhost_and_the_host(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path, "10.20.30.40")
    cert = load_cert(workdir.cert_file)
    assert {"127.0.0.1", "localhost", "10.20.30.40"} <= san(cert)
    cert.verify_directly_issued_by(load_cert(workdir.ca_file))


def test_a_restart_keeps_the_ca_and_the_token(tmp_path: Path) -> None:
    first = prepare_workdir(tmp_path, "127.0.0.1")
    saved_ca = first.ca_file.read_bytes()
    second = prepare_workdir(tmp_path, "pvesim.example")
    assert second.ca_file.read_bytes() == saved_ca
    assert (second.token_id, second.token_secret) == (first.token_id, first.token_secret)
    # A client that saved ca.pem on the first run trusts the second run's certificate.
    new_cert = load_cert(second.cert_file)
    new_cert.verify_directly_issued_by(x509.load_pem_x509_certificate(saved_ca))
    assert "pvesim.example" in san(new_cert)


def test_a_token_file_edited_by_hand_is_kept(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("ops@pam!ci=0f0e0d0c-1111-2222-3333-444455556666\n")
    workdir = prepare_workdir(tmp_path)
    assert (workdir.token_id, workdir.token_secret) == (
        "ops@pam!ci",
        "0f0e0d0c-1111-2222-3333-444455556666",
    )


@pytest.mark.parametrize("garbage", ["", "no-equals-sign", "user!tok=secret", "a@pve!t="])
def test_a_malformed_token_file_is_replaced(tmp_path: Path, garbage: str) -> None:
    (tmp_path / "token").write_text(garbage)
    workdir = prepare_workdir(tmp_path)
    assert parse_token(workdir.token_file.read_text()) == (
        workdir.token_id,
        workdir.token_secret,
    )


def test_a_damaged_ca_is_replaced(tmp_path: Path) -> None:
    first = prepare_workdir(tmp_path)
    first.ca_file.write_text("not a certificate")
    second = prepare_workdir(tmp_path)
    load_cert(second.cert_file).verify_directly_issued_by(load_cert(second.ca_file))


def test_parse_token_splits_at_the_last_equals_sign() -> None:
    # Proxmox splits at the last "=", so an "=" inside would land in the token id: invalid.
    assert parse_token("svc@pve!django=abc=def\n") is None
    assert parse_token("svc@pve!django=5c1f") == ("svc@pve!django", "5c1f")
    assert parse_token("svc@pve!1bad=5c1f") is None  # token names start with a letter


def test_the_catalogue_is_ready_for_import(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path)
    path = write_catalogue(
        workdir, url="https://127.0.0.1:40123", nodes=["pve1", "pve2", "pve3"], template_vmid=9001
    )
    [document] = list(yaml.safe_load_all(path.read_text()))
    assert document == {
        "apiVersion": "proxyhub/v1",
        "kind": "ProxmoxCluster",
        "name": "pvesim",
        "url": "https://127.0.0.1:40123",
        "tokenFile": str(workdir.token_file),
        "caFile": str(workdir.ca_file),
        "nodes": ["pve1", "pve2", "pve3"],
        "isoStorage": "proxy-seeds",
        "templates": {"debian-13": {"vmid": 9001}},
        "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10}},
    }
    assert workdir.token_secret not in path.read_text()


def test_the_ready_line_is_one_json_object(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path)
    line = ready_line(workdir, "https://127.0.0.1:40123")
    assert "\n" not in line
    assert json.loads(line) == {
        "url": "https://127.0.0.1:40123",
        "tokenFile": str(workdir.token_file),
        "caFile": str(workdir.ca_file),
        "catalogue": str(workdir.catalogue_file),
    }


def test_an_ipv6_host_is_in_the_certificate(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path, "::1")
    assert str(ipaddress.ip_address("::1")) in san(load_cert(workdir.cert_file))
