"""Proxmox failures: what the client raises, and how proxyhub classifies them.

Two layers, as in seed 000 entry 13:

* raw failures, raised by the transport: ``ApiError`` (Proxmox answered with an error status),
  ``TaskFailed`` (a task ended with an error exit status), and the transport failures below
  (``ConnectFailed``, ``RequestTimeout``, ``TLSVerifyFailed``, ``CredentialsMissing``, ...);
* classified failures, what the provider and everything above it deal in: ``PermanentError``
  (an operator must change something), ``TransientError`` (retry later) and ``NotFoundError``
  (the VM is gone). Each carries a remediation sentence an operator can act on.

No error text here ever includes a token, a request body, headers or a CA: ``ApiError`` holds
only the status, Proxmox's message and the per-parameter errors (seed 000 entry 14).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .deadline import Cancelled, DeadlineExceeded


class ProxmoxError(Exception):
    """Base of every failure raised by ``provisioning.proxmox``."""


# --- raw failures -------------------------------------------------------------------------


class ApiError(ProxmoxError):
    """Proxmox answered a request with an error status.

    ``message`` is the body's ``message`` without its trailing newline, or the HTTP reason
    phrase when the body has none (401, 595, 596). ``errors`` is the 400 body's map of
    parameter name to text.
    """

    def __init__(self, status: int, message: str, errors: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.message = message.rstrip("\n")
        self.errors: dict[str, str] = {k: str(v).rstrip("\n") for k, v in (errors or {}).items()}
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.status} {self.message}"
        if self.errors:
            detail = "; ".join(f"{k}: {v}" for k, v in sorted(self.errors.items()))
            text = f"{text} ({detail})"
        return text

    def __reduce__(self) -> tuple[type[ApiError], tuple[int, str, dict[str, str]]]:
        return (ApiError, (self.status, self.message, self.errors))


class TaskFailed(ProxmoxError):
    """A Proxmox task ended with an exit status other than ``OK`` or ``WARNINGS: n``."""

    def __init__(self, upid: str, exitstatus: str) -> None:
        self.upid = upid
        self.exitstatus = exitstatus
        super().__init__(f"task {upid} failed: {exitstatus}")

    def __reduce__(self) -> tuple[type[TaskFailed], tuple[str, str]]:
        return (TaskFailed, (self.upid, self.exitstatus))


class TransportError(ProxmoxError):
    """The request did not get a Proxmox answer (network, TLS, timeout, local files)."""


class ConnectFailed(TransportError):
    """TCP connect failed, or the connection was reset or closed mid-answer.

    ``before_send`` is true when the request certainly never left (connection refused, the
    dial timed out, the name did not resolve): only then is a failed mutation known not to
    have been applied.
    """

    def __init__(self, message: str, *, before_send: bool = False) -> None:
        self.before_send = before_send
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_connect_failed, (str(self), self.before_send))


def _connect_failed(message: str, before_send: bool) -> ConnectFailed:
    return ConnectFailed(message, before_send=before_send)


class RequestTimeout(TransportError):
    """A single request ran out of its own timeout (connect or read)."""


class TLSVerifyFailed(TransportError):
    """The server's certificate did not verify against the CA (or the host did not match)."""


class CredentialsMissing(TransportError):
    """The token file does not exist (yet): the secret may still land."""


class CredentialsMalformed(TransportError):
    """The token file exists but does not hold ``USER@REALM!TOKENID=SECRET``."""


class CAFileMissing(TransportError):
    """``caFile`` names a file that does not exist (yet)."""


class CAFileInvalid(TransportError):
    """``caFile`` exists but holds no PEM certificate."""


class TokenFileRefused(CredentialsMalformed):
    """``tokenFile`` names a path proxyhub may not read: outside the credentials directory,
    not a regular file, or too large (``credentials.read_confined``). Needs an operator."""


class CAFileRefused(CAFileInvalid):
    """``caFile`` names a path proxyhub may not read, for the reasons ``TokenFileRefused``
    lists. Needs an operator."""


class CAFingerprintMismatch(CAFileInvalid):
    """``caFile`` now holds another CA than the one trusted for the cluster's url: someone
    replaced it, or the node's CA was rotated. Trust must be given again by an operator
    allowed to change the endpoint, so a swapped CA never carries the token to another host."""


