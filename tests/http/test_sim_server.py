"""The simulator's HTTPS front end: what a client sees on the wire.

Most tests put a small fake engine behind ``SimServer`` so each one controls exactly what the
engine answers; the last ones run ``python -m pvesim`` as a real process, the way an operator
or ``make sim`` starts it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from pvesim.protocol import SimRequest, SimResponse
from pvesim.server import SimServer

pytestmark = pytest.mark.http

REPO = Path(__file__).resolve().parents[2]


class FakeEngine:
    """Records every request and answers with whatever ``respond`` returns."""

    def __init__(self, respond: Callable[[SimRequest], SimResponse] | None = None) -> None:
        self.requests: list[SimRequest] = []
        self.respond = respond or (lambda request: ok({"echo": request.path}))

    def handle(self, request: SimRequest) -> SimResponse:
        self.requests.append(request)
        return self.respond(request)


def ok(data: object) -> SimResponse:
    return SimResponse(200, "OK", json.dumps({"data": data}).encode())


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def server(start_server: Callable[[FakeEngine], SimServer], engine: FakeEngine) -> SimServer:
    return start_server(engine)


def get(server: SimServer, tls: Any, path: str, **kw: object) -> requests.Response:
    return requests.get(server.url + path, verify=str(tls.ca), timeout=10, **kw)


# --- requests as the engine sees them -----------------------------------------------------


def test_query_and_headers_reach_the_engine(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    upid = "UPID%3Apve1%3A0001%3A0002%3A00000003%3Aqmclone%3A9000%3Aa%40pve%21b%3A"
    answer = get(
        server,
        tls_files,
        f"/api2/json/nodes/pve1/tasks/{upid}/log?start=0&limit=50&note=a+b",
        headers={"Authorization": "PVEAPIToken=a@pve!b=secret"},
    )
    assert answer.status_code == 200
    [seen] = engine.requests
    assert seen.method == "GET"
    assert seen.path == f"/api2/json/nodes/pve1/tasks/{upid}/log"  # still percent-encoded
    assert seen.query == {"start": "0", "limit": "50", "note": "a b"}
    assert seen.headers["authorization"] == "PVEAPIToken=a@pve!b=secret"
    assert seen.body_length == 0


def test_form_and_json_bodies_are_decoded(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    url = server.url + "/api2/json/nodes/pve1/qemu/123/config"
    ca = str(tls_files.ca)
    requests.put(url, data={"cores": "2", "delete": "ide2,net1"}, verify=ca, timeout=10)
    requests.post(url, json={"cores": 2, "onboot": True}, verify=ca, timeout=10)
    form, as_json = engine.requests
    assert form.form == {"cores": "2", "delete": "ide2,net1"}
    assert form.json_body is None
    assert as_json.json_body == {"cores": 2, "onboot": True}
    assert as_json.form == {}


def test_a_delete_with_a_body_reports_its_length(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    # Proxmox answers 501 to a DELETE with a body; the engine decides, so it must know.
    requests.delete(
        server.url + "/api2/json/nodes/pve1/qemu/123",
        data="purge=1",
        verify=str(tls_files.ca),
        timeout=10,
    )
    assert engine.requests[0].body_length == len("purge=1")


def test_bodies_over_512_kib_are_refused_before_the_engine(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    answer = requests.post(
        server.url + "/api2/json/nodes/pve1/qemu/123/config",
        data={"description": "x" * (512 * 1024 + 1)},
        verify=str(tls_files.ca),
        timeout=10,
    )
    assert (answer.status_code, answer.reason) == (501, "for data too large")
    assert engine.requests == []


# --- responses as the client sees them ------------------------------------------------------


def test_proxmox_headers_reason_and_body(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    message = "VM is locked (clone)\n"
    engine = FakeEngine(
        lambda r: SimResponse(500, message, json.dumps({"data": None, "message": message}).encode())
    )
    server = start_server(engine)
    answer = get(server, tls_files, "/api2/json/nodes/pve1/qemu/125/config")
    assert answer.status_code == 500
    assert answer.reason == "VM is locked (clone)"
    assert answer.headers["Server"] == "pve-api-daemon/3.0"
    assert answer.headers["Cache-Control"] == "max-age=0"
    assert answer.headers["Pragma"] == "no-cache"
    assert "Expires" in answer.headers
    assert answer.headers["Content-Type"] == "application/json;charset=UTF-8"
    assert answer.json() == {"data": None, "message": message}


def test_401_has_an_empty_body(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    server = start_server(FakeEngine(lambda r: SimResponse(401, "No ticket", None)))
    answer = get(server, tls_files, "/api2/json/version")
    assert (answer.status_code, answer.reason, answer.content) == (401, "No ticket", b"")
    assert answer.headers["Content-Length"] == "0"


def test_a_reason_is_cut_to_its_first_line_and_kept_latin_1(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    server = start_server(FakeEngine(lambda r: SimResponse(500, "first ✓ line\nsecond", b"")))
    answer = get(server, tls_files, "/api2/json/version")
    assert answer.status_code == 500
    assert answer.reason == "first ? line"


def test_an_engine_crash_is_a_500_not_a_dropped_connection(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    def explode(request: SimRequest) -> SimResponse:
        raise RuntimeError("boom")

    server = start_server(FakeEngine(explode))
    assert get(server, tls_files, "/api2/json/version").status_code == 500


def test_keep_alive_serves_several_requests_on_one_connection(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    context = ssl.create_default_context(cafile=str(tls_files.ca))
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context)
    try:
        sockets = []
        for i in range(3):
            connection.request("GET", f"/api2/json/nodes/pve{i}/status")
            answer = connection.getresponse()
            assert answer.status == 200
            assert json.loads(answer.read()) == {
                "data": {"echo": f"/api2/json/nodes/pve{i}/status"}
            }
            sockets.append(connection.sock)
        # http.client opens a new socket only after the server closed the old one.
        assert sockets[0] is not None
        assert all(sock is sockets[0] for sock in sockets)
    finally:
        connection.close()
    assert len(engine.requests) == 3


# --- uploads ---------------------------------------------------------------------------------


def test_upload_multipart_reaches_the_engine_byte_for_byte(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    # Content that looks like multipart framing must survive: only the real boundary counts.
    content = (b"\r\n--not-the-boundary\r\n" + bytes(range(256))) * 4096  # ~1 MiB
    answer = requests.post(
        server.url + "/api2/json/nodes/pve1/storage/local/upload",
        data={"content": "iso", "checksum-algorithm": "sha256", "checksum": "abc"},
        files={"filename": ("proxy-a-seed.iso", content, "application/octet-stream")},
        verify=str(tls_files.ca),
        timeout=10,
    )
    assert answer.status_code == 200
    [seen] = engine.requests
    assert seen.form == {"content": "iso", "checksum-algorithm": "sha256", "checksum": "abc"}
    assert seen.files == {"filename": ("proxy-a-seed.iso", content)}


def multipart(boundary: str, parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def post_multipart(server: SimServer, tls: Any, body: bytes) -> requests.Response:
    return requests.post(
        server.url + "/api2/json/nodes/pve1/storage/local/upload",
        data=body,
        headers={"Content-Type": "multipart/form-data; boundary=XyZ"},
        verify=str(tls.ca),
        timeout=10,
    )


def test_the_file_part_must_be_named_filename(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    body = multipart("XyZ", [("content", None, b"iso"), ("file", "a.iso", b"ISO")])
    answer = post_multipart(server, tls_files, body)
    assert answer.status_code == 500
    assert answer.reason == "wrong field name 'file' for file upload, expected 'filename'"
    assert engine.requests == []


def test_text_parts_after_their_turn_are_taken_for_the_file(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    # pveproxy reads content, checksum-algorithm, checksum in that order, then the file.
    body = multipart(
        "XyZ", [("checksum", None, b"abc"), ("content", None, b"iso"), ("filename", "a.iso", b"I")]
    )
    answer = post_multipart(server, tls_files, body)
    assert answer.reason == "wrong field name 'content' for file upload, expected 'filename'"


def test_the_connection_stays_usable_after_a_refused_upload(
    server: SimServer, engine: FakeEngine, tls_files: Any
) -> None:
    with requests.Session() as session:
        body = multipart("XyZ", [("file", "a.iso", b"ISO" * 1000)])
        first = session.post(
            server.url + "/api2/json/nodes/pve1/storage/local/upload",
            data=body,
            headers={"Content-Type": "multipart/form-data; boundary=XyZ"},
            verify=str(tls_files.ca),
        )
        second = session.get(server.url + "/api2/json/version", verify=str(tls_files.ca))
    assert first.status_code == 500
    assert second.status_code == 200


# --- delays and faults -----------------------------------------------------------------------


def test_delay_holds_the_answer(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    server = start_server(FakeEngine(lambda r: SimResponse(200, "OK", b"{}", delay=0.3)))
    started = time.monotonic()
    assert get(server, tls_files, "/api2/json/version").status_code == 200
    assert time.monotonic() - started >= 0.3


def test_reset_drops_the_connection_without_an_answer(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    engine = FakeEngine(lambda r: SimResponse(200, "OK", b"{}", fault="reset"))
    server = start_server(engine)
    with pytest.raises(requests.ConnectionError):
        get(server, tls_files, "/api2/json/version")
    assert len(engine.requests) == 1  # the request did arrive; only the answer is lost


def test_stall_holds_the_connection_until_the_client_gives_up(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    server = start_server(FakeEngine(lambda r: SimResponse(200, "OK", b"{}", fault="stall")))
    with pytest.raises(requests.ReadTimeout):
        requests.get(server.url + "/api2/json/version", verify=str(tls_files.ca), timeout=0.5)


def test_stop_releases_a_stalled_client(
    start_server: Callable[[FakeEngine], SimServer], tls_files: Any
) -> None:
    engine = FakeEngine(lambda r: SimResponse(200, "OK", b"{}", fault="stall"))
    server = start_server(engine)
    outcome: list[BaseException] = []

    def client() -> None:
        try:
            requests.get(server.url + "/api2/json/version", verify=str(tls_files.ca), timeout=60)
        except requests.RequestException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    while not engine.requests:
        time.sleep(0.01)
    server.stop()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the stalled client was still held after stop()"
    assert isinstance(outcome[0], requests.ConnectionError)


def test_stop_closes_the_listener(server: SimServer, tls_files: Any) -> None:
    assert get(server, tls_files, "/api2/json/version").status_code == 200
    server.stop()
    with pytest.raises(requests.ConnectionError):
        get(server, tls_files, "/api2/json/version")


def test_port_zero_picks_a_free_port(server: SimServer) -> None:
    assert server.port > 0
    assert server.url == f"https://127.0.0.1:{server.port}"


# --- the command line: python -m pvesim -----------------------------------------------------------


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """The simulator as a real process with ``--port 0``, and the JSON line it printed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pvesim",
            "--port",
            "0",
            "--profile",
            "instant",
            "--workdir",
            str(tmp_path / "pvesim"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else "no output"
        yield process, json.loads(line)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_the_process_prints_where_to_reach_it(
    simulator: tuple[subprocess.Popen[str], dict[str, str]],
) -> None:
    _, ready = simulator
    assert set(ready) == {"url", "tokenFile", "caFile", "catalogue"}
    assert ready["url"].startswith("https://127.0.0.1:")
    assert not ready["url"].endswith(":0")
    token = Path(ready["tokenFile"]).read_text().strip()
    answer = requests.get(
        ready["url"] + "/api2/json/version",
        headers={"Authorization": f"PVEAPIToken={token}"},
        verify=ready["caFile"],
        timeout=10,
    )
    assert answer.status_code == 200
    assert "version" in answer.json()["data"]


def test_the_process_refuses_a_request_without_a_token(
    simulator: tuple[subprocess.Popen[str], dict[str, str]],
) -> None:
    _, ready = simulator
    answer = requests.get(ready["url"] + "/api2/json/version", verify=ready["caFile"], timeout=10)
    assert (answer.status_code, answer.content) == (401, b"")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_process_exits_0_promptly_on_a_signal(
    simulator: tuple[subprocess.Popen[str], dict[str, str]], signum: int
) -> None:
    process, _ = simulator
    process.send_signal(signum)
    assert process.wait(timeout=5) == 0


def test_the_catalogue_names_the_running_cluster(
    simulator: tuple[subprocess.Popen[str], dict[str, str]],
) -> None:
    _, ready = simulator
    [catalogue] = list(yaml.safe_load_all(Path(ready["catalogue"]).read_text()))
    assert catalogue["url"] == ready["url"]
    assert (catalogue["tokenFile"], catalogue["caFile"]) == (ready["tokenFile"], ready["caFile"])
    token = Path(ready["tokenFile"]).read_text().strip()

    def data(path: str, **params: str) -> Any:
        answer = requests.get(
            ready["url"] + "/api2/json" + path,
            params=params,
            headers={"Authorization": f"PVEAPIToken={token}"},
            verify=ready["caFile"],
            timeout=10,
        )
        assert answer.status_code == 200, answer.reason
        return answer.json()["data"]

    assert catalogue["nodes"] == [n["node"] for n in data("/nodes")]
    template = catalogue["templates"]["debian-13"]["vmid"]
    [entry] = [e for e in data("/cluster/resources", type="vm") if e["vmid"] == template]
    assert entry["template"] == 1
    storages = [s["storage"] for s in data(f"/nodes/{catalogue['nodes'][0]}/storage")]
    assert catalogue["isoStorage"] in storages
