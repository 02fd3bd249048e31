"""The HTTPS transport's own behaviour: encoding, credentials, answers, failures, hygiene.

Most tests mock the network with ``responses`` (the only place mocks are allowed). What
``responses`` cannot express (a custom reason phrase, the raw bytes on the wire, a server that
stalls or hangs up) is served by a tiny scripted HTTP server on the loopback interface.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import responses
import trustme

from provisioning.proxmox.api import Api, Call
from provisioning.proxmox.credentials import read_token
from provisioning.proxmox.deadline import Cancelled, Deadline, DeadlineExceeded
from provisioning.proxmox.errors import (
    ApiError,
    CAFileInvalid,
    CAFileMissing,
    ConnectFailed,
    CredentialsMalformed,
    CredentialsMissing,
    PermanentError,
    ReplyLost,
    RequestTimeout,
    TransientError,
    classify,
)
from provisioning.proxmox.http import HttpTransport, http_api

ORIGIN = "https://pve.test:8006"
BASE = ORIGIN + "/api2/json"
TOKEN_ID = "svc-provision@pve!django"
SECRET = "7c1e4d2a-1b2c-4d5e-8f90-0123456789ab"
UPID = "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc-provision@pve!django:"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN_ID}={SECRET}\n")
    return path


@pytest.fixture
def api(token_file: Path) -> Iterator[Api]:
    api = http_api(ORIGIN, str(token_file))
    yield api
    transport(api).close()


def transport(api: Api) -> HttpTransport:
    assert isinstance(api.transport, HttpTransport)
    return api.transport


def sent(index: int = 0) -> Any:
    return responses.calls[index].request


def sent_kwargs(index: int = 0) -> dict[str, Any]:
    """What the session handed its adapter for a call (``verify``, ``proxies``...)."""
    kwargs: dict[str, Any] = getattr(responses.calls[index].request, "req_kwargs", {})
    return kwargs


def body_text(request: Any) -> str:
    body = request.body or b""
    return body.decode() if isinstance(body, bytes) else str(body)


def form_of(request: Any) -> dict[str, list[str]]:
    return parse_qs(body_text(request), keep_blank_values=True)


# --- a scripted loopback server -------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    reason: str | None = None
    body: bytes = b'{"data":null}'
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang_up: bool = False


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedServer:
    """Answers each request with the next ``Reply`` (the last one repeats) and records it."""

    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply()]
        self.seen: list[Seen] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.seen.append(Seen(self.command, self.path, headers, body))
                reply = outer.replies[min(len(outer.seen), len(outer.replies)) - 1]
                if reply.delay:
                    outer.release.wait(reply.delay)
                if reply.hang_up:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(reply.status, reply.reason)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    yield srv
    srv.close()


@pytest.fixture
def wire_api(server: ScriptedServer, token_file: Path) -> Iterator[Api]:
    api = http_api(server.url, str(token_file), request_timeout=5.0)
    yield api
    transport(api).close()


def all_log_text(records: list[logging.LogRecord]) -> str:
    """Everything a handler could print: message, every attribute, the traceback."""
    out = []
    for record in records:
        out.append(record.getMessage())
        out.append(repr(record.__dict__))
        if record.exc_info and record.exc_info[1] is not None:
            out.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(out)


# --- URL building and encoding --------------------------------------------------------------


@responses.activate
def test_base_url_gets_api_prefix_and_path_ids_are_percent_encoded(api: Api) -> None:
    responses.get(re.compile(r".*/status$"), json={"data": {"status": "running"}})
    responses.delete(re.compile(r".*/content/.*"), json={"data": UPID})
    api.task_status("pve1", UPID)
    api.delete_volume("pve1", "proxy-seeds", "proxy-seeds:iso/proxy-a-seed.iso")
    assert sent(0).url == (
        f"{BASE}/nodes/pve1/tasks/"
        "UPID%3Apve1%3A001F3A2C%3A0A1B2C3D%3A6968BAA0%3Aqmclone%3A9000%3Asvc-provision%40pve"
        "%21django%3A/status"
    )
    assert sent(1).url == (
        f"{BASE}/nodes/pve1/storage/proxy-seeds/content/proxy-seeds%3Aiso%2Fproxy-a-seed.iso"
    )


def test_trailing_slash_in_url_is_tolerated_and_paths_refused(token_file: Path) -> None:
    assert HttpTransport(ORIGIN + "/", str(token_file)).origin == ORIGIN
    for bad in (ORIGIN + "/api2/json", "ftp://pve.test", ORIGIN + "?x=1", "https://u:p@pve.test"):
        with pytest.raises(ValueError):
            HttpTransport(bad, str(token_file))


@responses.activate
def test_delete_options_travel_in_the_query_string_with_no_body(api: Api) -> None:
    responses.delete(re.compile(r".*/qemu/123.*"), json={"data": UPID})
    assert api.destroy("pve1", 123) == UPID
    request = sent()
    parts = urlsplit(request.url)
    assert parts.path == "/api2/json/nodes/pve1/qemu/123"
    assert parse_qs(parts.query) == {"purge": ["1"], "destroy-unreferenced-disks": ["1"]}
    assert not request.body


@responses.activate
def test_get_parameters_travel_in_the_query_string(api: Api) -> None:
    responses.get(re.compile(r".*/content.*"), json={"data": []})
    api.storage_content("pve1", "proxy-seeds", content="iso", vmid=100042)
    parts = urlsplit(sent().url)
    assert parse_qs(parts.query) == {"content": ["iso"], "vmid": ["100042"]}
    assert not sent().body


@responses.activate
def test_post_is_a_form_with_booleans_as_1_and_0(api: Api) -> None:
    responses.post(re.compile(r".*/clone$"), json={"data": UPID})
    responses.post(re.compile(r".*/status/shutdown$"), json={"data": UPID})
    description = "proxyhub-managed=true\nproxyhub-uid=a b&c=d+e"
    api.clone("pve1", 9000, newid=100042, name="proxy-a", description=description, full=True)
    api.shutdown("pve1", 100042, force_stop=False)
    clone, shutdown = sent(0), sent(1)
    assert clone.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert form_of(clone) == {
        "newid": ["100042"],
        "name": ["proxy-a"],
        "description": [description],
        "full": ["1"],
    }
    # Spaces as %20, never '+', so no reader can mistake a literal '+' for a space.
    raw = body_text(clone)
    assert "+" not in raw and "a%20b" in raw and "d%2Be" in raw
    assert form_of(shutdown) == {"timeout": ["60"], "forceStop": ["0"]}
    assert "?" not in clone.url


@responses.activate
def test_put_config_is_a_form(api: Api) -> None:
    responses.put(re.compile(r".*/config$"), json={"data": None})
    api.set_vm_config("pve1", 100042, {"cores": 2, "agent": True, "tags": "proxyhub"})
    assert form_of(sent()) == {"cores": ["2"], "agent": ["1"], "tags": ["proxyhub"]}


@responses.activate
def test_envelope_data_and_total_are_returned(api: Api) -> None:
    body = {"data": [{"n": 1, "t": "TASK OK"}], "total": 1}
    responses.get(re.compile(r".*/log$"), json=body)
    response = transport(api).send(
        api_call("task_log", "GET", "/nodes/{node}/tasks/{upid}/log", node="pve1", upid=UPID),
        deadline=None,
    )
    assert (response.status, response.data, response.total) == (200, body["data"], 1)


def api_call(name: str, method: str, path: str, **path_params: str) -> Call:
    return Call(name, method, path, path_params)


# --- credentials ----------------------------------------------------------------------------


@responses.activate
def test_token_is_read_on_every_request(api: Api, token_file: Path) -> None:
    responses.get(f"{BASE}/version", json={"data": {"version": "9.1.9"}})
    api.version()
    token_file.write_text("svc-provision@pve!rotated=11111111-2222-4333-8444-555555555555")
    api.version()
    assert sent(0).headers["Authorization"] == f"PVEAPIToken={TOKEN_ID}={SECRET}"
    assert sent(1).headers["Authorization"] == (
        "PVEAPIToken=svc-provision@pve!rotated=11111111-2222-4333-8444-555555555555"
    )


@responses.activate
def test_missing_token_file_is_transient_and_sends_nothing(api: Api, token_file: Path) -> None:
    token_file.unlink()
    with pytest.raises(CredentialsMissing) as raised:
        api.version()
    assert str(token_file) in str(raised.value)
    assert type(classify("check", raised.value)) is TransientError
    assert len(responses.calls) == 0


@responses.activate
def test_malformed_token_file_is_permanent_and_never_shown(api: Api, token_file: Path) -> None:
    token_file.write_text(f"{TOKEN_ID} {SECRET}\n")  # a space instead of '='
    with pytest.raises(CredentialsMalformed) as raised:
        api.version()
    assert SECRET not in str(raised.value)
    assert isinstance(classify("check", raised.value), PermanentError)
    assert len(responses.calls) == 0


def test_token_repr_and_str_hide_the_secret(token_file: Path) -> None:
    token = read_token(str(token_file))
    assert token.token_id == TOKEN_ID
    assert token.secret == SECRET
    assert SECRET not in repr(token) and SECRET not in str(token)
    assert token.user == "svc-provision@pve"


def test_a_non_ascii_user_travels_percent_encoded(tmp_path: Path) -> None:
    """Proxmox URL-unescapes the header value (pve-reference §2.1); headers are Latin-1."""
    path = tmp_path / "token"
    path.write_text(f"jürgen@pve!django={SECRET}\n", encoding="utf-8")
    token = read_token(str(path))
    assert token.token_id == "jürgen@pve!django"
    assert token.header() == f"PVEAPIToken=j%C3%BCrgen@pve!django={SECRET}"
    assert token.header().isascii()


def test_token_file_whitespace_is_stripped_and_split_at_the_last_equals(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  user=with=equals@pve!django={SECRET}  \r\n\n")
    token = read_token(str(path))
    assert (token.token_id, token.secret) == ("user=with=equals@pve!django", SECRET)


# --- CA file --------------------------------------------------------------------------------


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


@responses.activate
def test_missing_ca_file_is_transient(token_file: Path, tmp_path: Path) -> None:
    api = http_api(ORIGIN, str(token_file), ca_file=str(tmp_path / "absent.pem"))
    with pytest.raises(CAFileMissing) as raised:
        api.version()
    assert type(classify("check", raised.value)) is TransientError
    assert len(responses.calls) == 0


@responses.activate
def test_ca_file_without_a_certificate_is_permanent(token_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "ca.pem"
    key_only = trustme.CA().private_key_pem.bytes()
    path.write_bytes(key_only)
    api = http_api(ORIGIN, str(token_file), ca_file=str(path))
    with pytest.raises(CAFileInvalid) as raised:
        api.version()
    assert isinstance(classify("check", raised.value), PermanentError)
    assert "PRIVATE KEY" not in str(raised.value)
    assert len(responses.calls) == 0


@responses.activate
def test_ca_is_loaded_once_and_passed_on_every_request(token_file: Path, ca_file: Path) -> None:
    responses.get(f"{BASE}/version", json={"data": {}})
    api = http_api(ORIGIN, str(token_file), ca_file=str(ca_file))
    api.version()
    ca_file.unlink()  # cached: rotating the CA needs a restart (seed 000 entry 24)
    api.version()
    assert [sent_kwargs(i)["verify"] for i in range(2)] == [str(ca_file)] * 2


@responses.activate
def test_environment_ca_bundle_cannot_override_verification(
    token_file: Path, ca_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "env-bundle.pem"))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(tmp_path / "env-bundle.pem"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    responses.get(f"{BASE}/version", json={"data": {}})
    http_api(ORIGIN, str(token_file), ca_file=str(ca_file)).version()
    http_api(ORIGIN, str(token_file)).version()
    http_api(ORIGIN, str(token_file), insecure=True).version()
    verifies = [sent_kwargs(i)["verify"] for i in range(3)]
    assert verifies == [str(ca_file), True, False]
    assert all(not sent_kwargs(i).get("proxies") for i in range(3))


def test_insecure_warns_once_per_transport(
    token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="proxyhub.proxmox"):
        transport = HttpTransport(ORIGIN, str(token_file), insecure=True)
        with responses.RequestsMock() as mock:
            mock.get(f"{BASE}/version", json={"data": {}})
            api = Api(transport)
            api.version()
            api.version()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "insecureSkipTLSVerify" in warnings[0].getMessage()


# --- answers --------------------------------------------------------------------------------


@responses.activate
def test_error_message_comes_from_the_json_body(api: Api) -> None:
    responses.get(
        re.compile(r".*/config$"),
        status=500,
        json={
            "data": None,
            "message": "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n",
        },
    )
    with pytest.raises(ApiError) as raised:
        api.vm_config("pve1", 999)
    err = raised.value
    assert (err.status, err.message) == (
        500,
        "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist",
    )
    assert str(err) == "500 Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist"


@responses.activate
def test_parameter_errors_are_kept_per_parameter(api: Api) -> None:
    responses.post(
        re.compile(r".*/clone$"),
        status=400,
        json={
            "data": None,
            "message": "Parameter verification failed.\n",
            "errors": {"name": "invalid format - value does not look like a valid DNS name\n"},
        },
    )
    with pytest.raises(ApiError) as raised:
        api.clone("pve1", 9000, newid=100042, name="proxy_a")
    assert raised.value.errors == {
        "name": "invalid format - value does not look like a valid DNS name"
    }
    assert "name: invalid format" in str(raised.value)


@responses.activate
def test_plain_text_error_body_falls_back_to_the_reason(api: Api) -> None:
    responses.delete(
        re.compile(r".*/qemu/123.*"),
        status=501,
        body="Unexpected content for method 'DELETE'",
        content_type="text/plain",
    )
    with pytest.raises(ApiError) as raised:
        api.destroy("pve1", 123)
    assert raised.value.status == 501
    assert raised.value.message in ("Not Implemented", "Unexpected content for method 'DELETE'")


def test_401_without_body_uses_the_reason_phrase(server: ScriptedServer, wire_api: Api) -> None:
    server.replies = [Reply(401, "Authentication failed!", b"")]
    with pytest.raises(ApiError) as raised:
        wire_api.version()
    assert (raised.value.status, raised.value.message) == (401, "Authentication failed!")
    assert isinstance(classify("check", raised.value), PermanentError)


def test_595_with_empty_body_is_transient(server: ScriptedServer, wire_api: Api) -> None:
    server.replies = [Reply(595, "No route to host", b"")]
    with pytest.raises(ApiError) as raised:
        wire_api.vm_status("pve2", 130)
    assert (raised.value.status, raised.value.message) == (595, "No route to host")
    assert type(classify("get", raised.value)) is TransientError


@responses.activate
def test_595_without_reason_or_body_still_has_a_message(api: Api) -> None:
    responses.get(re.compile(r".*/current$"), status=595, body=b"")
    with pytest.raises(ApiError) as raised:
        api.vm_status("pve2", 130)
    assert raised.value.status == 595
    assert raised.value.message


@responses.activate
def test_redirects_are_not_followed(api: Api) -> None:
    responses.get(
        f"{BASE}/version", status=302, headers={"Location": "https://login.example/?next=x"}
    )
    responses.get("https://login.example/", json={"data": {}})
    with pytest.raises(ApiError) as raised:
        api.version()
    assert raised.value.status == 302
    assert len(responses.calls) == 1
    assert "login.example" not in str(raised.value)
    assert isinstance(classify("check", raised.value), PermanentError)


@responses.activate
def test_a_2xx_that_is_not_an_envelope_is_an_error(api: Api) -> None:
    responses.get(f"{BASE}/version", body="<html>proxy login</html>", content_type="text/html")
    with pytest.raises(ApiError) as raised:
        api.version()
    assert "not a Proxmox JSON envelope" in str(raised.value)


# --- multipart upload on the wire -----------------------------------------------------------


def test_upload_sends_text_parts_before_the_file_part(
    server: ScriptedServer, wire_api: Api
) -> None:
    server.replies = [Reply(body=json.dumps({"data": UPID}).encode())]
    iso = b"\x00CD001" + bytes(range(256)) * 8
    assert wire_api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=iso)
    seen = server.seen[0]
    assert (seen.method, seen.path) == ("POST", "/api2/json/nodes/pve1/storage/proxy-seeds/upload")
    content_type = seen.headers["content-type"]
    assert content_type.startswith("multipart/form-data; boundary=")
    boundary = content_type.split("boundary=", 1)[1].encode()
    parts = seen.body.split(b"--" + boundary)
    assert parts[0] == b"" and parts[-1] == b"--\r\n"
    text_part, file_part = parts[1], parts[2]
    assert text_part == b'\r\nContent-Disposition: form-data; name="content"\r\n\r\niso\r\n'
    head, _, payload = file_part.partition(b"\r\n\r\n")
    assert b'Content-Disposition: form-data; name="filename"; filename="proxy-a-seed.iso"' in head
    assert payload == iso + b"\r\n"
    assert len(parts) == 4


# --- one log line per call, and nothing secret in it ----------------------------------------


@responses.activate
def test_one_info_line_per_call_with_its_fields(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    responses.get(re.compile(r".*/status/current$"), json={"data": {"status": "running"}})
    responses.post(re.compile(r".*/status/start$"), json={"data": UPID})
    responses.get(re.compile(r".*/config$"), status=500, json={"message": "VM is locked (clone)\n"})
    with caplog.at_level(logging.DEBUG, logger="proxyhub.proxmox"):
        api.vm_status("pve1", 100042)
        api.start("pve1", 100042)
        with pytest.raises(ApiError):
            api.vm_config("pve1", 100042)
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.call for r in info] == ["vm_status", "start", "vm_config"]  # type: ignore[attr-defined]
    for record in info:
        assert record.node == "pve1"  # type: ignore[attr-defined]
        assert record.vmid == "100042"  # type: ignore[attr-defined]
        assert record.duration >= 0  # type: ignore[attr-defined]
    assert [r.http_status for r in info] == [200, 200, 500]  # type: ignore[attr-defined]
    assert info[1].upid == UPID  # type: ignore[attr-defined]
    assert info[2].error == "VM is locked (clone)"  # type: ignore[attr-defined]
    assert SECRET not in all_log_text(caplog.records)


def test_client_token_never_in_errors_or_logs(
    server: ScriptedServer, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "c4a7a57e-5ec7-4e7d-9c4e-000000c4a7a5"
    token_file.write_text(f"{TOKEN_ID}={canary}\n")
    echo = f"no such token secret {canary} (header PVEAPIToken={TOKEN_ID}={canary})"
    server.replies = [
        Reply(401, echo, json.dumps({"data": None, "message": echo + "\n"}).encode()),
        Reply(
            400,
            "Parameter verification failed.",
            json.dumps(
                {"message": "Parameter verification failed.\n", "errors": {"newid": echo}}
            ).encode(),
        ),
        Reply(401, echo, b""),
    ]
    api = http_api(server.url, str(token_file), request_timeout=5.0)
    failures: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        for attempt in (
            api.version,
            lambda: api.clone("pve1", 9000, newid=1, name="x"),
            lambda: api.node_status("pve1"),
        ):
            with pytest.raises(ApiError) as raised:
                attempt()
            failures.append(raised.value)
        transport(api).close()
        # A transport failure, too: nothing listens on this port any more.
        closed = http_api(f"http://127.0.0.1:{free_port()}", str(token_file))
        with pytest.raises(ConnectFailed) as refused:
            closed.version()
        failures.append(refused.value)
        transport(closed).close()
    # The server did receive it, so the test would notice if it vanished from requests.
    assert server.seen[0].headers["authorization"] == f"PVEAPIToken={TOKEN_ID}={canary}"
    for failure in failures:
        for text in (str(failure), repr(failure), str(classify("create", failure))):
            assert canary not in text
        assert canary not in repr(getattr(failure, "errors", ""))
    assert failures[0].message.startswith("no such token secret <redacted>")  # type: ignore[attr-defined]
    assert canary not in all_log_text(caplog.records)
    assert caplog.records, "the calls were logged"


def test_upload_body_never_logged(
    server: ScriptedServer, wire_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    canary = b"#cloud-config\nCANARY-UPLOAD-BODY-5d1f\n"
    server.replies = [
        Reply(body=json.dumps({"data": UPID}).encode()),
        Reply(500, "can't upload", b'{"data":null,"message":"can\'t upload to storage type\\n"}'),
    ]
    with caplog.at_level(logging.DEBUG):
        wire_api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=canary)
        with pytest.raises(ApiError) as raised:
            wire_api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=canary)
    assert canary in server.seen[0].body
    assert "CANARY-UPLOAD-BODY" not in all_log_text(caplog.records)
    assert "CANARY-UPLOAD-BODY" not in str(raised.value) + repr(raised.value)
    upload_lines = [r for r in caplog.records if getattr(r, "call", None) == "upload_iso"]
    assert any(r.levelno == logging.INFO for r in upload_lines)


# --- failures without an answer -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_connection_refused_is_connect_failed_without_the_url(token_file: Path) -> None:
    api = http_api(f"http://127.0.0.1:{free_port()}", str(token_file))
    with pytest.raises(ConnectFailed) as raised:
        api.storage_content("pve1", "proxy-seeds", content="iso")
    text = str(raised.value)
    assert text.startswith("GET /nodes/{node}/storage/{storage}/content: connection failed")
    assert "content=iso" not in text and "127.0.0.1" not in text
    assert type(classify("list", raised.value)) is TransientError
    transport(api).close()


def test_a_server_that_hangs_up_is_connect_failed(server: ScriptedServer, wire_api: Api) -> None:
    server.replies = [Reply(hang_up=True)]
    # A mutation whose connection hung up may have been applied: its reply is lost.
    with pytest.raises(ReplyLost) as raised:
        wire_api.start("pve1", 100042)
    assert isinstance(raised.value.cause, ConnectFailed)
    assert len(server.seen) == 1  # sent once: the transport never retries a mutation


def test_a_slow_answer_is_a_request_timeout(server: ScriptedServer, token_file: Path) -> None:
    server.replies = [Reply(delay=5.0)]
    api = http_api(server.url, str(token_file), request_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as raised:
        api.version()
    assert time.monotonic() - started < 3.0
    assert str(raised.value).startswith("GET /version:")
    assert type(classify("get", raised.value)) is TransientError
    transport(api).close()


def test_cancel_while_in_flight_returns_promptly(server: ScriptedServer, wire_api: Api) -> None:
    server.replies = [Reply(delay=5.0), Reply()]
    deadline = Deadline(30)
    threading.Timer(0.2, deadline.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        wire_api.version(deadline=deadline)
    assert time.monotonic() - started < 1.0
    # Only that request was cancelled: the transport keeps serving others.
    server.release.set()
    assert wire_api.version() == {}


def test_deadline_passing_in_flight_returns_promptly(server: ScriptedServer, wire_api: Api) -> None:
    server.replies = [Reply(delay=5.0)]
    started = time.monotonic()
    with pytest.raises((DeadlineExceeded, RequestTimeout)):
        wire_api.version(deadline=Deadline(0.3))
    assert time.monotonic() - started < 1.5


@responses.activate
def test_expired_or_cancelled_deadline_sends_nothing(api: Api) -> None:
    responses.get(f"{BASE}/version", json={"data": {}})
    with pytest.raises(DeadlineExceeded):
        api.version(deadline=Deadline(0))
    cancelled = Deadline(30)
    cancelled.cancel()
    with pytest.raises(Cancelled):
        api.version(deadline=cancelled)
    assert len(responses.calls) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_transport_used_before_a_fork_works_in_the_child(
    server: ScriptedServer, wire_api: Api
) -> None:
    """Celery's prefork pool forks after the parent may have used the client."""
    server.replies = [Reply(body=b'{"data":{"version":"9.1.9"}}')]
    assert wire_api.version() == {"version": "9.1.9"}  # worker threads now exist in the parent
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ok = wire_api.version(deadline=Deadline(5)) == {"version": "9.1.9"}
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(server.seen) == 2


def test_closed_transport_refuses_to_send(token_file: Path) -> None:
    transport_ = HttpTransport(ORIGIN, str(token_file))
    transport_.close()
    with pytest.raises(RuntimeError):
        Api(transport_).version()
