"""``manage.py templates build`` (issue 14): ``--json`` and every refusal, nothing written."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from pump import Pump, Sim

from provisioning.models import Operation, Template
from provisioning.services.sweeper import operations_sweep
from tests.support.imageserver import ImageServer, image_server

pytestmark = pytest.mark.django_db


@pytest.fixture
def served() -> Iterator[ImageServer]:
    with image_server(b"cloud-image" * 100) as server:
        yield server


def _args(served: ImageServer, **changes: Any) -> list[str]:
    options: dict[str, Any] = {
        "--cluster": "pvesim",
        "--node": "pve1",
        "--image-url": served.url(),
        "--checksum": served.checksum,
        "--vmid": "9100",
        "--storage": "local-lvm",
        "--bridge": "vmbr0",
        "--key": "debian-13-built",
        "--template-version": "debian-13-genericcloud-20261016",
        "--guest-user": "debian",
    }
    options.update(changes)
    return ["build", *[str(x) for kv in options.items() for x in kv]]


def test_json_prints_the_finished_build(
    pump: Pump, sim: Sim, served: ImageServer, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # The workers run while the command waits: each pause of --wait lets the sweeper send what
    # is due (the command's own messages leave only when its transaction ends) and delivers it.
    settings.PROXYHUB_SWEEPER_GRACE_SECONDS = 0.0

    def workers_run(_seconds: float) -> None:
        time.sleep(0.05)
        pump.call(operations_sweep)
        pump.run()

    monkeypatch.setattr("provisioning.management.commands.templates._pause", workers_run)
    out = io.StringIO()
    pump.call(
        call_command, "templates", *_args(served), "--wait", "--timeout", "60", "--json", stdout=out
    )

    result = json.loads(out.getvalue())
    assert {k: result[k] for k in result if k != "builds"} == {
        "cluster": "pvesim",
        "node": "pve1",
        "vmid": 9100,
        "nodes": ["pve1"],
        "vmids": [9100],
        "templateKey": "debian-13-built",
        "storage": "local-lvm",
        "imageVolume": "local:iso/debian-13-genericcloud-amd64.img",
        "checksum": served.checksum,
        "templateVersion": "debian-13-genericcloud-20261016",
        "diskDevice": "scsi0",
        "sourceDiskGiB": 8,
        "guestUser": "debian",
        "state": "succeeded",
    }
    assert Template.objects.get(key="debian-13-built").vmid == 9100


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"--image-url": "file:///etc/passwd"}, "--image-url: 'file:///etc/passwd' is not an"),
        ({"--checksum": "sha256:xyz"}, "--checksum: a sha256 checksum is 64 hexadecimal"),
        ({"--checksum": "sha999:00"}, "--checksum: write ALGORITHM:HEX"),
        ({"--storage": "missing"}, "--storage: no storage 'missing' on node pve1"),
        ({"--storage": "proxy-seeds"}, "--storage: storage 'proxy-seeds' does not hold VM disks"),
        ({"--image-storage": "vmstore"}, "--image-storage: storage 'vmstore' does not accept"),
        ({"--vmid": "150000"}, "--vmid: 150000 is in the cluster's vmidRange"),
        ({"--vmid": "100"}, "--vmid: VMID 100 is already taken (on pve1)"),
        ({"--template-version": "a b"}, "--template-version: 1-128 letters"),
        ({"--key": "Not_A_Label"}, "--key: lower-case letters"),
    ],
)
def test_each_refusal_names_the_option_and_writes_nothing(
    pump: Pump, sim: Sim, served: ImageServer, changes: dict[str, str], message: str
) -> None:
    with pytest.raises(CommandError) as refused:
        pump.call(call_command, "templates", *_args(served, **changes), stdout=io.StringIO())
    assert message in str(refused.value)
    assert "nothing was written" in str(refused.value)
    assert not Operation.objects.exists()
    assert not Template.objects.filter(key__in=["debian-13-built", "Not_A_Label"]).exists()
    assert [e for e in sim.engine.ledger.mutations()] == []
    assert served.requests == []
