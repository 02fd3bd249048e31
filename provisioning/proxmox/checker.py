"""Node health checks (seed 000 entry 16).

One check per configured node, all nodes at once, answered in config order. Each check makes
four requests (``/version``, the node's status, the ISO storage's status, the VM listing) and
ends with one reason an operator can act on. The reasons that are specific to Proxmox each
point at a different fix: ``CertificateInvalid`` (fix ``caFile`` or ``url``, not the host),
``CredentialsUnavailable`` (fix the token file, not Proxmox), ``StorageNotFound`` (fix the
storage on the node), ``TemplateNotFound`` (fix the template or the catalogue).

The token file is read once, before any request, with the transport's own reader: a missing
or malformed file answers ``CredentialsUnavailable`` for every node without a request, and the
token id (never the secret) goes into the details.

A round is bounded by its ``Deadline``: when it expires or is cancelled, every node still
being checked answers ``Timeout`` at once, with the details it had gathered; the requests in
flight are bounded by the same deadline and end on their own.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .api import Api
from .config import ProxmoxConfig
from .credentials import read_token
from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import (
    ApiError,
    CAFileInvalid,
    CAFileMissing,
    CredentialsMalformed,
    CredentialsMissing,
    ProxmoxError,
    RequestTimeout,
    TLSVerifyFailed,
    TransportError,
)

log = logging.getLogger("proxyhub.proxmox.checker")

Reason = Literal[
    "Reachable",
    "Timeout",
    "Unreachable",
    "Unauthorized",
    "Forbidden",
    "APIError",
    "CertificateInvalid",
    "CredentialsUnavailable",
    "StorageNotFound",
    "TemplateNotFound",
]

GIB = 1024**3
# pve-reference §2.3: ``Permission check failed (<acl path>, <privilege>)``.
_PERMISSION = re.compile(r"Permission check failed \(([^,]*), ([^)]*)\)")
# How often the round's waiter looks at the deadline's cancel flag while nodes are checked.
_WAKE_INTERVAL = 0.02


@dataclass
class NodeCheck:
    """The outcome for one node: ready only with ``Reachable``."""

    node: str
    ready: bool
    reason: Reason
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    duration: float = 0.0


class _Failed(Exception):
    """A check ended with a reason other than ``Reachable``."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


class _NodeRun:
    """One node's check as it progresses; read by the round when the deadline ends it."""

    def __init__(self, node: str, iso_storage: str, token_id: str | None) -> None:
        self.node = node
        self.lock = threading.Lock()
        self.details: dict[str, Any] = {"isoStorage": iso_storage}
        if token_id is not None:
            self.details["tokenID"] = token_id
        self.step = "starting"
        self.started = time.monotonic()
        self.result: NodeCheck | None = None

    def begin(self) -> None:
        """A worker picked the node up: its duration counts from here, not from the queue."""
        with self.lock:
            self.started = time.monotonic()

    def note(self, step: str | None = None, **details: Any) -> None:
        with self.lock:
            if step is not None:
                self.step = step
            self.details.update(details)

    def finish(self, reason: Reason, message: str) -> NodeCheck:
        with self.lock:
            if self.result is None:
                self.result = NodeCheck(
                    node=self.node,
                    ready=reason == "Reachable",
                    reason=reason,
                    message=message,
                    details=dict(self.details),
                    duration=round(time.monotonic() - self.started, 4),
                )
            return self.result

    def timeout_message(self) -> str:
        with self.lock:
            step = self.step
        return (
            f"the check of node {self.node} ran out of time while {step}: Proxmox did not "
            "answer in time; check the network path to the url and the node's load"
        )

    def timed_out(self) -> NodeCheck:
        return self.finish("Timeout", self.timeout_message())


def check(
    api: Api,
    config: ProxmoxConfig,
    *,
    deadline: Deadline | None = None,
    max_workers: int = 8,
) -> list[NodeCheck]:
    """Check every configured node; one ``NodeCheck`` per node, in ``config.nodes`` order."""
    deadline = deadline if deadline is not None else Deadline.never()
    try:
        token = read_token(config.token_file, root=config.credentials_dir)
    except CredentialsMissing:
        return _unavailable(
            config,
            f"the token file {config.token_file} does not exist: put the API token "
            "(USER@REALM!TOKENID=SECRET) there; fix the token file, not Proxmox",
        )
    except CredentialsMalformed as exc:
        return _unavailable(config, f"{exc}: fix the token file, not Proxmox")

    runs = [_NodeRun(node, config.iso_storage, token.token_id) for node in config.nodes]
    if _expired(deadline):
        return [_logged(run.timed_out()) for run in runs]

    pending = list(runs)
    pending_lock = threading.Lock()
    all_done = threading.Event()
    finished: list[_NodeRun] = []

    def worker() -> None:
        while True:
            with pending_lock:
                if not pending:
                    return
                run = pending.pop(0)
            run.begin()
            _check_node(api, config, run, deadline)
            with pending_lock:
                finished.append(run)
                if len(finished) == len(runs):
                    all_done.set()

    if runs:
        # Daemon threads: a request stuck in a transport that ignores the deadline must never
        # keep the round (or the process) from finishing.
        for index in range(max(1, min(max_workers, len(runs)))):
            threading.Thread(
                target=worker, name=f"proxmox-check-{config.name}-{index}", daemon=True
            ).start()
        while not all_done.is_set():
            if _expired(deadline):
                break
            left = deadline.remaining()
            wait = _WAKE_INTERVAL if left is None else min(_WAKE_INTERVAL, left)
            all_done.wait(wait)

    results = [run.result if run.result is not None else run.timed_out() for run in runs]
    return [_logged(_scrubbed(result, token.secret)) for result in results]