# --- classified failures ------------------------------------------------------------------


class ReplyLost(ProxmoxError):
    """A mutation was sent but its answer never came back (a reset, a read timeout, a 596).

    Proxmox may or may not have applied it: the outcome is *unknown* until a read settles it
    (seed 001: "a lost task result stays unknown"). ``Api`` raises it for every request that is
    not a GET, wrapping the transport's own failure, so the step machines' read-back runs
    before anything is sent again and the journal can say what happened.
    """

    def __init__(self, call: str, cause: BaseException) -> None:
        self.call = call
        self.cause = cause
        super().__init__(f"{call}: {cause}")

    def __reduce__(self) -> tuple[type[ReplyLost], tuple[str, BaseException]]:
        return (ReplyLost, (self.call, self.cause))


class ClassifiedError(ProxmoxError):
    """A failure with its class and what an operator should do about it.

    Two facts ride along for the control loop: ``unreachable`` when Proxmox could not be
    reached at all (the cluster's circuit breaker counts these), and ``reply_lost`` when a
    mutation may have been applied although its answer was lost (the operation is ``unknown``
    until the step's read-back settles it).
    """

    kind = "transient"

    def __init__(
        self,
        message: str,
        *,
        remediation: str = "",
        op: str = "",
        unreachable: bool = False,
        reply_lost: bool = False,
    ) -> None:
        self.message = message
        self.remediation = remediation
        self.op = op
        self.unreachable = unreachable
        self.reply_lost = reply_lost
        super().__init__(message)

    def __str__(self) -> str:
        if self.remediation:
            return f"{self.message}. {self.remediation}"
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild,
            (
                type(self),
                self.message,
                self.remediation,
                self.op,
                self.unreachable,
                self.reply_lost,
            ),
        )


def _rebuild(
    cls: type[ClassifiedError],
    message: str,
    remediation: str,
    op: str,
    unreachable: bool = False,
    reply_lost: bool = False,
) -> ClassifiedError:
    return cls(
        message, remediation=remediation, op=op, unreachable=unreachable, reply_lost=reply_lost
    )


class PermanentError(ClassifiedError):
    """Retrying cannot help: an operator must change the catalogue, Proxmox or a credential."""

    kind = "permanent"


class TransientError(ClassifiedError):
    """Retrying later is expected to succeed."""

    kind = "transient"


class NotFoundError(ClassifiedError):
    """The VM (or volume) does not exist."""

    kind = "not_found"


# Fixed substrings of Proxmox's 500 messages (pve-reference §3), matched in this order.
_DOES_NOT_EXIST = "does not exist"
_LOCKED = "VM is locked"
_ALREADY_EXISTS = "config file already exists"
_AGENT_NOT_RUNNING = "QEMU guest agent is not running"
_NO_AGENT = "No QEMU guest agent configured"
_VM_NOT_RUNNING = re.compile(r"^VM [0-9]+ is not running$")
_PRIVILEGE = re.compile(r"Permission check failed \(([^,]*), ([^)]*)\)")


