"""Seed 000 entry 16: node health checks, each failure with the reason that says what to fix.

Most rows run against the in-process simulator, whose control surface takes nodes offline,
denies privileges, stalls calls and breaks storages. The certificate rows use the real HTTPS
transport: a missing or invalid ``caFile`` fails before any connection, and a wrong CA is
checked against the simulator's HTTPS server on loopback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme

from provisioning.proxmox.api import Api, Call, Response, Transport
from provisioning.proxmox.checker import NodeCheck, check
from provisioning.proxmox.config import MachineType, ProxmoxConfig, TemplateRef
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import ApiError
from provisioning.proxmox.http import HttpTransport, http_api
from pvesim.server import SimServer
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport

SECRET = "4d7e1c0a-5b2f-4e8a-9c3d-2f1e0b9a8c7d"
TOKEN_ID = "proxyhub@pve!sim"
GOOD_TEMPLATE = 9000  # the simulator's default good template (simulator/defaults.py)


@pytest.fixture
def engine() -> Simulator:
    # Real clock: stalls and deadlines are real waits, kept to fractions of a second.
    return Simulator(profile="instant", token_secret=SECRET)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN_ID}={SECRET}\n")
    return path


def _config(
    token_file: Path | str,
    *,
    nodes: tuple[str, ...] = ("pve1",),
    templates: dict[str, int] | None = None,
    iso_storage: str = "proxy-seeds",
    url: str = "https://pve.example:8006",
    ca_file: str | None = None,
) -> ProxmoxConfig:
    return ProxmoxConfig(
        name="pvesim",
        url=url,
        token_file=str(token_file),
        ca_file=ca_file,
        nodes=nodes,
        iso_storage=iso_storage,
        templates={
            key: TemplateRef(vmid)
            for key, vmid in (templates or {"debian-13": GOOD_TEMPLATE}).items()
        },
        machine_types={"small": MachineType(cores=1, memory_mib=1024)},
        installation_id="test",
    )


@dataclass
class Wrapped:
    """A transport around the simulator's, for what the simulator cannot act out."""

    inner: Transport
    before: Callable[[Call], None] = lambda call: None
    after: Callable[[Call, Response], Response] = lambda call, response: response

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        self.before(call)
        return self.after(call, self.inner.send(call, deadline=deadline))


def _inactive_storage(call: Call, response: Response) -> Response:
    if call.name != "storage_status":
        return response
    # pve-reference §7.4: a storage restricted to other nodes reads enabled 0, active 0.
    return Response(response.status, {**response.data, "active": 0, "enabled": 0, "avail": 0})


@dataclass
class Row:
    reason: str
    says: str  # a fragment of the message the operator reads
    arrange: Callable[[Simulator], None] = lambda engine: None
    nodes: tuple[str, ...] = ("pve1",)
    templates: dict[str, int] | None = None
    iso_storage: str = "proxy-seeds"
    token: str | None = None  # what the transport sends, when not the engine's token
    request_timeout: float = 30.0
    after: Callable[[Call, Response], Response] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _drop_storage(node: str) -> Callable[[Simulator], None]:
    def arrange(engine: Simulator) -> None:
        with engine.lock:
            engine.cluster.nodes[node].storages.pop("proxy-seeds")

    return arrange


def _iso_content_removed(engine: Simulator) -> None:
    with engine.lock:
        engine.cluster.nodes["pve1"].storages["proxy-seeds"].content = ("images",)


