"""The ledger: every call counted, mutations told apart, no request body stored."""

from __future__ import annotations

from typing import Any

from provisioning.proxmox.api import Api
from pvesim.simulator import Simulator

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"


def test_calls_are_counted_by_key_method_and_path_parameters(engine: Simulator, api: Api) -> None:
    api.cluster_resources()
    api.vm_config("pve1", 100)
    api.vm_config("pve2", 101)
    api.vm_config("pve2", 101)
    ledger = engine.ledger
    assert ledger.count() == 4
    assert ledger.count(key="GET /nodes/{node}/qemu/{vmid}/config") == 3
    assert ledger.count(key="/nodes/{node}/qemu/{vmid}/config", vmid=101) == 2
    assert ledger.count("GET", "/cluster/resources") == 1
    entry = ledger.calls(key="/cluster/resources")[0]
    assert (entry.method, entry.status, entry.path, entry.mutation) == (
        "GET",
        200,
        "/cluster/resources",
        False,
    )
    assert entry.params == {"type": "vm"}
    assert [e.seq for e in ledger.calls()] == [1, 2, 3, 4]


def test_only_writes_that_changed_state_are_mutations(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    upid = api.clone("pve1", 9000, newid=101100, name="proxy-l")
    err = api_error(lambda: api.clone("pve1", 9000, newid=101100, name="proxy-l"))
    assert "config file already exists" in err.message
    [mutation] = engine.ledger.mutations()
    assert mutation.key == CLONE and mutation.upid == upid
    assert mutation.path_params == {"node": "pve1", "vmid": "9000"}
    refused = engine.ledger.calls(key=CLONE)[1]
    assert (refused.status, refused.mutation, refused.upid) == (500, False, None)


def test_descriptions_and_uploads_are_never_stored(engine: Simulator, api: Api) -> None:
    secret_mark = "proxyhub-uid=1234\nsensitive cloud-init? never"
    api.clone("pve1", 9000, newid=101101, name="proxy-l", description=secret_mark)
    api.upload_iso("pve1", "proxy-seeds", filename="a.iso", content=b"#cloud-config SECRET")
    clone = engine.ledger.calls(key=CLONE)[0]
    assert clone.params["description"] == f"<{len(secret_mark)} chars>"
    upload = engine.ledger.calls(key="/nodes/{node}/storage/{storage}/upload")[0]
    assert upload.upload == {"filename": "a.iso", "bytes": 20}
    dumped = repr([e.as_dict() for e in engine.ledger.calls()])
    assert "SECRET" not in dumped and "sensitive" not in dumped


def test_refused_requests_are_recorded_with_their_status(engine: Simulator, raw: Any) -> None:
    raw("GET", "/api2/json/version", token=None)
    raw("GET", "/api2/json/nodes/pve1/qemu/100/nonsense")
    statuses = [(e.key, e.status) for e in engine.ledger.calls()]
    assert statuses == [("GET /version", 401), (None, 501)]


def test_clear_empties_the_ledger(engine: Simulator, api: Api) -> None:
    api.version()
    engine.ledger.clear()
    assert engine.ledger.count() == 0
    api.version()
    assert len(engine.ledger) == 1


def test_a_post_that_only_reads_is_not_a_mutation(engine: Simulator, raw: Any) -> None:
    assert raw("POST", "/api2/json/nodes/pve1/qemu/100/agent/ping").status == 200
    [ping] = engine.ledger.calls("POST")
    assert ping.status == 200 and not ping.mutation
