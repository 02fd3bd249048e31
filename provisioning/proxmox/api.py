"""The seam: one method per Proxmox endpoint proxyhub uses (seed 000 entry 17).

``Api`` turns each method into a ``Call`` (method, path template, path parameters, form
parameters, an optional upload) and hands it to a ``Transport``. Two transports exist:

* ``provisioning.proxmox.http.HttpTransport`` speaks HTTPS to a real node (or to the
  simulator's HTTPS server);
* ``SimTransport`` (``tests/support/simtransport.py``, a test double kept out of the product)
  hands the same ``Call`` to the simulator's engine in-process, the fast fake for unit tests.

Faults are handled where they happen (issue 16). A read (GET) that meets a transient fault of the
infrastructure (a reset connection, a 5xx of a busy or unreachable pveproxy) is sent again at
once, then after short jittered pauses, up to ``ReadRetry.retries`` times: reads change nothing,
so repeating them is always safe, and a step no longer fails because one of its several reads
met a hiccup. A mutation is never repeated here: when its answer is lost after it was sent, the
failure is raised as ``ReplyLost`` so the step machine reads back what Proxmox holds before it
sends anything again (seed 000's "what a retry finds", seed 001's receipts).

Because both transports receive the very same ``Call``, what the simulator validates is
exactly what the client would send. Every method takes a keyword-only ``deadline``; the
transport bounds each request by it.

Logging (seed 000 entry 20): one INFO line per call with the call name, node, vmid, storage,
upid, duration and HTTP status (on failure Proxmox's message); parameters at DEBUG with
``description`` shortened and upload bodies never logged.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from .deadline import Cancelled, Deadline, DeadlineExceeded
from .errors import ApiError, ConnectFailed, ProxmoxError, ReplyLost, RequestTimeout, classify
from .spans import RequestSpan, request_span

log = logging.getLogger("proxyhub.proxmox.api")

# Path parameters that identify what a call is about, logged on every INFO line.
_LOGGED_PATH_KEYS = ("node", "vmid", "storage", "upid", "volume")
# Parameters whose values are logged only by length, even at DEBUG.
_SHORTENED_PARAMS = frozenset({"description"})


@dataclass(frozen=True)
class Upload:
    """A file for ``POST .../upload``. Its content is never logged or shown."""

    filename: str
    content: bytes = field(repr=False)


@dataclass(frozen=True)
class Call:
    """One request to Proxmox, before any transport sees it.

    ``path`` is the template exactly as in the official schema (``/nodes/{node}/qemu/{vmid}``),
    which is also the key the simulator validates against. ``params`` are already encoded as
    Proxmox's form encoding wants them (booleans ``1``/``0``, integers as decimal text).
    """

    name: str
    method: str
    path: str
    path_params: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    upload: Upload | None = None

    @property
    def schema_key(self) -> str:
        return f"{self.method} {self.path}"

    def url_path(self) -> str:
        """The concrete path, every parameter percent-encoded (UPIDs and volids hold ``:``)."""
        out = self.path
        for key, value in self.path_params.items():
            out = out.replace("{" + key + "}", quote(str(value), safe=""))
        return out


class Transport(Protocol):
    """Executes a ``Call`` and returns the envelope's ``data`` or raises a ``ProxmoxError``.

    The result is a ``Response`` so the seam can log the HTTP status; a transport raises
    ``ApiError`` for an error status and a ``TransportError`` subclass for everything that
    never got an answer.
    """

    def send(self, call: Call, *, deadline: Deadline | None) -> Response: ...


@dataclass(frozen=True)
class Response:
    status: int
    data: Any
    total: int | None = None


def _bool(value: bool) -> str:
    return "1" if value else "0"


def _str_values(config: Mapping[str, Any]) -> dict[str, str]:
    """Render a config as strings: ``cores`` arrives as a number, ``memory`` as a string."""
    return {str(k): ("" if v is None else str(v)) for k, v in config.items()}


@dataclass(frozen=True)
class ReadRetry:
    """How often a GET that met a transient fault is sent again before its failure stands.

    The pause is sized to the fault. A dropped connection or a 5xx of a pveproxy that could not
    reach its node is sent again at once: waiting would not help, and in a worker every pause
    delays every other operation it drives. Contention (a busy pveproxy answering 500 ``got
    timeout`` or ``got no worker upid``) is given ``pause`` seconds, doubling, with jitter so
    workers do not retry in step; the first retry still goes at once. A retry never waits past
    the caller's deadline. Slow failures (a request that timed out) are not retried in place:
    they already spent their time, and an unreachable cluster is the circuit breaker's.
    """

    retries: int = 0
    pause: float = 0.2

    def delay(self, retry: int, failure: BaseException | None = None) -> float:
        """The pause before retry number ``retry`` (1-based) after ``failure``."""
        if retry <= 1 or not contention(failure):
            return 0.0
        return self.pause * (2 ** (retry - 2)) * random.uniform(0.5, 1.0)  # jitter, not a secret


def contention(failure: BaseException | None) -> bool:
    """Whether Proxmox answered that it is too busy right now (a lock or a worker it waited
    for in vain): the one kind of fault a short pause before the next try helps with."""
    if isinstance(failure, ApiError) and failure.status == 500:
        return any(text in failure.message for text in (*_RETRYABLE_500, "can't lock file"))
    return False


NO_READ_RETRY = ReadRetry()

# 5xx answers of an overloaded or briefly unreachable pveproxy (research/reliability.md §0.6):
# a GET that met one is worth sending again at once.
_RETRYABLE_STATUS = frozenset({502, 503, 504, 595, 596, 599})
_RETRYABLE_500 = ("got timeout", "got no worker upid")
# Statuses after which a mutation may have been applied though its answer was lost.
_REPLY_LOST_STATUS = frozenset({596, 599})


def retryable_read_failure(exc: BaseException) -> bool:
    """Whether a GET that failed with ``exc`` may be sent again at once."""
    if isinstance(exc, ConnectFailed):
        return True
    if isinstance(exc, ApiError):
        if exc.status in _RETRYABLE_STATUS:
            return True
        return exc.status == 500 and any(text in exc.message for text in _RETRYABLE_500)
    return False


def reply_may_be_lost(exc: BaseException) -> bool:
    """Whether a mutation that failed with ``exc`` may nevertheless have been applied."""
    if isinstance(exc, ConnectFailed):
        return not exc.before_send
    if isinstance(exc, RequestTimeout):
        return True
    return isinstance(exc, ApiError) and exc.status in _REPLY_LOST_STATUS


class Api:
    """Proxmox VE endpoints, one method each. Stateless apart from its transport.

    ``reads`` says how GETs meet transient faults (``ReadRetry``); ``label`` names the cluster
    on every log line, so per-cluster metrics can be kept from them.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        reads: ReadRetry = NO_READ_RETRY,
        label: str = "",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.transport = transport
        self.reads = reads
        self.label = label
        self._sleep = sleep

    # --- plumbing ---------------------------------------------------------------------

    def _send(self, call: Call, deadline: Deadline | None) -> Response:
        retry = 0
        while True:
            try:
                return self._send_once(call, deadline)
            except ProxmoxError as exc:
                if call.method != "GET":
                    if reply_may_be_lost(exc):
                        raise ReplyLost(call.name, exc) from exc
                    raise
                if retry >= self.reads.retries or not retryable_read_failure(exc):
                    raise
                retry += 1
                pause = self.reads.delay(retry, exc)
                left = deadline.remaining() if deadline is not None else None
                if left is not None and left <= pause:
                    raise
                log.info(
                    "proxmox api read retried",
                    extra={"call": call.name, "retry": retry, "pause": round(pause, 3)},
                )
                if pause:
                    self._sleep(pause)

    def _send_once(self, call: Call, deadline: Deadline | None) -> Response:
        with request_span(call, self.label) as span:
            return self._send_traced(call, deadline, span)

    def _send_traced(self, call: Call, deadline: Deadline | None, span: RequestSpan) -> Response:
        started = time.monotonic()
        ids = {k: call.path_params[k] for k in _LOGGED_PATH_KEYS if k in call.path_params}
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "proxmox api request",
                extra={"call": call.name, **ids, "params": _loggable_params(call)},
            )
        try:
            response = self.transport.send(call, deadline=deadline)
        except (ProxmoxError, Cancelled, DeadlineExceeded) as exc:
            fields: dict[str, Any] = {
                "call": call.name,
                **ids,
                **_work_fields(call),
                "duration": round(time.monotonic() - started, 4),
                "error_class": type(exc).__name__,
            }
            if isinstance(exc, ApiError):
                fields["http_status"] = exc.status
                fields["error"] = exc.message
            else:
                fields["error"] = str(exc)
            if self.label:
                fields["cluster"] = self.label
            fields["transient"] = classify(call.name, exc).kind == "transient"
            log.info("proxmox api call failed", extra=fields)
            span.failed(exc, exc.status if isinstance(exc, ApiError) else None)
            raise
        fields = {
            "call": call.name,
            **({"cluster": self.label} if self.label else {}),
            **ids,
            **_work_fields(call),
            "duration": round(time.monotonic() - started, 4),
            "http_status": response.status,
        }
        if isinstance(response.data, str) and response.data.startswith("UPID:"):
            fields["upid"] = response.data
        log.info("proxmox api call", extra=fields)
        span.answered(response.status, fields.get("upid"))
        return response

    def _data(self, call: Call, deadline: Deadline | None) -> Any:
        return self._send(call, deadline).data

    # --- cluster and nodes ------------------------------------------------------------

    def version(self, *, deadline: Deadline | None = None) -> dict[str, Any]:
        return dict(self._data(Call("version", "GET", "/version"), deadline) or {})

    def nodes(self, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        return list(self._data(Call("nodes", "GET", "/nodes"), deadline) or [])

    def node_status(self, node: str, *, deadline: Deadline | None = None) -> dict[str, Any]:
        call = Call("node_status", "GET", "/nodes/{node}/status", {"node": node})
        return dict(self._data(call, deadline) or {})

    def node_network(
        self, node: str, *, type: str | None = "any_bridge", deadline: Deadline | None = None
    ) -> list[dict[str, Any]]:
        """Network devices of a node; by default only bridges (for the preflight)."""
        params = {"type": type} if type else {}
        call = Call("node_network", "GET", "/nodes/{node}/network", {"node": node}, params)
        return list(self._data(call, deadline) or [])

    def cluster_resources(
        self, *, type: str = "vm", deadline: Deadline | None = None
    ) -> list[dict[str, Any]]:
        call = Call("cluster_resources", "GET", "/cluster/resources", params={"type": type})
        return list(self._data(call, deadline) or [])

    def cluster_nextid(self, *, vmid: int | None = None, deadline: Deadline | None = None) -> int:
        """The lowest free VMID, or ``vmid`` itself when free (400 when taken).

        Proxmox returns the id as a JSON string in practice; accept either.
        """
        params = {"vmid": str(vmid)} if vmid is not None else {}
        call = Call("cluster_nextid", "GET", "/cluster/nextid", params=params)
        return int(self._data(call, deadline))

    # --- storage ----------------------------------------------------------------------

    def storage_status(
        self, node: str, storage: str, *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        call = Call(
            "storage_status",
            "GET",
            "/nodes/{node}/storage/{storage}/status",
            {"node": node, "storage": storage},
        )
        return dict(self._data(call, deadline) or {})

    def storage_content(
        self,
        node: str,
        storage: str,
        *,
        content: str | None = None,
        vmid: int | None = None,
        deadline: Deadline | None = None,
    ) -> list[dict[str, Any]]:
        params: dict[str, str] = {}
        if content:
            params["content"] = content
        if vmid is not None:
            params["vmid"] = str(vmid)
        call = Call(
            "storage_content",
            "GET",
            "/nodes/{node}/storage/{storage}/content",
            {"node": node, "storage": storage},
            params,
        )
        return list(self._data(call, deadline) or [])

    def node_storages(self, node: str, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """The storages ``node`` can use, with ``content`` and ``shared`` (a GET per node)."""
        call = Call("node_storages", "GET", "/nodes/{node}/storage", {"node": node})
        return list(self._data(call, deadline) or [])

    def download_url(
        self,
        node: str,
        storage: str,
        *,
        url: str,
        filename: str,
        content: str,
        checksum: str,
        algorithm: str,
        deadline: Deadline | None = None,
    ) -> str:
        """The node fetches ``url`` into ``storage`` and checks the checksum: a ``download``
        task (pve-reference §7.8). Returns its UPID."""
        call = Call(
            "download_url",
            "POST",
            "/nodes/{node}/storage/{storage}/download-url",
            {"node": node, "storage": storage},
            {
                "url": url,
                "filename": filename,
                "content": content,
                "checksum": checksum,
                "checksum-algorithm": algorithm,
            },
        )
        return str(self._data(call, deadline))

    def upload_iso(
        self,
        node: str,
        storage: str,
        *,
        filename: str,
        content: bytes,
        deadline: Deadline | None = None,
    ) -> str:
        """Upload an ISO (multipart, text parts first; pve-reference §7.7). Returns a UPID."""
        call = Call(
            "upload_iso",
            "POST",
            "/nodes/{node}/storage/{storage}/upload",
            {"node": node, "storage": storage},
            {"content": "iso"},
            Upload(filename=filename, content=content),
        )
        return str(self._data(call, deadline))

    def delete_volume(
        self,
        node: str,
        storage: str,
        volume: str,
        *,
        delay: int | None = None,
        deadline: Deadline | None = None,
    ) -> str | None:
        """Delete a volume; an ``imgdel`` UPID (or None when ``delay`` saw it finish)."""
        params = {"delay": str(delay)} if delay is not None else {}
        call = Call(
            "delete_volume",
            "DELETE",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            {"node": node, "storage": storage, "volume": volume},
            params,
        )
        data = self._data(call, deadline)
        return None if data is None else str(data)

    # --- VMs --------------------------------------------------------------------------

    @staticmethod
    def _vm(node: str, vmid: int) -> dict[str, str]:
        return {"node": node, "vmid": str(vmid)}

    def vm_config(
        self, node: str, vmid: int, *, current: bool = False, deadline: Deadline | None = None
    ) -> dict[str, str]:
        """A VM's config with pending values merged (Proxmox's default), values as strings."""
        params = {"current": "1"} if current else {}
        call = Call(
            "vm_config", "GET", "/nodes/{node}/qemu/{vmid}/config", self._vm(node, vmid), params
        )
        return _str_values(self._data(call, deadline) or {})

    def set_vm_config(
        self,
        node: str,
        vmid: int,
        values: Mapping[str, str | int | bool],
        *,
        delete: list[str] | None = None,
        revert: list[str] | None = None,
        digest: str | None = None,
        deadline: Deadline | None = None,
    ) -> None:
        """``PUT .../config``: synchronous, applied under the VM's lock before returning.
        ``revert`` drops pending changes of those keys; ``digest`` makes Proxmox refuse the
        write when the config changed since it was read (pve-reference §7.13, §3.4)."""
        params = {k: _bool(v) if isinstance(v, bool) else str(v) for k, v in values.items()}
        if delete:
            params["delete"] = ",".join(delete)
        if revert:
            params["revert"] = ",".join(revert)
        if digest:
            params["digest"] = digest
        call = Call(
            "set_vm_config", "PUT", "/nodes/{node}/qemu/{vmid}/config", self._vm(node, vmid), params
        )
        self._data(call, deadline)

    def vm_pending(
        self, node: str, vmid: int, *, deadline: Deadline | None = None
    ) -> list[dict[str, Any]]:
        call = Call("vm_pending", "GET", "/nodes/{node}/qemu/{vmid}/pending", self._vm(node, vmid))
        return list(self._data(call, deadline) or [])

    def clone(
        self,
        node: str,
        vmid: int,
        *,
        newid: int,
        name: str,
        description: str | None = None,
        full: bool = True,
        storage: str | None = None,
        target: str | None = None,
        pool: str | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        """Clone template ``vmid`` to ``newid``. Returns the ``qmclone`` UPID (id = source).

        ``pool``: the clone joins that resource pool, and ``VM.Allocate`` on ``/pool/<pool>``
        then stands in for it on ``/vms/<newid>`` (schema permissions of the clone).
        """
        params = {"newid": str(newid), "name": name, "full": _bool(full)}
        if pool:
            params["pool"] = pool
        if description is not None:
            params["description"] = description
        if storage:
            params["storage"] = storage
        if target:
            params["target"] = target
        call = Call(
            "clone", "POST", "/nodes/{node}/qemu/{vmid}/clone", self._vm(node, vmid), params
        )
        return str(self._data(call, deadline))

    def create_vm(
        self, node: str, vmid: int, config: Mapping[str, Any], *, deadline: Deadline | None = None
    ) -> str:
        """``POST /nodes/{node}/qemu``: a new VM; disks may be imported (``import-from``,
        pve-reference §5.4). Returns the ``qmcreate`` UPID."""
        call = Call(
            "create_vm",
            "POST",
            "/nodes/{node}/qemu",
            {"node": node},
            {"vmid": str(vmid), **_str_values(config)},
        )
        return str(self._data(call, deadline))

    def convert_to_template(self, node: str, vmid: int, *, deadline: Deadline | None = None) -> str:
        """``POST .../template``: the VM becomes a template. Returns the ``qmtemplate`` UPID."""
        call = Call("template", "POST", "/nodes/{node}/qemu/{vmid}/template", self._vm(node, vmid))
        return str(self._data(call, deadline))

    def resize(
        self, node: str, vmid: int, *, disk: str, size: str, deadline: Deadline | None = None
    ) -> str:
        call = Call(
            "resize",
            "PUT",
            "/nodes/{node}/qemu/{vmid}/resize",
            self._vm(node, vmid),
            {"disk": disk, "size": size},
        )
        return str(self._data(call, deadline))

    def _power(
        self, action: str, node: str, vmid: int, params: dict[str, str], deadline: Deadline | None
    ) -> str:
        call = Call(
            action,
            "POST",
            "/nodes/{node}/qemu/{vmid}/status/" + action,
            self._vm(node, vmid),
            params,
        )
        return str(self._data(call, deadline))

    def start(self, node: str, vmid: int, *, deadline: Deadline | None = None) -> str:
        return self._power("start", node, vmid, {}, deadline)

    def stop(self, node: str, vmid: int, *, deadline: Deadline | None = None) -> str:
        return self._power("stop", node, vmid, {}, deadline)

    def shutdown(
        self,
        node: str,
        vmid: int,
        *,
        timeout: int = 60,
        force_stop: bool = False,
        deadline: Deadline | None = None,
    ) -> str:
        params = {"timeout": str(timeout), "forceStop": _bool(force_stop)}
        return self._power("shutdown", node, vmid, params, deadline)

    def reboot(
        self, node: str, vmid: int, *, timeout: int = 60, deadline: Deadline | None = None
    ) -> str:
        return self._power("reboot", node, vmid, {"timeout": str(timeout)}, deadline)

    def vm_status(
        self, node: str, vmid: int, *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        call = Call(
            "vm_status", "GET", "/nodes/{node}/qemu/{vmid}/status/current", self._vm(node, vmid)
        )
        return dict(self._data(call, deadline) or {})

    def destroy(
        self,
        node: str,
        vmid: int,
        *,
        purge: bool = True,
        destroy_unreferenced_disks: bool = True,
        deadline: Deadline | None = None,
    ) -> str:
        """``DELETE .../qemu/{vmid}`` with its options in the query string. A ``qmdestroy`` UPID."""
        params = {
            "purge": _bool(purge),
            "destroy-unreferenced-disks": _bool(destroy_unreferenced_disks),
        }
        call = Call("destroy", "DELETE", "/nodes/{node}/qemu/{vmid}", self._vm(node, vmid), params)
        return str(self._data(call, deadline))

    def agent_network_interfaces(
        self, node: str, vmid: int, *, deadline: Deadline | None = None
    ) -> list[dict[str, Any]]:
        """The guest agent's interfaces (the ``result`` list; tolerates the pre-7 error shape)."""
        call = Call(
            "agent_network_interfaces",
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
            self._vm(node, vmid),
        )
        data = self._data(call, deadline) or {}
        result = data.get("result", []) if isinstance(data, dict) else data
        if isinstance(result, dict) and "error" in result:
            # PVE 6 answered agent errors with 200 and an error object (pve-reference §3.3).
            desc = result["error"].get("desc", "guest agent error")
            raise ApiError(500, str(desc))
        return list(result or [])

    def agent_file_read(
        self, node: str, vmid: int, file: str, *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        """``GET .../agent/file-read``: a file of the guest through its agent, decoded
        (``content``, and ``truncated`` when the file is longer than Proxmox's 16 MiB limit).
        A file the guest does not have is the agent's error, raised as a 500 (pve-reference
        §3.3); the content is guest data and never logged (only the path is a parameter)."""
        call = Call(
            "agent_file_read",
            "GET",
            "/nodes/{node}/qemu/{vmid}/agent/file-read",
            self._vm(node, vmid),
            {"file": file},
        )
        data = self._data(call, deadline)
        return dict(data) if isinstance(data, dict) else {}

    # --- access control (bootstrap_cluster, with an administrator's token) -------------

    def pools(self, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """``GET /pools``: the pools the caller may audit (``poolid``, ``comment``)."""
        return list(self._data(Call("pools", "GET", "/pools"), deadline) or [])

    def create_pool(
        self, poolid: str, *, comment: str | None = None, deadline: Deadline | None = None
    ) -> None:
        params = {"poolid": poolid}
        if comment:
            params["comment"] = comment
        self._data(Call("create_pool", "POST", "/pools", params=params), deadline)

    def roles(self, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """``GET /access/roles``: ``roleid``, ``privs`` (comma-separated), ``special``."""
        return list(self._data(Call("roles", "GET", "/access/roles"), deadline) or [])

    def create_role(
        self, roleid: str, *, privs: list[str], deadline: Deadline | None = None
    ) -> None:
        call = Call(
            "create_role",
            "POST",
            "/access/roles",
            params={"roleid": roleid, "privs": ",".join(privs)},
        )
        self._data(call, deadline)

    def update_role(
        self, roleid: str, *, privs: list[str], deadline: Deadline | None = None
    ) -> None:
        """Set the role's privileges to exactly ``privs`` (``append`` left unset: replace)."""
        call = Call(
            "update_role",
            "PUT",
            "/access/roles/{roleid}",
            {"roleid": roleid},
            {"privs": ",".join(privs)},
        )
        self._data(call, deadline)

    def users(self, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """``GET /access/users?full=1``: users with their ``tokens``."""
        call = Call("users", "GET", "/access/users", params={"full": "1"})
        return list(self._data(call, deadline) or [])

    def create_user(
        self, userid: str, *, comment: str | None = None, deadline: Deadline | None = None
    ) -> None:
        """A user without a password: proxyhub only ever signs in with its token."""
        params = {"userid": userid}
        if comment:
            params["comment"] = comment
        self._data(Call("create_user", "POST", "/access/users", params=params), deadline)

    def user_tokens(self, userid: str, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """``GET /access/users/{userid}/token``: ``tokenid``, ``privsep``, ``comment``, ``expire``
        (never the secret: Proxmox returns it only once, at creation)."""
        call = Call("user_tokens", "GET", "/access/users/{userid}/token", {"userid": userid})
        return list(self._data(call, deadline) or [])

    def user_token(
        self, userid: str, tokenid: str, *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        call = Call(
            "user_token",
            "GET",
            "/access/users/{userid}/token/{tokenid}",
            {"userid": userid, "tokenid": tokenid},
        )
        return dict(self._data(call, deadline) or {})

    def create_token(
        self,
        userid: str,
        tokenid: str,
        *,
        privsep: bool = True,
        comment: str | None = None,
        deadline: Deadline | None = None,
    ) -> dict[str, Any]:
        """A new API token: ``full-tokenid``, ``info`` and ``value``, the secret, which Proxmox
        shows this once. The caller must not log the answer."""
        params = {"privsep": _bool(privsep)}
        if comment:
            params["comment"] = comment
        call = Call(
            "create_token",
            "POST",
            "/access/users/{userid}/token/{tokenid}",
            {"userid": userid, "tokenid": tokenid},
            params,
        )
        return dict(self._data(call, deadline) or {})

    def delete_token(self, userid: str, tokenid: str, *, deadline: Deadline | None = None) -> None:
        call = Call(
            "delete_token",
            "DELETE",
            "/access/users/{userid}/token/{tokenid}",
            {"userid": userid, "tokenid": tokenid},
        )
        self._data(call, deadline)

    def acl(self, *, deadline: Deadline | None = None) -> list[dict[str, Any]]:
        """``GET /access/acl``: ``path``, ``type`` (user, group, token), ``ugid``, ``roleid``,
        ``propagate``."""
        return list(self._data(Call("acl", "GET", "/access/acl"), deadline) or [])

    def set_acl(
        self,
        path: str,
        *,
        roles: list[str],
        users: list[str] | None = None,
        tokens: list[str] | None = None,
        propagate: bool = True,
        delete: bool = False,
        deadline: Deadline | None = None,
    ) -> None:
        """``PUT /access/acl``: grant ``roles`` on ``path`` to ``users`` and ``tokens`` (with
        ``delete``, take them away)."""
        params = {"path": path, "roles": ",".join(roles), "propagate": _bool(propagate)}
        if delete:
            params["delete"] = "1"
        if users:
            params["users"] = ",".join(users)
        if tokens:
            params["tokens"] = ",".join(tokens)
        self._data(Call("set_acl", "PUT", "/access/acl", params=params), deadline)

    def permissions(
        self, *, path: str | None = None, deadline: Deadline | None = None
    ) -> dict[str, dict[str, int]]:
        """``GET /access/permissions``: the caller's own effective privileges, path ->
        {privilege: propagate}."""
        params = {"path": path} if path else {}
        call = Call("permissions", "GET", "/access/permissions", params=params)
        data = self._data(call, deadline) or {}
        return {str(p): dict(v or {}) for p, v in dict(data).items()}

    # --- tasks ------------------------------------------------------------------------

    def task_status(
        self, node: str, upid: str, *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        call = Call(
            "task_status", "GET", "/nodes/{node}/tasks/{upid}/status", {"node": node, "upid": upid}
        )
        return dict(self._data(call, deadline) or {})

    def node_tasks(
        self,
        node: str,
        *,
        vmid: int | None = None,
        typefilter: str | None = None,
        userfilter: str | None = None,
        since: int | None = None,
        source: str = "active",
        limit: int = 50,
        deadline: Deadline | None = None,
    ) -> list[dict[str, Any]]:
        """Tasks of a node, newest first; by default only the running ones.

        This is how a step whose reply was lost finds its receipt again: the task it submitted
        is still listed, so the step polls it instead of submitting a second one; and how one
        look answers for every task of ours on a node (``task_board``). ``since``: tasks that
        started at or after this epoch second; ``userfilter``: a part of the task's user.
        """
        params = {"source": source, "limit": str(limit)}
        if vmid is not None:
            params["vmid"] = str(vmid)
        if typefilter:
            params["typefilter"] = typefilter
        if userfilter:
            params["userfilter"] = userfilter
        if since is not None:
            params["since"] = str(since)
        call = Call("node_tasks", "GET", "/nodes/{node}/tasks", {"node": node}, params)
        return list(self._data(call, deadline) or [])

    def task_log(
        self,
        node: str,
        upid: str,
        *,
        start: int = 0,
        limit: int = 0,
        deadline: Deadline | None = None,
    ) -> list[dict[str, Any]]:
        """Task log lines ``{"n", "t"}``; ``limit=0`` asks for everything."""
        call = Call(
            "task_log",
            "GET",
            "/nodes/{node}/tasks/{upid}/log",
            {"node": node, "upid": upid},
            {"start": str(start), "limit": str(limit)},
        )
        return list(self._data(call, deadline) or [])


def _work_fields(call: Call) -> dict[str, str]:
    """Entry 20: what a call works on beyond its path, on its INFO line: the new VM of a clone,
    the file of an upload. Python's log records reserve ``name`` and ``filename``, so the seed's
    ``name`` is ``vm_name`` (as on the provider's lines) and ``filename`` is ``upload_filename``."""
    out: dict[str, str] = {}
    if call.name == "clone":
        out["newid"] = call.params.get("newid", "")
        out["vm_name"] = call.params.get("name", "")
    if call.upload is not None:
        out["upload_filename"] = call.upload.filename
    return out


def _loggable_params(call: Call) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in call.params.items():
        out[key] = f"<{len(value)} chars>" if key in _SHORTENED_PARAMS else value
    if call.upload is not None:
        out["filename"] = call.upload.filename
        out["upload_bytes"] = str(len(call.upload.content))
    return out
