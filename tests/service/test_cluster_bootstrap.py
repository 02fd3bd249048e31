"""Issue 14: ``bootstrap_cluster`` over the real HTTPS client against the HTTPS simulator.

The simulator's default token plays the administrator (it holds every right); the token the
bootstrap makes holds only its ACLs, so the create at the end meets Proxmox's permission checks
at every step. The administrator's secret is a canary: after the runs it must be nowhere but
its own file (logs at DEBUG, every table, stdout/stderr, the credentials directory).
Run on SQLite and on PostgreSQL (``DATABASE_URL``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from django.apps import apps
from django.core import serializers
from django.core.management import call_command
from django.core.management.base import CommandError
from pump import Pump

from provisioning.models import Cluster, MachineType, Node, Proxy, Template
from provisioning.services import operations
from provisioning.services.operations import ProxySpec
from provisioning.services.providers import forget_providers
from pvesim.server import SimServer
from pvesim.simulator import Simulator

pytestmark = pytest.mark.django_db

ADMIN_SECRET = str(uuid.UUID("adadadad-1234-4abc-8def-0123456789ab"))


@dataclass
class World:
    engine: Simulator
    cluster: Cluster
    creds: Path
    admin_file: Path


@pytest.fixture
def world(tmp_path: Path, settings: Any) -> Iterator[World]:
    settings.PROXYHUB_ADDRESS_POLL_SECONDS = 0.02
    settings.PROXYHUB_POLL_INTERVAL_SECONDS = 0.02
    creds = tmp_path / "credentials"
    creds.mkdir()
    settings.PROXYHUB_CREDENTIALS_DIR = str(creds)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca_file, cert, key = creds / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    engine = Simulator(profile="fast", time_scale=0.05, token_secret=ADMIN_SECRET)
    admin_file = creds / "admin.token"
    admin_file.write_text(engine.token + "\n")
    server = SimServer(engine, certfile=str(cert), keyfile=str(key)).start()
    # Before the bootstrap the catalogue names a token file that does not exist yet.
    cluster = Cluster.objects.create(
        name="home",
        url=server.url,
        token_file=str(creds / "missing.token"),
        ca_file=str(ca_file),
        iso_storage="proxy-seeds",
    )
    for position, node in enumerate(engine.node_names()):
        Node.objects.create(cluster=cluster, name=node, position=position)
    Template.objects.create(cluster=cluster, key="debian-13", vmid=engine.default_template_vmid())
    MachineType.objects.create(cluster=cluster, key="small", cores=1, memory_mib=512)
    cluster.save()
    forget_providers()
    try:
        yield World(engine, cluster, creds, admin_file)
    finally:
        forget_providers()
        server.stop()


def bootstrap(w: World, *extra: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "bootstrap_cluster",
        "--cluster",
        "home",
        "--admin-token-file",
        str(w.admin_file),
        *extra,
        stdout=out,
        stderr=err,
    )
    return out.getvalue(), err.getvalue()


def _database_dump() -> str:
    return "\n".join(
        serializers.serialize("json", model._default_manager.all()) for model in apps.get_models()
    )


def test_bootstrap_then_a_second_run_changes_nothing_then_the_new_token_creates(
    world: World, pump: Pump, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    out, err = bootstrap(world, "--json")
    result = json.loads(out)
    assert {"pool", "role", "user", "tokenId", "tokenFile", "aclPaths"} <= set(result)
    assert result["pool"] == "proxyhub"
    assert result["role"] == "ProxyHub"
    assert result["user"] == "proxyhub@pve"
    assert result["tokenId"] == "proxyhub@pve!proxyhub"
    assert result["aclPaths"][0] == "/pool/proxyhub"
    assert "/" not in result["aclPaths"]
    assert result["privileges"]["status"] == "passed"
    assert result["privileges"]["warnings"] == []

    token_file = Path(result["tokenFile"])
    assert token_file.parent == world.creds
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    access = world.engine.cluster.access
    secret = access.users["proxyhub@pve"].tokens["proxyhub"].secret
    assert token_file.read_text() == f"proxyhub@pve!proxyhub={secret}\n"
    world.cluster.refresh_from_db()
    assert (world.cluster.token_file, world.cluster.pool) == (str(token_file), "proxyhub")

    # Run twice, changes nothing: not one mutation reaches Proxmox, the row stays as it is.
    updated_at = world.cluster.updated_at
    world.engine.ledger.clear()
    out2, _ = bootstrap(world, "--json")
    again = json.loads(out2)
    assert world.engine.ledger.mutations() == []
    assert again["changes"] == []
    assert "token proxyhub@pve!proxyhub" in again["verified"]
    world.cluster.refresh_from_db()
    assert world.cluster.updated_at == updated_at

    # proxyhub now works with its own token only, and its VM joins the pool.
    world.engine.ledger.clear()
    pump.call(
        operations.proxies_create,
        specs=[ProxySpec("least", world.cluster, "small", "debian-13", "pve1", b"#cloud-config\n")],
    )
    pump.run()
    proxy = Proxy.objects.get(name="least")
    assert proxy.phase == "Running", proxy.last_error
    assert proxy.vmid in access.pools["proxyhub"].vms
    identities = {e.upid.split(":")[7] for e in world.engine.ledger.calls() if e.upid}
    assert identities == {"proxyhub@pve!proxyhub"}

    # The administrator's token was used, never kept.
    haystacks = {
        "stdout/stderr": out + err + out2,
        "logs": "\n".join(
            r.getMessage() + " " + json.dumps(vars(r), default=str) for r in caplog.records
        ),
        "database": _database_dump(),
        "credentials dir": "\n".join(
            p.read_text(errors="replace")
            for p in world.creds.iterdir()
            if p.is_file() and p != world.admin_file
        ),
    }
    for where, text in haystacks.items():
        assert ADMIN_SECRET not in text, f"admin token in {where}"
        assert secret not in text or where == "credentials dir", f"new secret in {where}"


def test_a_missing_privilege_fails_naming_it_and_its_path(world: World) -> None:
    bootstrap(world)
    world.engine.control.deny("/storage/proxy-seeds", "Datastore.AllocateTemplate")
    out = io.StringIO()
    with pytest.raises(CommandError, match="lacks privileges"):
        call_command(
            "bootstrap_cluster",
            "--cluster",
            "home",
            "--admin-token-file",
            str(world.admin_file),
            stdout=out,
        )
    assert "FAILED: missing Datastore.AllocateTemplate on /storage/proxy-seeds" in out.getvalue()


def test_a_lost_token_file_is_refused_until_rotated(world: World) -> None:
    out, _ = bootstrap(world, "--json")
    token_file = Path(json.loads(out)["tokenFile"])
    token_file.unlink()
    world.engine.ledger.clear()
    with pytest.raises(CommandError, match="--rotate-token"):
        bootstrap(world)
    assert world.engine.ledger.mutations() == []
    out, _ = bootstrap(world, "--rotate-token", "--json")
    rotated = json.loads(out)
    assert "created token proxyhub@pve!proxyhub" in rotated["changes"]
    assert rotated["privileges"]["status"] == "passed"
    assert len(world.engine.cluster.access.users["proxyhub@pve"].tokens) == 1


@pytest.mark.parametrize(
    ("where", "fragment"),
    [("outside", "--admin-token-file: "), ("absent", "--admin-token-file: no file at")],
)
def test_an_admin_token_file_outside_the_directory_or_absent_is_refused(
    world: World, tmp_path: Path, where: str, fragment: str
) -> None:
    if where == "outside":
        path = tmp_path / "elsewhere.token"
        path.write_text(world.engine.token + "\n")
    else:
        path = world.creds / "nope.token"
    world.engine.ledger.clear()
    with pytest.raises(CommandError) as err:
        call_command("bootstrap_cluster", "--cluster", "home", "--admin-token-file", str(path))
    assert str(err.value).startswith(fragment)
    assert ADMIN_SECRET not in str(err.value)
    assert world.engine.ledger.calls() == []
    assert not os.path.exists(world.creds / "home-proxyhub.token")