ROWS: dict[str, Row] = {
    "reachable": Row(
        "Reachable",
        "node pve1 answers",
        details={
            "pveVersion": "9.2.20",
            "tokenID": TOKEN_ID,
            "isoStorage": "proxy-seeds",
            "templates": "1/1",
        },
    ),
    "node offline (595)": Row(
        "Unreachable",
        "Proxmox could not reach node pve3 (595",
        arrange=lambda e: e.control.node_offline("pve3"),
        nodes=("pve3",),
        details={"pveVersion": "9.2.20", "isoStorage": "proxy-seeds"},
    ),
    "596 from pveproxy": Row(
        "Unreachable",
        "(596 Connection timed out)",
        arrange=lambda e: e.control.fail_call("GET", "/nodes/{node}/status", kind="596"),
    ),
    "connection reset": Row(
        "Unreachable",
        "cannot reach Proxmox at https://pve.example:8006",
        arrange=lambda e: e.control.fail_call("GET", "/version", kind="reset"),
    ),
    "wrong secret (401)": Row(
        "Unauthorized",
        "fix the token file",
        token=f"{TOKEN_ID}=00000000-0000-4000-8000-000000000000",
        details={"tokenID": TOKEN_ID, "isoStorage": "proxy-seeds"},
    ),
    "no Sys.Audit on the node (403)": Row(
        "Forbidden",
        "lacks Sys.Audit on /nodes/pve1",
        arrange=lambda e: e.control.deny("/nodes/pve1", "Sys.Audit"),
    ),
    "no access to the storage (403 keeps its reason)": Row(
        "Forbidden",
        "on /storage/proxy-seeds",
        arrange=lambda e: e.control.deny("/storage/proxy-seeds", "*"),
    ),
    "other server error": Row(
        "APIError",
        "Proxmox answered 500 ",
        arrange=lambda e: e.control.fail_call("GET", "/nodes/{node}/status", kind="500"),
    ),
    "storage missing (400 No such storage.)": Row(
        "StorageNotFound",
        "No such storage.",
        arrange=_drop_storage("pve2"),
        nodes=("pve2",),
    ),
    "storage status 500": Row(
        "StorageNotFound",
        "storage 'proxy-seeds' is not available on node 'pve1'",
        arrange=lambda e: e.control.fail_call(
            "GET",
            "/nodes/{node}/storage/{storage}/status",
            kind="status",
            status=500,
            message="storage 'proxy-seeds' is not available on node 'pve1'",
        ),
    ),
    "storage inactive": Row(
        "StorageNotFound",
        "not active on this node",
        after=_inactive_storage,
        details={"isoStorageAvailGiB": 0.0},
    ),
    "storage without iso content": Row(
        "StorageNotFound",
        "does not allow ISO content",
        arrange=_iso_content_removed,
    ),
    "iso storage is an images storage": Row(
        "StorageNotFound",
        "isoStorage local-lvm on node pve1: it does not allow ISO content",
        iso_storage="local-lvm",
        details={"isoStorage": "local-lvm"},
    ),
    "template missing": Row(
        "TemplateNotFound",
        "template gone (VMID 9999) does not exist",
        templates={"debian-13": GOOD_TEMPLATE, "gone": 9999},
        details={"templates": "1/2"},
    ),
    "template is a plain VM": Row(
        "TemplateNotFound",
        "template web (VMID 100) is a VM, not a template",
        templates={"web": 100},
        details={"templates": "0/1"},
    ),
    "template is a container": Row(
        "TemplateNotFound",
        "template dns (VMID 200) is a container",
        templates={"dns": 200},
    ),
    "template hidden by a missing VM.Audit": Row(
        "TemplateNotFound",
        f"lacks VM.Audit on /vms/{GOOD_TEMPLATE}, which hides it",
        arrange=lambda e: e.control.deny(f"/vms/{GOOD_TEMPLATE}", "VM.Audit"),
    ),
    "request runs out of its own timeout": Row(
        "Timeout",
        "ran out of time while reading the status of node pve1",
        arrange=lambda e: e.control.fail_call("GET", "/nodes/{node}/status", kind="stall"),
        request_timeout=0.05,
        details={"pveVersion": "9.2.20"},
    ),
}


def _run(engine: Simulator, token_file: Path, row: Row) -> NodeCheck:
    row.arrange(engine)
    transport: Transport = SimTransport(
        engine, token=row.token, request_timeout=row.request_timeout
    )
    if row.after is not None:
        transport = Wrapped(transport, after=row.after)
    config = _config(
        token_file, nodes=row.nodes, templates=row.templates, iso_storage=row.iso_storage
    )
    results = check(Api(transport), config, deadline=Deadline(10))
    assert [r.node for r in results] == list(row.nodes)
    return results[0]


