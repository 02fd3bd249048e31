"""Secret canaries through the whole service (reliability battery item 19, DESIGN.md §8).

The Proxmox token secret, the CA and a proxy's cloud-init are unique canaries here. A fleet is
created, fails once on a 401 and once on a 500, is observed, reconciled and deleted, all over
the real HTTPS client against the HTTPS simulator. Then every place a secret could leak is
searched: every row of every table, every captured log record at DEBUG, every step message
the services sent, /metrics, and the error texts of the journal. The cloud-init must still
have reached Proxmox, inside the seed ISO, and nowhere else.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from django.apps import apps
from django.core import serializers
from pump import Pump, seed_volid_of

from provisioning.models import Cluster, MachineType, Node, Proxy, Template
from provisioning.proxmox.http import HttpTransport
from provisioning.services import operations
from provisioning.services.operations import ProxySpec
from provisioning.services.providers import use_transport_factory
from provisioning.services.reconcile import reconcile_round
from pvesim.server import SimServer
from pvesim.simulator import Simulator

pytestmark = pytest.mark.django_db

TOKEN_SECRET = str(uuid.UUID("c0ffee00-1234-4abc-8def-0123456789ab"))
CLOUD_INIT_CANARY = "CANARY-user-data-7d41f0c2"
CA_MARKER_LINES = 3  # lines of the CA's base64 body searched for


@pytest.fixture
def https_cluster(tmp_path: Path, settings: Any) -> Iterator[tuple[Simulator, Cluster, str]]:
    settings.PROXYHUB_ADDRESS_POLL_SECONDS = 0.02
    settings.PROXYHUB_POLL_INTERVAL_SECONDS = 0.02
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca_file, cert, key = tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    engine = Simulator(profile="fast", time_scale=0.05, token_secret=TOKEN_SECRET)
    token_file = tmp_path / "token"
    token_file.write_text(engine.token + "\n")
    server = SimServer(engine, certfile=str(cert), keyfile=str(key)).start()
    cluster = Cluster.objects.create(
        name="canary",
        url=server.url,
        token_file=str(token_file),
        ca_file=str(ca_file),
        iso_storage="proxy-seeds",
    )
    for position, node in enumerate(engine.node_names()):
        Node.objects.create(cluster=cluster, name=node, position=position)
    Template.objects.create(cluster=cluster, key="debian-13", vmid=engine.default_template_vmid())
    MachineType.objects.create(cluster=cluster, key="small", cores=1, memory_mib=512)
    cluster.save()

    def http(config: Any) -> HttpTransport:
        return HttpTransport(
            config.url, config.token_file, ca_file=config.ca_file, request_timeout=10.0
        )

    ca_body = ca.cert_pem.bytes().decode().splitlines()[1 : 1 + CA_MARKER_LINES]
    try:
        with use_transport_factory(http):
            yield engine, cluster, "".join(ca_body)
    finally:
        server.stop()


def _database_dump() -> str:
    parts = []
    for model in apps.get_models():
        rows = model._default_manager.all()
        parts.append(serializers.serialize("json", rows))
    return "\n".join(parts)


def test_no_secret_leaves_its_place(
    pump: Pump,
    https_cluster: tuple[Simulator, Cluster, str],
    caplog: pytest.LogCaptureFixture,
    client: Any,
    settings: Any,
) -> None:
    engine, cluster, ca_text = https_cluster
    settings.PROXYHUB_KEEP_SEED_ISO = True  # the seed is read back below
    caplog.set_level(logging.DEBUG)
    sent: list[tuple[Any, ...]] = []
    original = pump.send

    def record(*args: Any, **kwargs: Any) -> None:
        sent.append((args, kwargs))
        original(*args, **kwargs)

    pump.send = record  # type: ignore[method-assign]
    cloud_init = f"#cloud-config\nwrite_files:\n- content: {CLOUD_INIT_CANARY}\n".encode()
    specs = [
        ProxySpec(f"c{i}", cluster, "small", "debian-13", "pve1", cloud_init) for i in range(3)
    ]
    # A transient 500 on one upload and a permanent 401 on one start, so error paths run.
    engine.control.fail_call("POST", "/nodes/{node}/storage/{storage}/upload", kind="500")
    engine.control.fail_call(
        "POST",
        "/nodes/{node}/qemu/{vmid}/status/start",
        kind="status",
        status=401,
        message="authentication failure",
    )
    pump.call(operations.proxies_create, specs=specs)
    pump.run()
    failed = Proxy.objects.filter(phase="Failed")
    assert failed.count() == 1  # the 401 latched one proxy
    pump.call(operations.proxy_retry, proxy=failed.get())
    pump.run()
    assert set(Proxy.objects.values_list("phase", flat=True)) == {"Running"}
    pump.call(reconcile_round)
    pump.run()
    metrics = client.get("/metrics").content.decode()
    seed = engine.control.volume_data("pve1", seed_volid_of(Proxy.objects.get(name="c0")))
    for proxy in Proxy.objects.all():
        pump.call(operations.proxy_request_delete, proxy=proxy)
    dump_before_delete = _database_dump()
    pump.run()
    assert not Proxy.objects.exists()

    haystacks = {
        "database": dump_before_delete + _database_dump(),
        "logs": "\n".join(
            record.getMessage() + " " + json.dumps(vars(record), default=str)
            for record in caplog.records
        ),
        "messages": json.dumps(sent, default=str),
        "metrics": metrics,
    }
    for where, text in haystacks.items():
        assert TOKEN_SECRET not in text, f"token secret in {where}"
        assert CLOUD_INIT_CANARY not in text, f"cloud-init in {where}"
        assert ca_text not in text, f"CA content in {where}"
    # The canaries did their jobs: the token authenticated, the cloud-init reached Proxmox.
    assert "canary" in haystacks["database"]
    uploads = engine.ledger.calls("POST", "POST /nodes/{node}/storage/{storage}/upload")
    assert uploads and all(e.upload and e.upload.get("bytes") for e in uploads)
    assert CLOUD_INIT_CANARY not in json.dumps([e.as_dict() for e in engine.ledger.calls()])
    assert seed is not None and CLOUD_INIT_CANARY.encode() in seed
