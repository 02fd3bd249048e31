"""Where the client may read the token and the CA from, and which CA it accepts (issue 11).

With a credentials directory, a ``tokenFile`` or ``caFile`` is read only when it resolves,
symlinks and ``..`` included, to a regular file inside it and within its size limit; a FIFO or
``/dev/zero`` must neither block nor fill memory. A CA whose fingerprint is not the trusted one
is refused before a request carries the token. ``responses`` proves nothing was sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import responses
import trustme

from provisioning.proxmox.api import Call
from provisioning.proxmox.credentials import (
    CA_FILE,
    MAX_CA_FILE_BYTES,
    MAX_TOKEN_FILE_BYTES,
    TOKEN_FILE,
    ca_fingerprint,
    inspect_confined,
    load_ca,
    read_token,
)
from provisioning.proxmox.errors import (
    CAFileMissing,
    CAFileRefused,
    CAFingerprintMismatch,
    CredentialsMissing,
    PermanentError,
    TokenFileRefused,
    classify,
)
from provisioning.proxmox.http import HttpTransport

SECRET = "5f0c6a1e-0b7d-4c8e-9a55-3f1d2e4b6c70"
TOKEN = f"proxyhub@pve!sim={SECRET}\n"
URL = "https://pve.example:8006"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The credentials directory, with a good token in it and a secret file beside it."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token").write_text(TOKEN)
    (tmp_path / "outside-token").write_text(TOKEN)
    return creds


def _fifo(root: Path) -> str:
    path = root / "fifo"
    os.mkfifo(path)
    return str(path)


def _big(root: Path) -> str:
    path = root / "big"
    path.write_bytes(b"a" * (MAX_CA_FILE_BYTES + 1))
    return str(path)


def _escaping_symlink(root: Path) -> str:
    link = root / "link"
    link.symlink_to(root.parent / "outside-token")
    return str(link)


# Each way a path may break the rules, and the words the refusal must use.
BREAKS: list[tuple[str, Callable[[Path], str], str]] = [
    ("outside", lambda r: str(r.parent / "outside-token"), "inside the credentials directory"),
    ("dot-dot", lambda r: f"{r}/../outside-token", "inside the credentials directory"),
    ("symlink", _escaping_symlink, "inside the credentials directory"),
    ("etc-hostname", lambda r: "/etc/hostname", "inside the credentials directory"),
    ("relative", lambda r: "creds/token", "absolute path"),
    ("fifo", _fifo, "is not a regular file"),
    ("directory", lambda r: str(r), "is not a regular file"),
    ("oversize", _big, "is larger than"),
]


@pytest.mark.parametrize(("case", "make", "words"), BREAKS, ids=[b[0] for b in BREAKS])
def test_a_token_or_ca_path_that_breaks_the_rules_is_refused_naming_the_field(
    root: Path, case: str, make: Callable[[Path], str], words: str
) -> None:
    path = make(root)
    with pytest.raises(TokenFileRefused) as token_refusal:
        read_token(path, root=str(root))
    with pytest.raises(CAFileRefused) as ca_refusal:
        load_ca(path, root=str(root))
    assert str(token_refusal.value).startswith("tokenFile ")
    assert str(ca_refusal.value).startswith("caFile ")
    assert words in str(token_refusal.value) and words in str(ca_refusal.value)
    assert SECRET not in str(token_refusal.value)
    # Permanent: an operator has to point the cluster elsewhere; retrying changes nothing.
    assert isinstance(classify("create", token_refusal.value), PermanentError)
    assert isinstance(classify("create", ca_refusal.value), PermanentError)


def test_a_path_outside_gets_one_answer_whether_it_exists_or_not(root: Path) -> None:
    """Someone who cannot read the worker's file system learns nothing from the refusal."""
    there = str(root.parent / "outside-token")
    absent = str(root.parent / "no-such-file")
    messages = []
    for path in (there, absent):
        with pytest.raises(TokenFileRefused) as refused:
            read_token(path, root=str(root))
        messages.append(str(refused.value).replace(path, "PATH"))
    assert messages[0] == messages[1]


def test_dev_zero_is_refused_without_reading_it() -> None:
    # Inside its own directory /dev/zero passes confinement; it is still no regular file.
    with pytest.raises(TokenFileRefused, match="not a regular file"):
        read_token("/dev/zero", root="/dev")
    with pytest.raises(CAFileRefused, match="not a regular file"):
        load_ca("/dev/zero", root="/dev")


