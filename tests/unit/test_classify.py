"""Seed 000 entry 13: every failure proxyhub can meet gets the class an operator expects.

The API rows come from real Proxmox answers (pve-reference ``examples/errors.json``, vendored
under ``tests/fixtures/pve/`` so this runs without ``/work/shared``); the other rows are the
non-API failures of the same table, produced by the real code that raises them where that is
cheap (token and CA files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioning.proxmox.credentials import load_ca, read_token
from provisioning.proxmox.deadline import Cancelled, DeadlineExceeded
from provisioning.proxmox.errors import (
    ApiError,
    ClassifiedError,
    ConnectFailed,
    NotFoundError,
    PermanentError,
    RequestTimeout,
    TaskFailed,
    TLSVerifyFailed,
    TransientError,
    classify,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pve"
SHARED = Path("/work/shared/pve-reference/examples")

P, T, N = PermanentError, TransientError, NotFoundError

# Expected class of each captured answer for a ``get`` (the request text is the record's key).
EXPECTED: dict[str, type[ClassifiedError]] = {
    # 400 Parameter verification failed: the request is wrong, retrying cannot help.
    "POST /api2/json/nodes/pve1/qemu/9000/clone newid=50": P,
    "POST /api2/json/nodes/pve1/qemu/9000/clone newid=abc": P,
    "POST /api2/json/nodes/pve1/qemu/9000/clone (newid missing)": P,
    "PUT /api2/json/nodes/pve1/qemu/123/config foo=1": P,
    "POST /api2/json/nodes/pve1/qemu/9000/clone newid=123 name=proxy_fra_123": P,
    "PUT /api2/json/nodes/pve1/qemu/123/config tags=proxy;fra!": P,
    "PUT /api2/json/nodes/pve1/qemu/123/config delete=foo": P,
    "PUT /api2/json/nodes/pve1/qemu/123/config cores=4 delete=cores": P,
    "POST /api2/json/nodes/pve1/qemu/123/status/stop skiplock=1 (API token of root@pam)": P,
    "GET /api2/json/cluster/nextid?vmid=123 (123 in use)": P,
    "GET /api2/json/nodes/pve1/tasks/garbage/status": P,
    "GET /api2/json/nodes/pve2/tasks/UPID:pve1:.../status (task belongs to another node)": P,
    "GET /api2/json/nodes/pve1/storage/nosuch/status": P,
    # 401: the token or its secret is wrong.
    "GET /api2/json/version (no Authorization header, no cookie)": P,
    "GET /api2/json/version  Authorization: PVEAPIToken=svc@pve!django=<wrong secret>": P,
    # 403: a privilege is missing.
    "POST /api2/json/nodes/pve1/qemu/123/status/start (token lacks VM.PowerMgmt)": P,
    "PUT /api2/json/nodes/pve1/qemu/123/config (token has none of the VM.Config.* privs)": P,
    "POST /api2/json/nodes/pve1/qemu/9000/clone newid=130 (token lacks VM.Allocate on /vms/130 "
    "and no pool)": P,
    # 500 with a matched substring.
    "GET /api2/json/nodes/pve1/qemu/999/config": N,
    "POST /api2/json/nodes/pve1/qemu/9000/clone newid=123 (123.conf already on pve1)": T,
    "POST /api2/json/nodes/pve1/qemu/124/clone newid=126 (source 124 has lock: backup)": T,
    "PUT /api2/json/nodes/pve1/qemu/125/config name=x (125 mid-clone)": T,
    "GET /api2/json/nodes/pve2/qemu/130/agent/network-get-interfaces (no 'agent' key in config)": T,
    "GET /api2/json/nodes/pve1/qemu/124/agent/network-get-interfaces (VM stopped)": T,
    "GET /api2/json/nodes/pve1/qemu/123/agent/network-get-interfaces (guest still booting)": T,
    # Any other 5xx, pveproxy's 595/596 included: unknown means retry.
    "POST /api2/json/nodes/pve1/qemu/999/status/reboot": T,
    "PUT /api2/json/nodes/pve1/qemu/123/config digest=<stale> cores=4": T,
    "PUT /api2/json/nodes/pve1/qemu/123/config (no parameters)": T,
    "POST /api2/json/nodes/pve1/qemu (vmid=123 already exists)": T,
    "GET /api2/json/nodes/pve1/qemu/123/agent/network-get-interfaces (agent hangs)": T,
    "POST /api2/json/nodes/pve1/qemu/124/status/reboot (VM stopped)": T,
    "POST /api2/json/nodes/pve1/qemu/123/status/shutdown (VM paused, forceStop=0)": T,
    "DELETE /api2/json/nodes/pve1/qemu/123 (VM running)": T,
    "DELETE /api2/json/nodes/pve1/qemu/123 (protection: 1)": T,
    "GET /api2/json/nodes/pve9/status (pve9 not a cluster member, not resolvable)": T,
    "GET /api2/json/nodes/pve1/qemu/123/foo": T,
    "DELETE /api2/json/nodes/pve1/qemu/123 with a request body": T,
    "GET /api2/json/nodes/pve2/qemu/130/status/current (pve2 powered off; request sent to pve1)": T,
    "long synchronous call forwarded to another node or to the local pvedaemon": T,
}


def load_records() -> list[dict[str, Any]]:
    return list(json.loads((FIXTURES / "errors.json").read_text()))


def api_error(record: dict[str, Any]) -> ApiError:
    """The ``ApiError`` the client builds from this answer (pve-reference §1.3)."""
    body = record["body"]
    message = record["reason_phrase"]
    errors: dict[str, str] = {}
    if isinstance(body, dict):
        message = body.get("message") or message
        errors = body.get("errors") or {}
    return ApiError(record["http_status"], message, errors)


RECORDS = load_records()


def test_vendored_fixtures_match_the_reference() -> None:
    if not SHARED.is_dir():
        pytest.skip("the shared pve-reference is not on this machine")
    for copy in sorted(FIXTURES.glob("*.json")):
        assert copy.read_bytes() == (SHARED / copy.name).read_bytes(), copy.name


def test_table_covers_every_captured_answer() -> None:
    assert {r["request"] for r in RECORDS} == set(EXPECTED)


@pytest.mark.parametrize("record", RECORDS, ids=[r["request"][:70] for r in RECORDS])
def test_classify_table(record: dict[str, Any]) -> None:
    err = api_error(record)
    got = classify("get", err)
    assert type(got) is EXPECTED[record["request"]]
    assert got.op == "get"
    # The operator sees Proxmox's own words, without its trailing newline.
    assert err.message.splitlines()[0] in str(got)
    assert not str(got).endswith("\n")
    if isinstance(got, PermanentError):
        assert got.remediation, "a permanent error must say what to change"
        assert got.remediation in str(got)


def test_parameter_errors_name_the_parameter() -> None:
    record = next(r for r in RECORDS if r["request"].endswith("name=proxy_fra_123"))
    text = str(classify("create", api_error(record)))
    assert "name: invalid format - value does not look like a valid DNS name" in text


def test_forbidden_names_the_missing_privilege() -> None:
    record = next(r for r in RECORDS if "lacks VM.PowerMgmt" in r["request"])
    got = classify("power", api_error(record))
    assert isinstance(got, PermanentError)
    assert "needs VM.PowerMgmt on /vms/123" in str(got)
    assert "grant" in got.remediation


def test_forbidden_without_detail_is_still_permanent() -> None:
    record = next(r for r in RECORDS if "lacks VM.Allocate" in r["request"])
    got = classify("create", api_error(record))
    assert isinstance(got, PermanentError)
    assert "Permission check failed" in str(got)


def test_unauthorized_says_to_fix_the_token() -> None:
    record = next(r for r in RECORDS if "wrong secret" in r["request"])
    got = classify("check", api_error(record))
    assert isinstance(got, PermanentError)
    assert "Authentication failed!" in str(got)
    assert "tokenFile" in got.remediation


def test_does_not_exist_during_create_is_transient_not_not_found() -> None:
    record = next(r for r in RECORDS if r["request"] == "GET /api2/json/nodes/pve1/qemu/999/config")
    assert isinstance(classify("get", api_error(record)), NotFoundError)
    assert isinstance(classify("delete", api_error(record)), NotFoundError)
    got = classify("create", api_error(record))
    assert type(got) is TransientError


def test_redirect_is_permanent_and_points_at_the_url() -> None:
    got = classify("check", ApiError(301, "Moved Permanently"))
    assert isinstance(got, PermanentError)
    assert "url" in got.remediation


# --- the non-API rows of entry 13 -----------------------------------------------------------


def test_task_failure_is_transient_and_carries_the_exit_status() -> None:
    exitstatus = "clone failed: lvcreate 'pve/vm-123-disk-0' error: insufficient free space"
    upid = "UPID:pve1:001F3A2C:0A1B2C3D:6968BAA0:qmclone:9000:svc-provision@pve!django:"
    got = classify("create", TaskFailed(upid, exitstatus))
    assert type(got) is TransientError
    assert exitstatus in str(got)


def test_tls_verification_failure_is_permanent() -> None:
    got = classify(
        "check", TLSVerifyFailed("GET /version: TLS certificate verification failed (x)")
    )
    assert isinstance(got, PermanentError)
    assert "caFile" in got.remediation


def test_token_file_missing_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Exception) as raised:
        read_token(str(tmp_path / "token"))
    got = classify("create", raised.value)
    assert type(got) is TransientError
    assert "tokenFile" in got.remediation


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"svc@pve!django\n",  # no secret
        b"svc@pve=0f4e",  # no token name
        b"svc!django=0f4e",  # no realm
        b"svc@pve!django=\n",  # empty secret
        b"svc@pve!django=a b",  # whitespace in the secret
        b"svc@pve!django=one\nsvc@pve!other=two\n",  # two lines
        b"\xff\xfe",  # not text
    ],
)
def test_token_file_malformed_is_permanent(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    with pytest.raises(Exception) as raised:
        read_token(str(path))
    got = classify("create", raised.value)
    assert isinstance(got, PermanentError)
    assert "USER@REALM!TOKENID=SECRET" in got.remediation


def test_ca_file_missing_is_transient_and_invalid_is_permanent(tmp_path: Path) -> None:
    with pytest.raises(Exception) as missing:
        load_ca(str(tmp_path / "ca.pem"))
    assert type(classify("check", missing.value)) is TransientError
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64 der\n-----END CERTIFICATE-----\n")
    with pytest.raises(Exception) as invalid:
        load_ca(str(bad))
    got = classify("check", invalid.value)
    assert isinstance(got, PermanentError)
    assert "caFile" in got.remediation


@pytest.mark.parametrize(
    "err",
    [
        RequestTimeout("GET /version: no answer in time (read timed out)"),
        DeadlineExceeded("deadline exceeded"),
        Cancelled("operation cancelled"),
        ConnectFailed("GET /version: connection failed (connection refused)"),
        ConnectionResetError(104, "Connection reset by peer"),
        EOFError(),
        ValueError("something nobody expected"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_network_cancellation_and_unknown_failures_are_transient(err: BaseException) -> None:
    assert type(classify("get", err)) is TransientError


def test_an_already_classified_error_keeps_its_class() -> None:
    err = PermanentError('placement.image "x" is not in the catalogue', op="create")
    assert classify("get", err) is err