@pytest.mark.parametrize("case", list(ROWS), ids=list(ROWS))
def test_check_reasons_table(
    case: str, engine: Simulator, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    row = ROWS[case]
    caplog.set_level(logging.DEBUG)
    result = _run(engine, token_file, row)
    assert result.reason == row.reason, result
    assert result.ready is (row.reason == "Reachable")
    assert row.says in result.message, result.message
    assert result.details["isoStorage"] == row.iso_storage  # always there
    for key, value in row.details.items():
        assert result.details[key] == value, (key, result.details)
    assert result.duration >= 0
    # The secret is never in a result or a log line.
    assert SECRET not in repr(result)
    assert SECRET not in caplog.text


def test_a_reachable_node_reports_every_detail(engine: Simulator, token_file: Path) -> None:
    result = _run(engine, token_file, ROWS["reachable"])
    assert set(result.details) == {
        "pveVersion",
        "kernel",
        "tokenID",
        "isoStorage",
        "isoStorageAvailGiB",
        "templates",
        "memFreeBytes",
    }
    assert result.details["kernel"].endswith("-pve")
    storage = engine.cluster.nodes["pve1"].storages["proxy-seeds"]
    assert result.details["isoStorageAvailGiB"] == round(storage.avail / 1024**3, 2)
    # Entry 16's cost: four requests per node.
    assert len(engine.control.ledger()) == 4


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "does not exist"),
        ("proxyhub@pve!sim\n", "does not hold USER@REALM!TOKENID=SECRET"),
        (f"{TOKEN_ID}={SECRET}\nsecond line\n", "more than one line"),
    ],
)
def test_credentials_unavailable_without_a_request(
    content: str | None, says: str, engine: Simulator, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    api = Api(SimTransport(engine))
    results = check(api, _config(path, nodes=("pve1", "pve2")))
    assert [r.reason for r in results] == ["CredentialsUnavailable"] * 2
    assert all(
        says in r.message and "fix the token file, not Proxmox" in r.message for r in results
    )
    assert all(r.details == {"isoStorage": "proxy-seeds"} for r in results)
    assert all(SECRET not in repr(r) for r in results)
    assert engine.control.ledger() == []


def test_a_secret_echoed_by_the_server_is_blanked(engine: Simulator, token_file: Path) -> None:
    # A misbehaving proxy in front of Proxmox echoing the Authorization header (entry 14).
    def echo(call: Call) -> None:
        raise ApiError(401, f"bad header PVEAPIToken={TOKEN_ID}={SECRET}")

    api = Api(Wrapped(SimTransport(engine), before=echo))
    [result] = check(api, _config(token_file))
    assert result.reason == "Unauthorized"
    assert SECRET not in repr(result)
    assert "<redacted>" in result.message


def test_check_one_entry_per_node_in_config_order(engine: Simulator, token_file: Path) -> None:
    # The first configured node answers last; the order of results must not care.
    def slow_first(call: Call) -> None:
        if call.path_params.get("node") == "pve2":
            time.sleep(0.1)

    engine.control.node_offline("pve3")
    api = Api(Wrapped(SimTransport(engine), before=slow_first))
    results = check(api, _config(token_file, nodes=("pve2", "pve3", "pve1")))
    assert [(r.node, r.reason) for r in results] == [
        ("pve2", "Reachable"),
        ("pve3", "Unreachable"),
        ("pve1", "Reachable"),
    ]
    # And with fewer workers than nodes, still one entry each, in order.
    results = check(api, _config(token_file, nodes=("pve1", "pve2")), max_workers=1)
    assert [r.node for r in results] == ["pve1", "pve2"]
    assert check(api, _config(token_file, nodes=())) == []


def test_nodes_are_checked_concurrently(engine: Simulator, token_file: Path) -> None:
    # Every node's status request waits for the other two: only a concurrent check passes.
    barrier = threading.Barrier(3, timeout=5)

    def meet(call: Call) -> None:
        if call.name == "node_status":
            barrier.wait()

    api = Api(Wrapped(SimTransport(engine), before=meet))
    results = check(api, _config(token_file, nodes=("pve1", "pve2", "pve3")))
    assert [r.reason for r in results] == ["Reachable"] * 3


@pytest.mark.parametrize("how", ["expired", "cancelled"])
def test_check_expired_deadline_returns_promptly(
    how: str, engine: Simulator, token_file: Path
) -> None:
    deadline = Deadline(0) if how == "expired" else Deadline(60)
    if how == "cancelled":
        deadline.cancel()
    results = check(
        Api(SimTransport(engine)), _config(token_file, nodes=("pve1", "pve2")), deadline=deadline
    )
    assert [(r.node, r.reason, r.ready) for r in results] == [
        ("pve1", "Timeout", False),
        ("pve2", "Timeout", False),
    ]
    assert all(r.details["tokenID"] == TOKEN_ID for r in results)
    assert engine.control.ledger() == []  # nothing was sent


@pytest.fixture
def stalled(engine: Simulator) -> Iterator[Api]:
    # Every node status stalls far longer than the test waits.
    engine.control.fail_call("GET", "/nodes/{node}/status", kind="stall", times=100)
    yield Api(SimTransport(engine, request_timeout=600))


def test_a_round_cancelled_mid_flight_answers_timeout_with_what_it_got(
    stalled: Api, token_file: Path
) -> None:
    deadline = Deadline(600)
    threading.Timer(0.1, deadline.cancel).start()
    started = time.monotonic()
    results = check(stalled, _config(token_file, nodes=("pve1", "pve2", "pve3")), deadline=deadline)
    # Promptly: a stalled request holds nothing up once the round is over (600 s otherwise).
    assert time.monotonic() - started < 30
    assert [r.reason for r in results] == ["Timeout"] * 3
    for result in results:
        assert "reading the status of node" in result.message
        assert result.details["pveVersion"] == "9.2.20"  # gathered before the stall
        assert "kernel" not in result.details


def test_a_round_whose_deadline_expires_mid_flight(stalled: Api, token_file: Path) -> None:
    started = time.monotonic()
    results = check(stalled, _config(token_file, nodes=("pve1", "pve2")), deadline=Deadline(0.2))
    assert time.monotonic() - started < 30
    assert [r.reason for r in results] == ["Timeout", "Timeout"]


# --- certificates, over the real HTTPS transport -------------------------------------------


def _http_check(
    token_file: Path, url: str, ca_file: str | None, engine: Simulator | None = None
) -> list[NodeCheck]:
    config = _config(token_file, nodes=("pve1", "pve2"), url=url, ca_file=ca_file)
    api = http_api(url, str(token_file), ca_file=ca_file, request_timeout=5, connect_timeout=5)
    try:
        return check(api, config, deadline=Deadline(20))
    finally:
        transport = api.transport
        assert isinstance(transport, HttpTransport)
        transport.close()


def test_ca_file_missing_is_certificate_invalid(token_file: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "absent-ca.pem")
    results = _http_check(token_file, "https://127.0.0.1:9", missing)
    assert [r.reason for r in results] == ["CertificateInvalid"] * 2
    assert "fix caFile or url" in results[0].message and "not the host" in results[0].message
    assert "absent-ca.pem" in results[0].message


def test_ca_file_without_a_certificate_is_certificate_invalid(
    token_file: Path, tmp_path: Path
) -> None:
    not_pem = tmp_path / "ca.pem"
    key = trustme.CA().private_key_pem.bytes()
    not_pem.write_bytes(key)
    results = _http_check(token_file, "https://127.0.0.1:9", str(not_pem))
    assert [r.reason for r in results] == ["CertificateInvalid"] * 2
    assert "PRIVATE KEY" not in results[0].message  # the CA file's content is never shown


@pytest.fixture
def https_sim(engine: Simulator, tmp_path: Path) -> Iterator[tuple[SimServer, Path]]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_path = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_path))
    server = SimServer(engine, certfile=str(cert), keyfile=str(key)).start()
    yield server, ca_path
    server.stop()


@pytest.mark.http
def test_over_https_with_the_right_ca_the_nodes_are_reachable(
    https_sim: tuple[SimServer, Path], token_file: Path
) -> None:
    server, ca_path = https_sim
    results = _http_check(token_file, server.url, str(ca_path))
    assert [r.reason for r in results] == ["Reachable", "Reachable"]


@pytest.mark.http
def test_a_certificate_from_another_ca_is_certificate_invalid(
    https_sim: tuple[SimServer, Path], token_file: Path, tmp_path: Path
) -> None:
    server, _ = https_sim
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    results = _http_check(token_file, server.url, str(other_ca))
    assert [r.reason for r in results] == ["CertificateInvalid"] * 2
    assert "fix caFile or url" in results[0].message


@pytest.mark.http
def test_a_closed_port_is_unreachable(token_file: Path, https_sim: tuple[SimServer, Path]) -> None:
    server, ca_path = https_sim
    url = server.url
    server.stop()  # nothing listens there any more
    results = _http_check(token_file, url, str(ca_path))
    assert [r.reason for r in results] == ["Unreachable"] * 2
