"""The API token and the CA bundle, read from the files a Cluster names (seed 000 entry 14).

The token file is read on every request, so rotating it needs no restart; the CA is read once
by the transport and cached (rotating it needs a restart, seed 000 entry 24). Nothing here
ever puts the secret or the CA's content into a message, a ``repr`` or a log line: errors
name the path and what is wrong with the file, never what it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from .errors import CAFileInvalid, CAFileMissing, CredentialsMalformed, CredentialsMissing

# pve-reference §2.1 (pve-access-control ``split_tokenid``): user is anything but whitespace,
# ``:`` and ``/``; realm and token name share ``$realm_regex``.
_TOKEN_ID = re.compile(
    r"(?P<user>[^\s:/]+)@(?P<realm>[A-Za-z][A-Za-z0-9.\-_]+)!(?P<name>[A-Za-z][A-Za-z0-9.\-_]+)"
)
# The secret is a UUID on a real node. Accept any printable ASCII without whitespace or
# ``;`` (the server cuts the header value at ``;``): anything else cannot travel in a header
# intact, so it is a malformed file rather than a 401 three seconds later.
_SECRET = re.compile(r"[!-:<-~]+")
# Printable ASCII other than ``%`` goes into the header as is; anything else is percent-encoded.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
# A token line is well under 200 bytes; a bigger file is not a token file.
_MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True)
class Token:
    """``USER@REALM!TOKENID`` and its secret. ``str``/``repr`` show the token id only."""

    token_id: str
    secret: str = field(repr=False)

    @property
    def user(self) -> str:
        """``user@realm``: what Proxmox reports as a task's ``user`` for this token."""
        return self.token_id.rsplit("!", 1)[0]

    def header(self) -> str:
        """The ``Authorization`` header value (pve-reference §2.1). Never log it.

        Proxmox URL-unescapes the value before splitting it, so a user name outside ASCII (or
        holding ``%``) travels percent-encoded; a header can carry nothing but Latin-1.
        """
        return f"PVEAPIToken={quote(self.token_id, safe=_HEADER_SAFE)}={self.secret}"

    def __str__(self) -> str:
        return self.token_id


def parse_token(text: str, *, source: str = "token") -> Token:
    """Parse ``USER@REALM!TOKENID=SECRET``; raise ``CredentialsMalformed`` naming ``source``.

    Split at the last ``=`` as Proxmox's ``verify_token`` does; surrounding whitespace and the
    trailing newline an editor adds are ignored.
    """
    line = text.strip()
    token_id, sep, secret = line.rpartition("=")
    if not sep:
        raise CredentialsMalformed(
            f"{source} does not hold USER@REALM!TOKENID=SECRET (no '=' separating the secret)"
        )
    if not _TOKEN_ID.fullmatch(token_id):
        raise CredentialsMalformed(
            f"{source} does not hold USER@REALM!TOKENID=SECRET (the token id before the last "
            "'=' is not USER@REALM!TOKENID)"
        )
    if not _SECRET.fullmatch(secret):
        raise CredentialsMalformed(
            f"{source} does not hold USER@REALM!TOKENID=SECRET (the secret after the last '=' "
            "is empty or holds whitespace, ';' or non-ASCII characters)"
        )
    return Token(token_id=token_id, secret=secret)


def read_token(path: str) -> Token:
    """Read the token file: missing is ``CredentialsMissing``, bad is ``CredentialsMalformed``.

    A missing file is transient (the secret may not have been mounted yet); one that exists but
    cannot be read or parsed needs an operator (seed 000 entry 13).
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_TOKEN_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CredentialsMissing(f"token file {path} does not exist") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CredentialsMalformed(f"token file {path} cannot be read: {reason}") from None
    source = f"token file {path}"
    if len(raw) > _MAX_TOKEN_FILE_BYTES:
        raise CredentialsMalformed(f"{source} is larger than {_MAX_TOKEN_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsMalformed(f"{source} is not UTF-8 text") from None
    if "\n" in text.strip():
        raise CredentialsMalformed(f"{source} holds more than one line")
    return parse_token(text, source=source)


def load_ca(path: str) -> str:
    """Read ``caFile`` and return its PEM text once it holds at least one X.509 certificate.

    Missing: ``CAFileMissing`` (transient: the file may still land); unreadable, not PEM, or
    PEM without a certificate: ``CAFileInvalid`` (permanent). Only certificates are kept, so a
    bundle that also carries comments or keys loads fine.
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise CAFileMissing(f"CA file {path} does not exist") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CAFileInvalid(f"CA file {path} cannot be read: {reason}") from None
    try:
        certs = x509.load_pem_x509_certificates(raw)
    except ValueError:
        raise CAFileInvalid(f"CA file {path} holds no valid PEM certificate") from None
    if not certs:
        raise CAFileInvalid(f"CA file {path} holds no PEM certificate")
    return "".join(cert.public_bytes(Encoding.PEM).decode("ascii") for cert in certs)