def test_a_fifo_is_refused_even_without_a_credentials_directory(tmp_path: Path) -> None:
    """The regular-file check does not depend on confinement: the client used on its own
    must not hang on a FIFO either."""
    fifo = _fifo(tmp_path)
    with pytest.raises(TokenFileRefused, match="not a regular file"):
        read_token(fifo)


def test_a_file_inside_through_symlinks_that_stay_inside_is_read(root: Path) -> None:
    # Kubernetes mounts secrets as token -> ..data/token -> ..2024_01/token, all inside.
    (root / "..2024_01").mkdir()
    (root / "..2024_01" / "token").write_text(TOKEN)
    (root / "..data").symlink_to("..2024_01")
    (root / "mounted").symlink_to("..data/token")
    assert read_token(str(root / "mounted"), root=str(root)).secret == SECRET


def test_a_missing_file_inside_is_transient_and_limits_are_documented(root: Path) -> None:
    with pytest.raises(CredentialsMissing, match="tokenFile"):
        read_token(str(root / "later"), root=str(root))
    with pytest.raises(CAFileMissing, match="caFile"):
        load_ca(str(root / "later.pem"), root=str(root))
    assert inspect_confined(str(root / "later"), TOKEN_FILE, str(root)) is False
    assert inspect_confined(str(root / "token"), TOKEN_FILE, str(root)) is True
    assert (TOKEN_FILE.limit, CA_FILE.limit) == (MAX_TOKEN_FILE_BYTES, 1024 * 1024)
    too_long = root / "long-token"
    too_long.write_text("x" * (MAX_TOKEN_FILE_BYTES + 1))
    with pytest.raises(TokenFileRefused, match="larger than 4096 bytes"):
        read_token(str(too_long), root=str(root))


@responses.activate
def test_the_transport_sends_nothing_with_a_token_outside_the_directory(root: Path) -> None:
    responses.get(f"{URL}/api2/json/version", json={"data": {"version": "8.2"}})
    outside = HttpTransport(URL, str(root.parent / "outside-token"), credentials_dir=str(root))
    with pytest.raises(TokenFileRefused):
        outside.send(Call("version", "GET", "/version"), deadline=None)
    assert len(responses.calls) == 0
    inside = HttpTransport(URL, str(root / "token"), credentials_dir=str(root))
    assert inside.send(Call("version", "GET", "/version"), deadline=None).data == {"version": "8.2"}
    assert len(responses.calls) == 1


def _ca_file(root: Path, name: str) -> tuple[str, str]:
    ca = trustme.CA()
    path = root / name
    path.write_bytes(ca.cert_pem.bytes())
    return str(path), ca_fingerprint(load_ca(str(path), root=str(root)))


@responses.activate
def test_a_ca_other_than_the_trusted_one_is_refused_before_the_token_leaves(root: Path) -> None:
    responses.get(f"{URL}/api2/json/version", json={"data": {"version": "8.2"}})
    trusted_path, trusted = _ca_file(root, "ca.pem")
    _, other = _ca_file(root, "other.pem")
    # The file now holds another CA (swapped, or the node's CA was rotated).
    (root / "other.pem").replace(trusted_path)
    transport = HttpTransport(
        URL,
        str(root / "token"),
        ca_file=trusted_path,
        credentials_dir=str(root),
        ca_fingerprint=trusted,
    )
    with pytest.raises(CAFingerprintMismatch) as mismatch:
        transport.send(Call("version", "GET", "/version"), deadline=None)
    assert len(responses.calls) == 0
    assert trusted in str(mismatch.value) and other in str(mismatch.value)
    assert "BEGIN CERTIFICATE" not in str(mismatch.value)
    classified = classify("create", mismatch.value)
    assert isinstance(classified, PermanentError)
    assert "change_cluster_endpoint" in classified.remediation


def test_the_fingerprint_is_openssls_sha256_of_the_certificate(root: Path) -> None:
    ca = trustme.CA()
    path = root / "ca.pem"
    path.write_bytes(ca.cert_pem.bytes())
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    expected = cert.fingerprint(hashes.SHA256()).hex().upper()
    got = ca_fingerprint(load_ca(str(path), root=str(root)))
    assert got.replace(":", "") == expected
    assert len(got) == 95