def _unavailable(config: ProxmoxConfig, message: str) -> list[NodeCheck]:
    """Every node answers ``CredentialsUnavailable``; no request was made."""
    runs = [_NodeRun(node, config.iso_storage, None) for node in config.nodes]
    return [_logged(run.finish("CredentialsUnavailable", message)) for run in runs]


def _expired(deadline: Deadline) -> bool:
    try:
        deadline.check()
    except (Cancelled, DeadlineExceeded):
        return True
    return False


def _scrubbed(result: NodeCheck, secret: str) -> NodeCheck:
    """The result with the token's secret blanked wherever an answer may have echoed it.

    Proxmox never echoes it, but a proxy in front of it, or a broken server, might put the
    request's header into an error text; results are stored and shown (seed 000 entry 14).
    """

    def clean(value: Any) -> Any:
        return value.replace(secret, "<redacted>") if isinstance(value, str) else value

    return NodeCheck(
        node=result.node,
        ready=result.ready,
        reason=result.reason,
        message=clean(result.message),
        details={key: clean(value) for key, value in result.details.items()},
        duration=result.duration,
    )


def _logged(result: NodeCheck) -> NodeCheck:
    log.info(
        "proxmox node checked",
        extra={
            "node": result.node,
            "reason": result.reason,
            "ready": result.ready,
            "duration": result.duration,
        },
    )
    return result


def _check_node(api: Api, config: ProxmoxConfig, run: _NodeRun, deadline: Deadline) -> None:
    """Entry 16's four requests for one node; the first failure decides the reason."""
    try:
        _run_steps(api, config, run, deadline)
    except _Failed as failed:
        run.finish(failed.reason, failed.message)
    except Exception:
        # A bug or an answer of a shape nobody expected: this node reports it, the others
        # are unaffected.
        log.exception("proxmox node check failed unexpectedly", extra={"node": run.node})
        with run.lock:
            step = run.step
        run.finish("APIError", f"the check of node {run.node} failed unexpectedly while {step}")


def _run_steps(api: Api, config: ProxmoxConfig, run: _NodeRun, deadline: Deadline) -> None:
    node, storage = run.node, config.iso_storage

    run.note("reading /version")
    version = _request(lambda: api.version(deadline=deadline), run, config, "version")
    run.note(pveVersion=str(version.get("version", "")))

    run.note(f"reading the status of node {node}")
    status = _request(lambda: api.node_status(node, deadline=deadline), run, config, "node")
    kernel = _kernel(status)
    if kernel:
        run.note(kernel=kernel)
    mem_free = _mem_free(status)
    if mem_free is not None:
        # Placement sends a proxy without a zone to the ready node with the most free memory
        # (healthchecks); the check reads this answer anyway, so it costs no request.
        run.note(memFreeBytes=mem_free)

    run.note(f"reading the status of storage {storage}")
    storage_status = _request(
        lambda: api.storage_status(node, storage, deadline=deadline),
        run,
        config,
        "storage",
    )
    avail = storage_status.get("avail")
    if isinstance(avail, int | float) and not isinstance(avail, bool):
        run.note(isoStorageAvailGiB=round(avail / GIB, 2))
    storage_problem = _storage_problem(storage_status)
    if storage_problem:
        raise _Failed("StorageNotFound", _storage_message(node, storage, storage_problem))

    run.note("reading /cluster/resources")
    resources = _request(
        lambda: api.cluster_resources(type="vm", deadline=deadline), run, config, "resources"
    )
    present, problems = _templates(config, resources)
    run.note(templates=f"{present}/{len(config.templates)}")
    if problems:
        raise _Failed(
            "TemplateNotFound",
            f"{'; '.join(problems)}: fix the template in Proxmox or the cluster's catalogue",
        )

    run.finish(
        "Reachable",
        f"node {node} answers; storage {storage} is active with ISO content; "
        f"{present}/{len(config.templates)} templates present",
    )


