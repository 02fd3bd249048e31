"""The production transport: the seam's ``Call`` over HTTPS to a Proxmox node (seed 000 entry 17).

What this module promises, with where each promise comes from:

* the token file is read on every request, so a rotated token is used by the next request
  without a restart (seed 000 entry 14); the CA is read once and cached (entry 24). Both are
  read only from inside ``credentials_dir`` when one is given (``credentials.read_confined``),
  and a CA whose fingerprint is not the one trusted for this url (``ca_fingerprint``) is
  refused, so neither a swapped file nor a changed url carries the token to another host;
* TLS verification cannot be changed by the environment: ``trust_env`` is off and ``verify``
  is passed on every request, because ``requests`` lets ``REQUESTS_CA_BUNDLE`` and
  ``CURL_CA_BUNDLE`` override ``Session.verify`` and proxy variables reroute requests;
* HTTP/1.1 over a keep-alive pool, one connect timeout and one request timeout (entry 18),
  no redirects and no retries (a mutation must never be sent twice by the transport);
* Proxmox's encoding rules (pve-reference §1.1, §7.7): GET/DELETE parameters in the query
  string, POST/PUT as a form, uploads as multipart with the text parts before the file part;
* errors carry the status and Proxmox's message only; exception texts are built here from the
  method, the path template and the class of failure, never from ``requests``' texts, which
  can embed the URL (entry 14). The token secret is scrubbed from anything the server echoes;
* a cancelled ``Deadline`` returns at once: the request runs on a small worker pool and the
  caller waits on either its completion or the deadline (entry 18: "a cancelled ctx cancels
  only that request"); the abandoned request ends at its own timeout.
"""

from __future__ import annotations

import logging
import os
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError

from .api import Api, Call, Response
from .credentials import Token, ca_fingerprint, load_ca, read_token
from .deadline import Cancelled, Deadline, DeadlineExceeded, effective
from .errors import (
    ApiError,
    CAFingerprintMismatch,
    ConnectFailed,
    RequestTimeout,
    TLSVerifyFailed,
)

log = logging.getLogger("proxyhub.proxmox.http")

API_PREFIX = "/api2/json"
USER_AGENT = "proxyhub"
# How often a waiting caller looks at its deadline's cancel flag while a request is in flight.
_CANCEL_POLL_SECONDS = 0.05
# The multipart text parts Proxmox's streaming parser expects first, in this order
# (pve-reference §7.7); any other text part follows them, the file part comes last.
_UPLOAD_TEXT_ORDER = ("content", "checksum-algorithm", "checksum")
# A plain-text error body is shown only by its first line, and only this much of it.
_MAX_PLAIN_MESSAGE = 300
_REDACTED = "<redacted>"


class _ProxmoxAdapter(HTTPAdapter):
    """A keep-alive pool whose certificate check uses the cached CA, never a path.

    ``requests`` would hand ``verify=<path>`` to urllib3, which re-reads the file for every new
    connection; with ``ca_pem`` set the pool gets the PEM text itself (``ca_cert_data``), so
    the CA is read once and a file that later vanishes changes nothing (seed 000 entry 24).
    """

    def __init__(self, *, pool_maxsize: int) -> None:
        self.ca_pem: str | None = None
        super().__init__(pool_connections=4, pool_maxsize=pool_maxsize, max_retries=0)

    def build_connection_pool_key_attributes(
        self,
        request: requests.PreparedRequest,
        verify: bool | str,
        cert: str | tuple[str, str] | None = None,
    ) -> tuple[Any, Any]:
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        if self.ca_pem is not None and verify is not False:
            kwargs: dict[str, Any] = dict(pool_kwargs)
            kwargs.pop("ca_certs", None)
            kwargs.pop("ca_cert_dir", None)
            kwargs.pop("ssl_context", None)
            kwargs["ca_cert_data"] = self.ca_pem
            kwargs["cert_reqs"] = "CERT_REQUIRED"
            return host_params, kwargs
        return host_params, pool_kwargs

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        if self.ca_pem is not None and verify is not False:
            # The pool already verifies against ca_cert_data; the base method would add the
            # path (or certifi's bundle) on top and widen what is trusted.
            conn.cert_reqs = "CERT_REQUIRED"
            conn.ca_certs = None
            conn.ca_cert_dir = None
            return
        super().cert_verify(conn, url, verify, cert)


@dataclass(frozen=True)
class _Prepared:
    """Everything a worker needs to send one call. ``headers`` holds the token: never log it."""

    method: str
    url: str
    headers: dict[str, str] = field(repr=False)
    body: bytes | None = field(repr=False)
    verify: bool | str
    timeout: tuple[float | None, float | None]