def classify(op: str, err: BaseException) -> ClassifiedError:
    """Seed 000 entry 13, row by row: the class of a failure of operation ``op``.

    ``op`` is the provider operation (``create``, ``get``, ``delete``, ``list``, ``check``,
    ``power``...). A "does not exist" during ``create`` is transient, never not-found: a VM or
    volume vanished between two steps and the next attempt starts over.
    """
    if isinstance(err, ClassifiedError):
        return err
    if isinstance(err, ReplyLost):
        found = classify(op, err.cause)
        found.reply_lost = True
        if found.kind == "transient" and not found.remediation:
            found.remediation = (
                "the request may have been applied; the next step reads back what Proxmox "
                "holds before anything is sent again"
            )
        return found
    if isinstance(err, ApiError):
        return _classify_api(op, err)
    if isinstance(err, TaskFailed):
        return TransientError(
            f"Proxmox task failed: {err.exitstatus}",
            remediation="the next attempt retries it; the task log on the node has details",
            op=op,
        )
    if isinstance(err, TLSVerifyFailed):
        return PermanentError(
            f"TLS verification failed: {err}",
            remediation="fix caFile or url (the host must be in the node certificate), "
            "not the host",
            op=op,
        )
    if isinstance(err, CAFingerprintMismatch):
        return PermanentError(
            str(err),
            remediation="if the node's CA was replaced on purpose, an operator with the "
            'change_cluster_endpoint permission trusts the new one (the cluster action "Trust '
            'the current CA file", or import_catalogue again); otherwise restore caFile',
            op=op,
        )
    if isinstance(err, CAFileRefused | TokenFileRefused):
        return PermanentError(
            str(err),
            remediation="put the file inside PROXYHUB_CREDENTIALS_DIR and point the cluster at it",
            op=op,
        )
    if isinstance(err, CAFileInvalid):
        return PermanentError(
            f"caFile holds no PEM certificate: {err}",
            remediation="put the node's CA (e.g. /etc/pve/pve-root-ca.pem) in caFile",
            op=op,
        )
    if isinstance(err, CAFileMissing):
        return TransientError(
            f"caFile does not exist: {err}",
            remediation="mount or copy the CA file to the configured caFile path",
            op=op,
        )
    if isinstance(err, CredentialsMalformed):
        return PermanentError(
            "the token file is malformed",
            remediation="the token file must hold one line USER@REALM!TOKENID=SECRET",
            op=op,
        )
    if isinstance(err, CredentialsMissing):
        return TransientError(
            "the token file does not exist",
            remediation="put the API token in the configured tokenFile; it is read on "
            "every request, so no restart is needed",
            op=op,
        )
    if isinstance(err, RequestTimeout):
        return TransientError(f"Proxmox did not answer in time: {err}", op=op, unreachable=True)
    if isinstance(err, DeadlineExceeded):
        return TransientError(f"Proxmox did not answer in time: {err}", op=op)
    if isinstance(err, Cancelled):
        return TransientError("operation cancelled", op=op)
    if isinstance(err, ConnectFailed | TransportError | ConnectionError | EOFError):
        return TransientError(
            f"Proxmox unreachable: {err}",
            remediation="check that the url is reachable from the workers",
            op=op,
            unreachable=True,
        )
    return TransientError(f"unexpected failure: {type(err).__name__}: {err}", op=op)


def _classify_api(op: str, err: ApiError) -> ClassifiedError:
    status, message = err.status, err.message
    if status == 401:
        return PermanentError(
            f"Proxmox refused the API token (401 {message})",
            remediation="fix the token in tokenFile: the token id or its secret is wrong, "
            "or the token expired or was removed",
            op=op,
        )
    if status == 403:
        found = _PRIVILEGE.search(message)
        need = f" (needs {found.group(2)} on {found.group(1)})" if found else ""
        return PermanentError(
            f"Proxmox denied the request: {message}{need}",
            remediation="grant the missing privilege to the token's role "
            "(docs/operator-guide.md lists the least-privilege roles)",
            op=op,
        )
    if status == 400:
        return PermanentError(
            f"Proxmox rejected the request: {err}",
            remediation="a catalogue value or a template setting is invalid for Proxmox; "
            "fix the named parameter",
            op=op,
        )
    if 300 <= status < 400:
        # pveproxy never redirects an API call; a redirect means the url points at something
        # else (plain http, a reverse proxy's login page) and retrying cannot change that.
        return PermanentError(
            f"the url answered with a redirect instead of Proxmox ({err})",
            remediation="set url to the node's https://HOST:8006 address; redirects are "
            "not followed",
            op=op,
        )
    if 400 <= status < 500:
        return PermanentError(f"Proxmox will not accept the request: {err}", op=op)
    if status in (595, 596):
        return TransientError(
            f"Proxmox could not reach the node ({status} {message})",
            remediation="the node is down or unreachable from the cluster; it is retried",
            op=op,
        )
    if status == 500:
        if _DOES_NOT_EXIST in message:
            if op == "create":
                return TransientError(f"a VM or volume vanished during create: {message}", op=op)
            return NotFoundError(message, op=op)
        if _LOCKED in message:
            return TransientError(
                message, remediation="another Proxmox task holds the VM; it is retried", op=op
            )
        if _ALREADY_EXISTS in message:
            return TransientError(message, remediation="the VMID was taken; retried", op=op)
        if _AGENT_NOT_RUNNING in message or _NO_AGENT in message or _VM_NOT_RUNNING.match(message):
            return TransientError(message, op=op)
    return TransientError(f"Proxmox error: {err}", op=op)