def _request(
    call: Callable[[], dict[str, Any] | list[dict[str, Any]]],
    run: _NodeRun,
    config: ProxmoxConfig,
    what: Literal["version", "node", "storage", "resources"],
) -> Any:
    """Make one request; turn its failure into the reason entry 16 gives it."""
    try:
        return call()
    except (DeadlineExceeded, Cancelled, RequestTimeout):
        # A request that ran out of its own timeout is a Timeout too (entry 16).
        raise _Failed("Timeout", run.timeout_message()) from None
    except ApiError as err:
        raise _api_failure(err, run, config, what) from None
    except (TLSVerifyFailed, CAFileInvalid, CAFileMissing) as err:
        raise _Failed(
            "CertificateInvalid",
            f"{err}: fix caFile or url (the url's host must be in the node certificate), "
            "not the host",
        ) from None
    except (CredentialsMissing, CredentialsMalformed) as err:
        raise _Failed("CredentialsUnavailable", f"{err}: fix the token file, not Proxmox") from None
    except (TransportError, ConnectionError) as err:
        # ConnectFailed and every other network failure: the node did not answer.
        raise _Failed(
            "Unreachable",
            f"cannot reach Proxmox at {config.url} ({err}): check that the node is up and "
            "reachable from the workers",
        ) from None
    except ProxmoxError as err:
        raise _Failed("APIError", f"Proxmox failed while {run.step}: {err}") from None


def _api_failure(
    err: ApiError,
    run: _NodeRun,
    config: ProxmoxConfig,
    what: Literal["version", "node", "storage", "resources"],
) -> _Failed:
    status = err.status
    token = run.details.get("tokenID", "the token")
    if status == 401:
        return _Failed(
            "Unauthorized",
            f"Proxmox refused {token} (401 {err.message}): fix the token file (wrong token id "
            "or secret, or the token expired or was removed), not the node",
        )
    if status == 403:
        found = _PERMISSION.search(err.message)
        need = f"{found.group(2)} on {found.group(1)}" if found else "a privilege"
        return _Failed(
            "Forbidden",
            f"{token} lacks {need} (403 {err.message}): grant it to the token's role",
        )
    if status in (595, 596):
        return _Failed(
            "Unreachable",
            f"Proxmox could not reach node {run.node} ({status} {err.message}): bring the "
            "node back or fix the cluster network",
        )
    if what == "storage" and (status == 500 or (status == 400 and "storage" in err.errors)):
        # Entry 16: any 500 from the storage status counts as missing, whatever its wording
        # (not there, not enabled on this node, offline); a 400 is Proxmox's "No such storage."
        return _Failed(
            "StorageNotFound",
            _storage_message(run.node, config.iso_storage, f"Proxmox says: {err}"),
        )
    return _Failed("APIError", f"Proxmox answered {err} while {run.step}")


def _kernel(status: dict[str, Any]) -> str:
    current = status.get("current-kernel")
    if isinstance(current, dict) and current.get("release"):
        return str(current["release"])
    # Older nodes only have ``kversion``: ``Linux 6.8.12-4-pve #1 SMP ...``.
    parts = str(status.get("kversion", "")).split()
    return parts[1] if len(parts) > 1 else ""


def _mem_free(status: dict[str, Any]) -> int | None:
    """Bytes a new VM can use: ``memory.available`` (page cache counts as free), else ``free``.

    pve-reference §7.3: ``memory`` holds ``total``, ``used``, ``free`` and ``available``.
    """
    memory = status.get("memory")
    if not isinstance(memory, dict):
        return None
    for key in ("available", "free"):
        value = memory.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def _storage_problem(status: dict[str, Any]) -> str:
    if not status.get("enabled", 1) or not status.get("active"):
        return "it is not active on this node"
    content = {c.strip() for c in str(status.get("content", "")).split(",")}
    if "iso" not in content:
        return "it does not allow ISO content"
    return ""


def _storage_message(node: str, storage: str, problem: str) -> str:
    return (
        f"isoStorage {storage} on node {node}: {problem}; fix the storage on the node (it "
        "must exist, be enabled and active there and allow ISO content), or set isoStorage"
    )


def _templates(config: ProxmoxConfig, resources: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """How many catalogue templates exist as templates, and what is wrong with the others."""
    by_vmid: dict[int, dict[str, Any]] = {}
    for resource in resources:
        try:
            by_vmid[int(resource.get("vmid", -1))] = resource
        except (TypeError, ValueError):
            continue
    present = 0
    problems: list[str] = []
    for key, ref in config.templates.items():
        entry = by_vmid.get(ref.vmid)
        if entry is None:
            # The listing silently leaves out what the token may not audit (pve-reference §2.4).
            problems.append(
                f"template {key} (VMID {ref.vmid}) does not exist (or the token lacks "
                f"VM.Audit on /vms/{ref.vmid}, which hides it)"
            )
        elif entry.get("type") != "qemu":
            problems.append(f"template {key} (VMID {ref.vmid}) is a container, not a VM template")
        elif "template" not in entry:
            # pve-reference §7.9: the flag is absent until pvestatd reports the guest.
            problems.append(
                f"template {key} (VMID {ref.vmid}) is listed without its template flag "
                f"(its node {entry.get('node', '?')} may be offline)"
            )
        elif int(entry.get("template") or 0) != 1:
            problems.append(f"template {key} (VMID {ref.vmid}) is a VM, not a template")
        else:
            present += 1
    return present, problems
