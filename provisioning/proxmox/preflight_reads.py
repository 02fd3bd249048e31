"""What a preflight may read, and how a read that got no answer is told (seed 003).

Seed 003's preflight makes "bounded, verified-TLS GET requests", and "an unavailable endpoint,
missing permission or insufficient metadata must not become a successful check". So every
request goes through ``read_only(api)``, whose transport refuses anything but GET before it
leaves, and every read is made through ``try_read``, which never raises for what Proxmox or the
network does: a 403, a node that does not answer, a timeout, a credentials or TLS problem or an
unexpected error becomes a ``Read`` without a value and with the reason in fixed words
(``_REASONS``), never Proxmox's own text. The checks (``preflight_checks.py``) turn such a read
into ``unknown``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .api import Api, Call, Response, Transport
from .config import ProxmoxConfig
from .credentials import MAX_CA_FILE_BYTES, MAX_TOKEN_FILE_BYTES
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import (
    ApiError,
    CAFileInvalid,
    CAFileMissing,
    CAFileRefused,
    CAFingerprintMismatch,
    CredentialsMalformed,
    CredentialsMissing,
    RequestTimeout,
    TLSVerifyFailed,
    TokenFileRefused,
    TransportError,
)
from .plan import Plan

# Why a read gave no answer, in words an operator can act on (fixed text, never Proxmox's).
_REASONS = {
    "denied": "the API token lacks a privilege to read it",
    "offline": "the node did not answer (offline or unreachable from the cluster)",
    "unauthorized": "Proxmox refused the API token",
    "credentials": "the token file is missing or malformed",
    "token_refused": "tokenFile is refused: it must be a regular file of at most "
    f"{MAX_TOKEN_FILE_BYTES} bytes inside the credentials directory (PROXYHUB_CREDENTIALS_DIR)",
    "ca_refused": "caFile is refused: it must be a regular file of at most "
    f"{MAX_CA_FILE_BYTES} bytes inside the credentials directory (PROXYHUB_CREDENTIALS_DIR)",
    "ca_untrusted": "caFile holds another CA than the one trusted for this url; an operator "
    "allowed to change the cluster's endpoint must trust it again",
    "tls": "the TLS connection to Proxmox could not be verified",
    "timeout": "the preflight ran out of its time budget before Proxmox answered",
    "unreachable": "Proxmox could not be reached",
    "rejected": "Proxmox answered with an unexpected error",
}


class WriteRefused(RuntimeError):
    """The preflight tried a request other than GET: a bug, stopped before it left."""


class _GetOnly:
    """A transport that passes GET requests on and refuses everything else."""

    def __init__(self, inner: Transport) -> None:
        self._inner = inner

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        if call.method.upper() != "GET":
            raise WriteRefused(f"the preflight may only read; refused {call.method} {call.path}")
        return self._inner.send(call, deadline=deadline)


def read_only(api: Api) -> Api:
    """``api`` with every request other than GET refused before it is sent."""
    return Api(_GetOnly(api.transport))


@dataclass(frozen=True)
class Read:
    """A read's answer, or why there is none (``failure`` is a key of ``_REASONS``)."""

    value: Any = None
    failure: str | None = None
    error: ApiError | None = None  # kept to recognise known answers; never shown

    @property
    def ok(self) -> bool:
        return self.failure is None

    def reason(self, need: str | None = None) -> str:
        if self.failure == "denied" and need:
            return f"the API token lacks {need}"
        return _REASONS.get(self.failure or "", _REASONS["rejected"])

    def param_error(self, name: str) -> bool:
        """Proxmox's 400 about one parameter (``No such storage.``, ``VM n already exists``)."""
        return self.error is not None and self.error.status == 400 and name in self.error.errors


def try_read(fetch: Callable[[], Any]) -> Read:
    try:
        return Read(fetch())
    except ApiError as err:
        if err.status == 403:
            kind = "denied"
        elif err.status in (595, 596):
            kind = "offline"
        elif err.status == 401:
            kind = "unauthorized"
        else:
            kind = "rejected"
        return Read(failure=kind, error=err)
    except (DeadlineExceeded, Cancelled, RequestTimeout):
        return Read(failure="timeout")
    except TokenFileRefused:
        return Read(failure="token_refused")
    except CAFileRefused:
        return Read(failure="ca_refused")
    except CAFingerprintMismatch:
        return Read(failure="ca_untrusted")
    except (CredentialsMissing, CredentialsMalformed):
        return Read(failure="credentials")
    except (TLSVerifyFailed, CAFileMissing, CAFileInvalid):
        return Read(failure="tls")
    except (TransportError, ConnectionError):
        return Read(failure="unreachable")


class PreflightReads:
    """The reads of one preflight run, each made at most once: the checks share them, so a
    listing or a config is asked for once however many checks look at it."""

    def __init__(self, api: Api, config: ProxmoxConfig, plan: Plan, deadline: Deadline) -> None:
        self.api = api
        self.config = config
        self.plan = plan
        self.deadline = deadline
        self._cache: dict[str, Read] = {}

    def _once(self, key: str, fetch: Callable[[], Any]) -> Read:
        if key not in self._cache:
            self._cache[key] = try_read(fetch)
        return self._cache[key]

    def _listing(self) -> Read:
        return self._once(
            "listing", lambda: self.api.cluster_resources(type="vm", deadline=self.deadline)
        )

    def _entry(self, vmid: int) -> Mapping[str, Any] | None:
        listing = self._listing()
        if not listing.ok:
            return None
        for entry in listing.value:
            try:
                if int(entry.get("vmid", -1)) == vmid:
                    return dict(entry)
            except (TypeError, ValueError):
                continue
        return None

    def _template_node(self) -> str | None:
        entry = self._entry(self.plan.template_vmid)
        if entry is None or entry.get("type") != "qemu" or not entry.get("node"):
            return None
        return str(entry["node"])

    def _template_config(self) -> tuple[Mapping[str, str] | None, str]:
        """The template's config, or None and why it is not known (fixed text)."""
        vmid = self.plan.template_vmid
        listing = self._listing()
        if not listing.ok:
            return None, f"the VM listing could not be read: {listing.reason()}"
        node = self._template_node()
        if node is None:
            return None, f"template VM {vmid} was not found"
        read = self._once(
            "template_config",
            lambda: self.api.vm_config(node, vmid, deadline=self.deadline),
        )
        if not read.ok:
            return None, (
                f"its config could not be read: {read.reason(f'VM.Audit on /vms/{vmid}')}"
            )
        return read.value, ""

    def _storage_status(self, node: str, storage: str) -> Read:
        return self._once(
            f"storage:{node}:{storage}",
            lambda: self.api.storage_status(node, storage, deadline=self.deadline),
        )
