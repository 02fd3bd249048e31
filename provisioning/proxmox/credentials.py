"""The API token and the CA bundle, read from the files a Cluster names (seed 000 entry 14).

The token file is read on every request, so rotating it needs no restart; the CA is read once
by the transport and cached (rotating it needs a restart, seed 000 entry 24). Nothing here
ever puts the secret or the CA's content into a message, a ``repr`` or a log line: errors
name the field, the path and what is wrong with the file, never what it holds.

Where the files may be (issue 11): anyone who may edit a cluster could otherwise name any file
the worker can read as its ``tokenFile`` (and have it sent to a host of their choosing as the
``Authorization`` header), or learn from the answer whether a file exists. So when the caller
gives a credentials directory (``root``, proxyhub's ``PROXYHUB_CREDENTIALS_DIR``, passed in
through ``ProxmoxConfig.credentials_dir``), a path is read only when it is absolute and, after
``..`` and every symlink are resolved, inside that directory; a path outside it is refused with
one message before anything looks at it. Inside, only a regular file is opened (a FIFO or a
device such as ``/dev/zero`` would block or never end), without blocking, and only up to its
limit: ``MAX_TOKEN_FILE_BYTES`` for a token, ``MAX_CA_FILE_BYTES`` for a CA bundle.

``cryptography`` parses a CA bundle where one is read, not when this module is imported: the
process that starts a Celery worker never reads one, and whatever it loads each prefork pool
process carries too; the library costs about 7 MiB of memory (issue 12: the worker's memory).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from urllib.parse import quote

from .errors import (
    CAFileInvalid,
    CAFileMissing,
    CAFileRefused,
    CredentialsMalformed,
    CredentialsMissing,
    TokenFileRefused,
)

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
MAX_TOKEN_FILE_BYTES = 4096
# A CA bundle is a few KiB; the system bundle of a distribution is about 200 KiB. 1 MiB leaves
# room for any real bundle and bounds what one request's worker may hold in memory.
MAX_CA_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class FileRule:
    """One confined file field: its key, its size limit, what its failures raise (a missing
    file may still land, so for credentials it is transient; a refused one needs an operator),
    and how a refusal names the directory (``{root}`` is replaced by it)."""

    field: str
    limit: int
    missing: type[Exception]
    refused: type[Exception]
    root_name: str = "the credentials directory {root} (PROXYHUB_CREDENTIALS_DIR)"


TOKEN_FILE = FileRule("tokenFile", MAX_TOKEN_FILE_BYTES, CredentialsMissing, TokenFileRefused)
CA_FILE = FileRule("caFile", MAX_CA_FILE_BYTES, CAFileMissing, CAFileRefused)


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # one relative, one absolute
        return False


def allowed_text(rule: FileRule, root: str | None) -> str:
    """What the field may name, as every refusal says it."""
    where = " inside " + rule.root_name.format(root=root) if root else ""
    return (
        f"{rule.field} must be an absolute path to a regular file of at most {rule.limit} bytes"
        f"{where}, symlinks resolved"
    )


def resolve_confined(path: str, rule: FileRule, root: str | None) -> str:
    """The path to open: ``path`` with ``..`` and symlinks resolved, once it is inside ``root``.

    A path outside ``root`` (lexically, or once resolved) raises ``rule.refused`` with the same
    message whether or not it exists, and one that is lexically outside is not even looked at,
    so the answer tells nothing about files the caller could not read anyway. Without ``root``
    (the client used on its own, outside proxyhub) the path is returned as given.
    """
    if root is None:
        return path
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise _refused(path, rule, root)
    real_root = os.path.realpath(root)
    if not any(_inside(os.path.normpath(path), r) for r in {os.path.normpath(root), real_root}):
        raise _refused(path, rule, root)
    real = os.path.realpath(path)
    if not _inside(real, real_root):
        raise _refused(path, rule, root)
    return real


def _refused(path: str, rule: FileRule, root: str) -> Exception:
    return rule.refused(f"{allowed_text(rule, root)}; got {path!r}")


def _shape_problem(st: os.stat_result, rule: FileRule) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_size > rule.limit:
        return f"is larger than {rule.limit} bytes"
    return None


def inspect_confined(path: str, rule: FileRule, root: str | None) -> bool:
    """Whether ``path`` is there, without reading it: ``False`` when it does not exist (yet),
    ``True`` for a regular file within the limit; anything else raises ``rule.refused``.

    For validating a catalogue or a form: a file that lands later is allowed (the token is read
    on every request), a path that can never be read is not.
    """
    return _inspect_resolved(resolve_confined(path, rule, root), path, rule, root)


def _inspect_resolved(real: str, path: str, rule: FileRule, root: str | None) -> bool:
    """``inspect_confined`` of ``path``, already resolved to ``real``."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return False
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise rule.refused(f"{rule.field} {path} cannot be examined: {reason}") from None
    problem = _shape_problem(st, rule)
    if problem:
        raise rule.refused(f"{rule.field} {path} {problem}; {allowed_text(rule, root)}")
    return True


