"""The simulator's state engine: one ``handle(SimRequest) -> SimResponse`` for every front end.

Each request goes through the steps pveproxy and pvedaemon take, in their order
(pve-reference §1.1):

1. authentication: no token → 401 ``No ticket``; a wrong one → 401 ``Authentication
   failed!``; both with an empty body, held back by the profile's 401 delay (§2.2);
2. route lookup against the official schema → 501 ``Method 'GET /x' not implemented``;
3. a GET or DELETE with a body → 501 ``Unexpected content for method 'DELETE'`` (plain text);
4. the endpoint's permission check → 403 ``Permission check failed (<path>, <priv>)``;
5. forwarding to the node in the path: an unknown node → 500 ``hostname lookup ...``, an
   offline one → 595 with an empty body (§1.4);
6. parameter verification → 400 ``Parameter verification failed.`` with ``errors``;
7. the handler → data, or 500 with the handler's ``die`` text.

Injected faults (``faults.py``) step in after the route is known. Every call is written to
the ledger. Time: tasks progress lazily from the clock (``simtasks.py``), so the engine has no
threads of its own; one re-entrant lock makes ``handle`` safe for the HTTPS server's threads.

The engine is Proxmox only: it answers ``/api2/json`` and knows nothing of the ``/_sim``
control surface, which ``control.py`` builds on top of it and ``simulator.py`` mounts beside
it.
"""

from __future__ import annotations

import hmac
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from . import (
    defaults,
    handlers_access,  # noqa: F401 - registers handlers
    handlers_agent,  # noqa: F401
    handlers_clone,  # noqa: F401
    handlers_cluster,  # noqa: F401
    handlers_create,  # noqa: F401
    handlers_lxc,  # noqa: F401
    handlers_qemu,  # noqa: F401
    handlers_storage,  # noqa: F401
    handlers_tasks,  # noqa: F401
    replies,
)
from .clock import ManualClock
from .faults import Faults, fault_response
from .ledger import Ledger, summarise
from .permissions import Permissions
from .profiles import Profile, get_profile
from .protocol import SimRequest, SimResponse
from .router import HANDLERS, Ctx, Reply, Sim
from .schema import RouteMatch, Schema
from .simtasks import Scheduler
from .state import Cluster, SimError

API_PREFIX = "/api2/json"
# pve-access-control ``split_tokenid`` (pve-reference §2.1).
_TOKEN_ID = re.compile(r"[^\s:/]+@[A-Za-z][A-Za-z0-9.\-_]+![A-Za-z][A-Za-z0-9.\-_]+")
_TOKEN_HEADER = re.compile(r"PVEAPIToken[= ]([^;]*)")
# POSTs that only read: they are never counted as mutations in the ledger.
_READS_BY_POST = frozenset(
    {
        "POST /nodes/{node}/qemu/{vmid}/agent/ping",
        "POST /nodes/{node}/qemu/{vmid}/agent",
    }
)


@dataclass
class _Outcome:
    response: SimResponse
    key: str | None = None
    path_params: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    status: int | None = None  # for the ledger when a fault replaced the handler's answer
    mutation: bool = False
    upid: str | None = None
    fault: str | None = None
    upload: dict[str, Any] | None = None