class HttpTransport:
    """``Transport`` over HTTPS with ``requests`` (one session, one keep-alive pool).

    ``url`` is the node's base URL (``https://pve1.example:8006``); ``/api2/json`` is appended.
    ``request_timeout`` bounds one request from the first byte sent to the last byte read
    (``requestTimeoutSeconds``; ``0`` means no bound besides the deadline); ``connect_timeout``
    bounds the TCP connect. ``credentials_dir`` confines ``token_file`` and ``ca_file``;
    ``ca_fingerprint``, when set, is the only CA accepted from ``ca_file`` (module docstring).
    Safe for concurrent use from many threads.
    """

    def __init__(
        self,
        url: str,
        token_file: str,
        ca_file: str | None = None,
        insecure: bool = False,
        request_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        pool_maxsize: int = 8,
        credentials_dir: str | None = None,
        ca_fingerprint: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("url must be https://HOST[:PORT]")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError("url must be https://HOST[:PORT] without path, query or user")
        if request_timeout < 0 or connect_timeout <= 0 or pool_maxsize < 1:
            raise ValueError("timeouts and pool size must be positive")
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.token_file = token_file
        self.ca_file = ca_file or None
        self.insecure = insecure
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.pool_maxsize = pool_maxsize
        self.credentials_dir = credentials_dir
        self.ca_fingerprint = ca_fingerprint or None
        # One lock for the lazily built session, worker pool and cached CA.
        self._lock = threading.RLock()
        self._ca_pem: str | None = None
        self._pid = -1
        self._session: requests.Session | None = None
        self._adapter: _ProxmoxAdapter | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._closed = False
        if insecure:
            log.warning(
                "TLS certificate verification is disabled for %s (insecureSkipTLSVerify); "
                "anyone on the path can read the API token",
                self.origin,
            )

    # --- lifecycle ----------------------------------------------------------------------

    def _state(self) -> tuple[requests.Session, futures.ThreadPoolExecutor]:
        """The session and worker pool of this process, built on first use.

        Rebuilt after a fork (Celery's prefork pool): the parent's worker threads do not exist
        in the child and its pooled sockets must not be shared.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("HttpTransport is closed")
            pid = os.getpid()
            if self._session is None or self._executor is None or self._pid != pid:
                adapter = _ProxmoxAdapter(pool_maxsize=self.pool_maxsize)
                adapter.ca_pem = self._ca_pem
                session = requests.Session()
                session.trust_env = False
                # Never send a cookie: a PVEAuthCookie would win over the token (§2.1).
                session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
                session.mount("https://", adapter)
                session.mount("http://", adapter)
                self._session, self._adapter, self._pid = session, adapter, pid
                self._executor = futures.ThreadPoolExecutor(
                    max_workers=max(8, 2 * self.pool_maxsize),
                    thread_name_prefix="proxmox-http",
                )
            return self._session, self._executor

    def close(self) -> None:
        """Drop pooled connections and stop the workers; requests in flight are abandoned."""
        with self._lock:
            self._closed = True
            if self._executor is not None and self._pid == os.getpid():
                self._executor.shutdown(wait=False, cancel_futures=True)
            if self._session is not None:
                self._session.close()
            self._session = self._executor = None

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- TLS ------------------------------------------------------------------------------

    def _verify(self) -> bool | str:
        """``verify`` for one request: the CA path, ``False`` only when insecure, else ``True``.

        The CA is loaded on first use and cached; a failure is not cached, so a CA file that
        lands later is picked up by the next request (missing is transient, seed 000 entry 13).
        """
        if self.insecure:
            return False
        if self.ca_file is None:
            return True
        if self._ca_pem is None:
            with self._lock:
                if self._ca_pem is None:
                    pem = load_ca(self.ca_file, root=self.credentials_dir)
                    found = ca_fingerprint(pem)
                    if self.ca_fingerprint is not None and found != self.ca_fingerprint:
                        raise CAFingerprintMismatch(
                            f"caFile {self.ca_file} holds a CA (SHA-256 {found}) other than "
                            f"the one trusted for {self.origin} (SHA-256 {self.ca_fingerprint})"
                        )
                    self._ca_pem = pem
                    if self._adapter is not None:
                        self._adapter.ca_pem = pem
        return self.ca_file

    # --- sending --------------------------------------------------------------------------

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        dl = effective(deadline)
        dl.check()  # expired or cancelled: nothing is sent
        token = read_token(self.token_file, root=self.credentials_dir)
        verify = self._verify()
        read_cap = dl.timeout(self.request_timeout) if self.request_timeout else dl.remaining()
        connect = self.connect_timeout if read_cap is None else min(self.connect_timeout, read_cap)
        prepared = self._prepare(call, token, verify, (connect, read_cap))
        session, executor = self._state()
        started: list[float] = []
        future = executor.submit(self._perform, session, call, prepared, token, started)
        return self._await(call, future, dl, started)

    def _await(
        self,
        call: Call,
        future: futures.Future[Response],
        dl: Deadline,
        started: list[float],
    ) -> Response:
        """Wait for the worker, returning early on cancel, deadline or the request timeout."""
        while True:
            wait = _CANCEL_POLL_SECONDS
            left = dl.remaining()
            if left is not None:
                wait = min(wait, left)
            if self.request_timeout and started:
                wait = min(wait, max(0.0, started[0] + self.request_timeout - time.monotonic()))
            done, _ = futures.wait([future], timeout=wait)
            if done:
                return future.result()
            if dl.cancelled:
                future.cancel()
                raise Cancelled(f"{call.method} {call.path}: cancelled while in flight")
            now_left = dl.remaining()
            if now_left is not None and now_left <= 0:
                future.cancel()
                raise DeadlineExceeded(f"{call.method} {call.path}: deadline exceeded")
            if (
                self.request_timeout
                and started
                and time.monotonic() - started[0] >= self.request_timeout
            ):
                raise RequestTimeout(
                    f"{call.method} {call.path}: no complete answer within "
                    f"{self.request_timeout:g} s"
                )

    def _prepare(
        self,
        call: Call,
        token: Token,
        verify: bool | str,
        timeout: tuple[float | None, float | None],
    ) -> _Prepared:
        url = self.origin + API_PREFIX + call.url_path()
        headers = {
            "Authorization": token.header(),
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        body: bytes | None = None
        method = call.method.upper()
        if call.upload is not None:
            boundary = "proxyhub-" + secrets.token_hex(16)
            body = _multipart(call.params, call.upload.filename, call.upload.content, boundary)
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        elif method in ("GET", "DELETE", "HEAD"):
            # A GET or DELETE with a body is refused with 501 (pve-reference §1.1).
            if call.params:
                url += "?" + _form(call.params)
        else:
            body = _form(call.params).encode("ascii")
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        return _Prepared(method, url, headers, body, verify, timeout)

    def _perform(
        self,
        session: requests.Session,
        call: Call,
        prepared: _Prepared,
        token: Token,
        started: list[float],
    ) -> Response:
        """Runs on a worker thread: send, read, and turn the outcome into ours."""
        started.append(time.monotonic())
        try:
            resp = session.request(
                prepared.method,
                prepared.url,
                data=prepared.body,
                headers=prepared.headers,
                timeout=prepared.timeout,
                verify=prepared.verify,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise _transport_error(call, exc) from None
        try:
            return _response(resp, token)
        finally:
            resp.close()


def http_api(
    url: str,
    token_file: str,
    *,
    ca_file: str | None = None,
    insecure: bool = False,
    request_timeout: float = 30.0,
    connect_timeout: float = 10.0,
    pool_maxsize: int = 8,
    credentials_dir: str | None = None,
    ca_fingerprint: str | None = None,
) -> Api:
    """The seam over HTTPS: what the provider uses against a real node."""
    return Api(
        HttpTransport(
            url,
            token_file,
            ca_file=ca_file,
            insecure=insecure,
            request_timeout=request_timeout,
            connect_timeout=connect_timeout,
            pool_maxsize=pool_maxsize,
            credentials_dir=credentials_dir,
            ca_fingerprint=ca_fingerprint,
        )
    )


# --- encoding -------------------------------------------------------------------------------


def _form(params: Mapping[str, str]) -> str:
    """Form/query encoding with ``%20`` for spaces, so no reader can take ``+`` for a space."""
    return urlencode(list(params.items()), quote_via=quote, safe="")


def _quote_filename(name: str) -> str:
    """A ``filename="..."`` value: quotes, backslashes and line breaks percent-encoded."""
    out = name
    for char, code in (("%", "%25"), ('"', "%22"), ("\\", "%5C"), ("\r", "%0D"), ("\n", "%0A")):
        out = out.replace(char, code)
    return out


def _multipart(params: Mapping[str, str], filename: str, content: bytes, boundary: str) -> bytes:
    """``multipart/form-data`` with the text parts first and the file part ``filename`` last.

    Built by hand because Proxmox's streaming parser needs that order (pve-reference §7.7) and
    ``requests`` puts its ``files`` wherever its own ordering rules say.
    """
    names = [k for k in _UPLOAD_TEXT_ORDER if k in params]
    names += [k for k in params if k not in _UPLOAD_TEXT_ORDER]
    chunks: list[bytes] = []
    for name in names:
        chunks.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
            + params[name].encode()
            + b"\r\n"
        )
    chunks.append(
        (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="filename"; '
            f'filename="{_quote_filename(filename)}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + b"\r\n"
    )
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks)


# --- decoding -------------------------------------------------------------------------------


def _response(resp: requests.Response, token: Token) -> Response:
    status = resp.status_code
    if 200 <= status < 300:
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict) or "data" not in payload:
            raise ApiError(status, "the answer is not a Proxmox JSON envelope")
        total = payload.get("total")
        return Response(status, payload["data"], total if isinstance(total, int) else None)
    message, errors = _error_details(resp)
    secret = token.secret
    raise ApiError(
        status, _scrub(message, secret), {k: _scrub(v, secret) for k, v in errors.items()}
    )


def _error_details(resp: requests.Response) -> tuple[str, dict[str, str]]:
    """Proxmox's ``message`` and ``errors`` from the body, else the reason phrase (§1.3)."""
    message = ""
    errors: dict[str, str] = {}
    body = resp.content or b""
    payload: Any = None
    if body.lstrip().startswith(b"{"):
        try:
            payload = resp.json()
        except ValueError:
            payload = None
    if isinstance(payload, dict):
        if isinstance(payload.get("message"), str):
            message = payload["message"].rstrip("\n")
        if isinstance(payload.get("errors"), dict):
            errors = {str(k): str(v).rstrip("\n") for k, v in payload["errors"].items()}
    if not message:
        message = (resp.reason or "").strip()
    if not message and payload is None and body:
        text = body.decode("utf-8", errors="replace").strip()
        message = text.splitlines()[0][:_MAX_PLAIN_MESSAGE] if text else ""
    if not message:
        try:
            message = HTTPStatus(resp.status_code).phrase
        except ValueError:
            message = f"HTTP {resp.status_code}"
    return message, errors


def _scrub(text: str, secret: str) -> str:
    """Remove the token secret from text the server sent back (a proxy may echo headers)."""
    if not secret:
        return text
    for form in {secret, quote(secret, safe="")}:
        text = text.replace(form, _REDACTED)
    return text


# --- failures -------------------------------------------------------------------------------


def _transport_error(call: Call, exc: requests.RequestException) -> Exception:
    """Our exception for a ``requests`` failure, with a text free of URL, headers and token."""
    where = f"{call.method} {call.path}"
    if isinstance(exc, requests.exceptions.SSLError):
        verify = _cert_verify_error(exc)
        if verify is not None:
            detail = verify.verify_message or "certificate verify failed"
            return TLSVerifyFailed(f"{where}: TLS certificate verification failed ({detail})")
        return ConnectFailed(f"{where}: TLS handshake failed")
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        # The node did not answer the dial: unreachable, not slow (seed 000 entry 16).
        return ConnectFailed(f"{where}: connect timed out", before_send=True)
    if isinstance(exc, requests.exceptions.ReadTimeout) or _caused_by_read_timeout(exc):
        return RequestTimeout(f"{where}: no answer in time (read timed out)")
    if isinstance(
        exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ContentDecodingError
    ):
        return ConnectFailed(f"{where}: connection broken while reading the answer")
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = _os_reason(exc)
        return ConnectFailed(
            f"{where}: connection failed ({reason})", before_send=reason in _NEVER_SENT
        )
    return ConnectFailed(f"{where}: request failed ({type(exc).__name__})")


# Reasons after which the request certainly never reached the server.
_NEVER_SENT = frozenset({"connection refused", "host name not resolved"})


def _chain(exc: BaseException) -> list[BaseException]:
    """Every exception reachable from ``exc`` through causes, contexts, args and ``reason``."""
    seen: list[BaseException] = []
    stack: list[object] = [exc]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or any(item is s for s in seen):
            continue
        seen.append(item)
        stack.extend([item.__cause__, item.__context__, getattr(item, "reason", None)])
        stack.extend(item.args)
    return seen


def _cert_verify_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    for item in _chain(exc):
        if isinstance(item, ssl.SSLCertVerificationError):
            return item
    return None


def _caused_by_read_timeout(exc: BaseException) -> bool:
    # A timeout while reading the body surfaces as requests' ConnectionError.
    return any(isinstance(item, ReadTimeoutError) for item in _chain(exc))


def _os_reason(exc: BaseException) -> str:
    """A short, URL-free reason: ``connection refused``, ``connection reset``..."""
    for item in _chain(exc):
        if isinstance(item, ConnectionRefusedError):
            return "connection refused"
        if isinstance(item, ConnectionResetError):
            return "connection reset"
        if isinstance(item, ConnectionAbortedError):
            return "connection aborted"
        if type(item).__name__ == "RemoteDisconnected":
            return "closed without an answer"
        if type(item).__name__ == "NameResolutionError":
            return "host name not resolved"
        if isinstance(item, OSError) and item.strerror:
            return item.strerror.lower()
    return "no answer"