def read_confined(path: str, rule: FileRule, root: str | None) -> bytes:
    """The bytes of ``path`` under ``rule``: confined to ``root``, a regular file, at most
    ``rule.limit`` bytes. Missing raises ``rule.missing``, anything else wrong ``rule.refused``.

    The file is checked before it is opened and again through the open descriptor (it may have
    been replaced in between), opened with ``O_NONBLOCK`` so that a FIFO put there meanwhile
    cannot block, and read only up to one byte past the limit.
    """
    # Resolved once, not again by ``inspect_confined``: the token is read on every request,
    # and resolving it twice a read took 2 % of a busy worker's time (py-spy, issue 12).
    real = resolve_confined(path, rule, root)
    if not _inspect_resolved(real, path, rule, root):
        raise rule.missing(f"{rule.field} {path} does not exist")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if root is not None:
        # ``real`` has no symlink left; one swapped in since is refused, not followed.
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise rule.missing(f"{rule.field} {path} does not exist") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise rule.refused(f"{rule.field} {path} cannot be read: {reason}") from None
    chunks: list[bytes] = []
    try:
        problem = _shape_problem(os.fstat(fd), rule)
        left = 0 if problem else rule.limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except BlockingIOError:
        problem = "is not a regular file"
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror or type(exc).__name__}"
    finally:
        os.close(fd)
    if problem:
        raise rule.refused(f"{rule.field} {path} {problem}; {allowed_text(rule, root)}")
    raw = b"".join(chunks)
    if len(raw) > rule.limit:
        raise rule.refused(f"{rule.field} {path} is larger than {rule.limit} bytes")
    return raw


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


def read_token(path: str, *, root: str | None = None) -> Token:
    """Read ``tokenFile``: missing is ``CredentialsMissing``, bad is ``CredentialsMalformed``
    (``TokenFileRefused`` when the path breaks ``read_confined``'s rules under ``root``).

    A missing file is transient (the secret may not have been mounted yet); one that exists but
    cannot be read or parsed needs an operator (seed 000 entry 13).
    """
    raw = read_confined(path, TOKEN_FILE, root)
    source = f"tokenFile {path}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsMalformed(f"{source} is not UTF-8 text") from None
    if "\n" in text.strip():
        raise CredentialsMalformed(f"{source} holds more than one line")
    return parse_token(text, source=source)


def load_ca(path: str, *, root: str | None = None) -> str:
    """Read ``caFile`` and return its PEM text once it holds at least one X.509 certificate.

    Missing: ``CAFileMissing`` (transient: the file may still land); outside ``root``, not a
    regular file or over ``MAX_CA_FILE_BYTES``: ``CAFileRefused``; unreadable, not PEM, or PEM
    without a certificate: ``CAFileInvalid`` (all three permanent). Only certificates are kept,
    so a bundle that also carries comments or keys loads fine.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    raw = read_confined(path, CA_FILE, root)
    try:
        certs = x509.load_pem_x509_certificates(raw)
    except ValueError:
        raise CAFileInvalid(f"caFile {path} holds no valid PEM certificate") from None
    if not certs:
        raise CAFileInvalid(f"caFile {path} holds no PEM certificate")
    return "".join(cert.public_bytes(Encoding.PEM).decode("ascii") for cert in certs)


def ca_fingerprint(pem: str) -> str:
    """The SHA-256 of the bundle's certificates (DER, in order), as colon-separated hex.

    For a single certificate this is what ``openssl x509 -noout -fingerprint -sha256`` prints,
    so an operator can compare it with the node's CA. Never the CA itself: only this is stored
    and shown.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    certs = x509.load_pem_x509_certificates(pem.encode("ascii"))
    digest = hashlib.sha256(b"".join(c.public_bytes(Encoding.DER) for c in certs)).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2)).upper()