class Engine:
    """A Proxmox VE cluster in memory (DESIGN.md §7a). Thread-safe."""

    def __init__(
        self,
        *,
        profile: str | Profile = "instant",
        time_scale: float = 1.0,
        token_id: str = "proxyhub@pve!sim",  # noqa: S107 - an identity, not a secret
        token_secret: str | None = None,
        clock: Callable[[], float] | None = None,
        seed: int = 0,
        state: str = "default",
        node_task_limit: int | None = None,
    ) -> None:
        if not _TOKEN_ID.fullmatch(token_id):
            raise ValueError("token_id must look like USER@REALM!TOKENID")
        self.profile = get_profile(profile, time_scale)
        if node_task_limit is not None:
            # A cluster whose nodes take fewer (or more) tasks at once than the profile's.
            self.profile = self.profile.with_task_limit(node_task_limit)
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self.manual_clock = isinstance(self.clock, ManualClock)
        self.token_id = token_id
        self._secret = token_secret if token_secret is not None else str(uuid.uuid4())
        self.seed = seed
        self.state_name = state
        self.schema = Schema.default()
        self.ledger = Ledger()
        self._lock = threading.RLock()
        self._reset_state()

    # --- identity -----------------------------------------------------------------------

    @property
    def token(self) -> str:
        """``USER@REALM!TOKENID=SECRET``: what a token file holds."""
        return f"{self.token_id}={self._secret}"

    def set_token_secret(self, secret: str | None = None) -> str:
        """Rotate the secret (a new uuid4 when ``None``); returns the new full token."""
        with self._lock:
            self._secret = secret if secret is not None else str(uuid.uuid4())
            return self.token

    # --- state --------------------------------------------------------------------------

    def _reset_state(self) -> None:
        now = self.clock()
        cluster = Cluster(
            profile=self.profile,
            rng=random.Random(self.seed),
            epoch0=time.time(),
            clock0=now,
        )
        defaults.build(cluster, self.state_name, now)
        self.scheduler = Scheduler(lambda: self.profile.node_task_limit)
        self.permissions = Permissions(cluster.access)
        self.faults = Faults(random.Random(self.seed + 1))
        self.sim = Sim(cluster, self.scheduler, self.permissions, self.profile, self.manual_clock)

    def reset(self) -> None:
        """Back to the starting state: guests, tasks, faults, denials and the ledger."""
        with self._lock:
            self._reset_state()
            self.ledger.clear()

    @property
    def cluster(self) -> Cluster:
        return self.sim.cluster

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def now(self) -> float:
        return self.clock()

    def advance_tasks(self) -> None:
        """Let every task due by now finish (callers holding the lock may need it)."""
        with self._lock:
            self.scheduler.advance(self.clock())

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self.cluster.nodes)

    def default_template_vmid(self) -> int:
        """The good template: a template whose image ships the guest agent."""
        return defaults.TEMPLATE_VMID

    # --- requests -----------------------------------------------------------------------

    def handle(self, request: SimRequest) -> SimResponse:
        path = request.path.split("?", 1)[0]
        with self._lock:
            started = time.perf_counter()
            now = self.clock()
            self.scheduler.advance(now)
            outcome = self._api(request, path, now)
            self.scheduler.advance(self.clock())
            response = outcome.response
            rel = path[len(API_PREFIX) :] if path.startswith(API_PREFIX) else path
            self.ledger.record(
                time=now,
                method=request.method.upper(),
                key=outcome.key,
                path=unquote(rel),
                path_params=dict(outcome.path_params),
                params=summarise(
                    {k: v for k, v in outcome.params.items() if k not in outcome.path_params}
                ),
                status=outcome.status if outcome.status is not None else response.status,
                duration=time.perf_counter() - started,
                mutation=outcome.mutation,
                upid=outcome.upid,
                fault=outcome.fault,
                upload=outcome.upload,
            )
            return response

    def _api(self, request: SimRequest, path: str, now: float) -> _Outcome:
        method = request.method.upper()
        if not path.startswith(API_PREFIX + "/"):
            return _Outcome(replies.plain(501, "no such uri"))
        rel = path[len(API_PREFIX) :]
        match = self.schema.match(method, rel)
        outcome = _Outcome(replies.ok(None))
        if match is not None:
            outcome.key = match.key
            outcome.path_params = dict(match.path_params)

        user = self._authenticate(request.headers)
        if user is None or user.startswith("!"):
            reason = "No ticket" if user is None else "Authentication failed!"
            response = replies.empty(401, reason)
            response.delay = self.profile.auth_fail_delay
            outcome.response = response
            return outcome
        if match is None:
            outcome.response = _not_implemented(method, unquote(rel))
            return outcome
        if method in ("GET", "DELETE") and request.body_length > 0:
            outcome.response = replies.plain(501, f"Unexpected content for method '{method}'")
            return outcome

        raw, upload, bad = self._parameters(request, method, match)
        outcome.params = raw
        if upload is not None:
            outcome.upload = {"filename": upload[0], "bytes": len(upload[1])}
        if bad:
            outcome.response = replies.error(400, "Parameter verification failed.", bad)
            return outcome

        rule = self.faults.pick(method, match.key)
        if rule is not None and not rule.after_apply:
            outcome.response = fault_response(rule, match.path_params)
            outcome.fault = rule.kind
            return outcome

        outcome.response = self._dispatch(outcome, match, raw, upload, user, now)
        if rule is not None:
            outcome.status = outcome.response.status
            outcome.response = fault_response(rule, match.path_params)
            outcome.fault = rule.kind
        outcome.response.delay += self.faults.delay_for(method, match.key)
        return outcome

    def _parameters(
        self, request: SimRequest, method: str, match: RouteMatch
    ) -> tuple[dict[str, Any], tuple[str, bytes] | None, dict[str, str]]:
        """Query (and for POST/PUT the body, query winning), the upload, path conflicts."""
        params: dict[str, Any] = {}
        if method in ("POST", "PUT"):
            body = request.json_body if request.json_body is not None else request.form
            if isinstance(body, Mapping):
                params.update(body)
        params.update(request.query)
        upload = None
        if "filename" in request.files:
            name, data = request.files["filename"]
            upload = (name, data)
            params["filename"] = name
            # pveproxy's name for the staged upload; nothing is written there.
            token = self.cluster.rng.getrandbits(128)
            params["tmpfilename"] = f"/var/tmp/pveupload-{token:032x}"  # noqa: S108
        errors = {
            name: "duplicate parameter (already defined in URI) with conflicting values!"
            for name, value in match.path_params.items()
            if name in params and _text(params[name]) != value
        }
        params.update(match.path_params)
        return params, upload, errors

    def _dispatch(
        self,
        outcome: _Outcome,
        match: RouteMatch,
        raw: dict[str, Any],
        upload: tuple[str, bytes] | None,
        user: str,
        now: float,
    ) -> SimResponse:
        key = match.key
        entry = self.schema.entry(key)
        text = {k: _text(v) for k, v in raw.items()}
        try:
            perms = self.permissions.for_identity(user)
            perms.check_endpoint(entry.get("permissions") or {}, text)
            node = match.path_params.get("node")
            if node is not None and (entry.get("proxyto") == "node" or key.endswith("/upload")):
                self._forward(node)
            errors = self.schema.validate(key, raw)
            if errors:
                raise SimError.params(errors)
            handler = HANDLERS.get(key)
            if handler is None:
                # In the official schema but not simulated: say so the way pve-manager does.
                method, rel = key.split(" ", 1)
                for name, value in match.path_params.items():
                    rel = rel.replace("{" + name + "}", value)
                return _not_implemented(method, rel)
            ctx = Ctx(self.sim, now, user, key, params=text, upload=upload)
            result = handler(ctx)
        except _Unreachable as exc:
            return replies.empty(595, exc.reason)
        except SimError as exc:
            return replies.error(exc.status, exc.message, exc.errors)
        reply = result if isinstance(result, Reply) else Reply(result)
        response = replies.ok(reply.data, total=reply.total)
        response.delay = reply.wait
        outcome.mutation = not key.startswith("GET ") and key not in _READS_BY_POST
        if isinstance(reply.data, str) and reply.data.startswith("UPID:"):
            outcome.upid = reply.data
        return response

    def _forward(self, node: str) -> None:
        """pveproxy forwarding to the node that runs the endpoint (§1.4)."""
        target = self.cluster.nodes.get(node)
        if target is None:
            raise SimError(
                500,
                f"hostname lookup '{node}' failed - failed to get address info for: "
                f"{node}: Name or service not known",
            )
        if not target.online:
            raise _Unreachable("No route to host")

    def _authenticate(self, headers: Mapping[str, str]) -> str | None:
        """The token identity; ``None`` without a token; ``"!"`` for a wrong one."""
        header = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        found = _TOKEN_HEADER.search(header)
        if not found:
            return None
        token = unquote(found.group(1)).strip()
        token_id, sep, secret = token.rpartition("=")
        if sep and self.cluster.access.authenticate(token_id, secret):
            return token_id  # a token created through the API (access.py)
        if (
            not sep
            or not hmac.compare_digest(token_id.encode(), self.token_id.encode())
            or not hmac.compare_digest(secret.encode(), self._secret.encode())
        ):
            return "!"
        return token_id


def _not_implemented(method: str, path: str) -> SimResponse:
    return replies.error(501, f"Method '{method} {path}' not implemented", newline=False)


class _Unreachable(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _text(value: Any) -> str:
    """A parameter as the handler reads it: JSON booleans as ``1``/``0``, lists joined."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
