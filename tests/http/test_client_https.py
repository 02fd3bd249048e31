"""proxyhub's HTTPS client against the simulator's HTTPS server: real TLS, real sockets.

The machine's ``REQUESTS_CA_BUNDLE`` and ``CURL_CA_BUNDLE`` point at the system bundle for every
test here (this is how the CI machines are set up): they must change nothing about which CA the
client trusts.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from provisioning.proxmox.api import Api
from provisioning.proxmox.deadline import Cancelled, Deadline, DeadlineExceeded
from provisioning.proxmox.errors import (
    ApiError,
    ConnectFailed,
    PermanentError,
    ReplyLost,
    RequestTimeout,
    TLSVerifyFailed,
    TransientError,
    classify,
)
from provisioning.proxmox.http import HttpTransport, http_api
from provisioning.proxmox.tasks import wait_task
from pvesim.server import SimServer
from pvesim.simulator import Simulator

pytestmark = pytest.mark.http

NEW_SECRET = "0d9c8b7a-6f5e-4d3c-8b2a-1f0e9d8c7b6a"


def system_bundle() -> str:
    """The system CA bundle, as these machines export it in the environment."""
    for candidate in (
        ssl.get_default_verify_paths().cafile,
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ):
        if candidate and os.path.exists(candidate):
            return candidate
    import certifi

    return certifi.where()


@pytest.fixture(autouse=True)
def ca_bundle_env(monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = system_bundle()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", bundle)
    monkeypatch.setenv("CURL_CA_BUNDLE", bundle)


@pytest.fixture
def engine() -> Simulator:
    return Simulator(profile="fast")


@pytest.fixture
def server(start_server: Callable[[Simulator], SimServer], engine: Simulator) -> SimServer:
    return start_server(engine)


@pytest.fixture
def token_file(tmp_path: Path, engine: Simulator) -> Path:
    path = tmp_path / "token"
    path.write_text(engine.token + "\n")
    return path


@pytest.fixture
def opened() -> Iterator[Callable[[Api], Api]]:
    """Close every client a test opens, so abandoned requests never outlive it."""
    apis: list[Api] = []

    def keep(api: Api) -> Api:
        apis.append(api)
        return api

    yield keep
    for api in apis:
        assert isinstance(api.transport, HttpTransport)
        api.transport.close()


@pytest.fixture
def api(server: SimServer, token_file: Path, tls_files: Any, opened: Callable[[Api], Api]) -> Api:
    ca = str(tls_files.ca)
    return opened(http_api(server.url, str(token_file), ca_file=ca, request_timeout=5.0))


def api_calls(engine: Simulator) -> list[dict[str, object]]:
    return [c for c in engine.control.ledger() if c.get("key")]


# --- TLS ------------------------------------------------------------------------------------


def test_client_verifies_with_the_simulator_ca(api: Api, engine: Simulator) -> None:
    assert api.version()["release"]
    assert [n["node"] for n in api.nodes()] == engine.node_names()


def test_client_x509_failure_is_permanent(
    server: SimServer,
    token_file: Path,
    tmp_path: Path,
    engine: Simulator,
    opened: Callable[[Api], Api],
) -> None:
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    api = opened(http_api(server.url, str(token_file), ca_file=str(other)))
    with pytest.raises(TLSVerifyFailed) as raised:
        api.version()
    got = classify("check", raised.value)
    assert isinstance(got, PermanentError)
    assert "caFile" in got.remediation
    assert api_calls(engine) == []  # nothing reached Proxmox


def test_system_roots_do_not_trust_the_simulator(
    server: SimServer, token_file: Path, opened: Callable[[Api], Api]
) -> None:
    api = opened(http_api(server.url, str(token_file)))
    with pytest.raises(TLSVerifyFailed):
        api.version()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_insecure_works_and_warns_once(
    server: SimServer,
    token_file: Path,
    caplog: pytest.LogCaptureFixture,
    opened: Callable[[Api], Api],
) -> None:
    with caplog.at_level(logging.WARNING, logger="proxyhub.proxmox"):
        api = opened(http_api(server.url, str(token_file), insecure=True))
        assert api.version()["release"]
        assert api.node_status("pve1")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "insecureSkipTLSVerify" in warnings[0].getMessage()


# --- the token ------------------------------------------------------------------------------


def test_token_rotation_needs_no_restart(api: Api, engine: Simulator, token_file: Path) -> None:
    assert api.version()
    engine.set_token_secret(NEW_SECRET)  # rotated on Proxmox, the file not updated yet
    with pytest.raises(ApiError) as raised:
        api.version()
    assert (raised.value.status, raised.value.message) == (401, "Authentication failed!")
    assert isinstance(classify("check", raised.value), PermanentError)
    token_file.write_text(f"{engine.token_id}={NEW_SECRET}\n")
    assert api.version()  # the same client, the next request: the new token


def test_missing_token_file_sends_nothing(api: Api, engine: Simulator, token_file: Path) -> None:
    token_file.unlink()
    with pytest.raises(Exception) as raised:
        api.version()
    assert type(classify("check", raised.value)) is TransientError
    assert api_calls(engine) == []


# --- what the simulator (strict like Proxmox) accepts ---------------------------------------


def test_upload_destroy_and_task_paths_are_accepted(api: Api, engine: Simulator) -> None:
    """Multipart order, DELETE options in the query, UPIDs and volids in paths (§1.1, §7.7)."""
    seed = b"\x00" * 32768 + b"CD001" + b"\x00" * 2043
    upid = api.upload_iso("pve1", "proxy-seeds", filename="proxy-a-seed.iso", content=seed)
    assert wait_task(api, upid, budget=10.0, poll_interval=0.05).succeeded
    volid = "proxy-seeds:iso/proxy-a-seed.iso"
    assert engine.control.volume_data("pve1", volid) == seed
    listed = api.storage_content("pve1", "proxy-seeds", content="iso")
    assert volid in [item["volid"] for item in listed]
    deleted = api.delete_volume("pve1", "proxy-seeds", volid)
    assert deleted is not None and wait_task(api, deleted, budget=10.0, poll_interval=0.05)
    stopped = api.stop("pve1", 100)  # web-1 runs; destroy needs it stopped
    assert wait_task(api, stopped, budget=10.0, poll_interval=0.05).succeeded
    upid = api.destroy("pve1", 100)
    assert wait_task(api, upid, budget=10.0, poll_interval=0.05).succeeded
    destroys = engine.control.ledger(key="DELETE /nodes/{node}/qemu/{vmid}")
    assert [d["status"] for d in destroys] == [200]


def test_offline_node_is_595_and_transient(api: Api, engine: Simulator) -> None:
    engine.control.node_offline("pve3")
    with pytest.raises(ApiError) as raised:
        api.vm_status("pve3", 102)
    assert raised.value.status == 595
    assert type(classify("get", raised.value)) is TransientError


def test_connection_reset_is_connect_failed(api: Api, engine: Simulator) -> None:
    engine.control.fail_call("POST", "/nodes/{node}/qemu/{vmid}/status/start", kind="reset")
    # A mutation's reset connection loses its reply: the start may or may not have happened.
    with pytest.raises(ReplyLost) as raised:
        api.start("pve1", 100)
    assert isinstance(raised.value.cause, ConnectFailed)
    assert api.version()  # the pool recovers: the next request gets a fresh connection


# --- cancellation and deadlines -------------------------------------------------------------


def test_client_cancelled_returns_promptly(api: Api, engine: Simulator) -> None:
    engine.control.fail_call("GET", "/version", kind="stall")
    deadline = Deadline(60)
    cancelled_at: list[float] = []

    def cancel() -> None:
        cancelled_at.append(time.monotonic())
        deadline.cancel()

    threading.Timer(0.2, cancel).start()
    with pytest.raises(Cancelled):
        api.version(deadline=deadline)
    assert time.monotonic() - cancelled_at[0] < 0.5
    # Only that request was cancelled: the same client goes on serving.
    assert api.node_status("pve1")


def test_expired_deadline_returns_promptly(api: Api, engine: Simulator) -> None:
    engine.control.fail_call("GET", "/version", kind="stall")
    started = time.monotonic()
    with pytest.raises((DeadlineExceeded, RequestTimeout)) as raised:
        api.version(deadline=Deadline(0.3))
    assert time.monotonic() - started < 1.0
    assert type(classify("get", raised.value)) is TransientError
    engine.control.clear_ledger()
    with pytest.raises(DeadlineExceeded):
        api.version(deadline=Deadline(0))
    assert api_calls(engine) == []  # an expired deadline sends nothing
