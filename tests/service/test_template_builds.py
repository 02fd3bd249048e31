"""Template builds through the journal (issue 14): the driver runs them as it runs a create.

Against the in-process simulator, which downloads the image for real from a loopback server.
What a user cares about: the catalogue says what was built; every UPID is in the journal; a
worker killed at any step boundary leaves a build that the sweeper finishes with no task
submitted twice; bad input is refused naming its field with nothing written; per-node copies
are what a create on that node clones.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any, NoReturn

import pytest
from django.db import transaction
from pump import Pump, Sim, proxy_spec

from provisioning.models import Operation, OperationStep, Template
from provisioning.models.choices import ACTIVE_STATES, OperationKind, OperationState, RequestedVia
from provisioning.proxmox.build_inputs import InputProblem
from provisioning.services import driver, operations
from provisioning.services.runners import Outcome
from provisioning.services.sweeper import operations_sweep
from provisioning.services.template_builds import BuildSpec, build_result, template_build_start
from tests.support.imageserver import ImageServer, image_server

pytestmark = pytest.mark.django_db

VMID = 9100
BUILD_MUTATIONS = (
    "POST /nodes/{node}/storage/{storage}/download-url",
    "POST /nodes/{node}/qemu",
    "PUT /nodes/{node}/qemu/{vmid}/resize",
    "POST /nodes/{node}/qemu/{vmid}/template",
)


@pytest.fixture
def served() -> Iterator[ImageServer]:
    with image_server(b"cloud-image" * 200) as server:
        yield server


def _spec(served: ImageServer, **kwargs: Any) -> BuildSpec:
    fields: dict[str, Any] = {
        "key": "debian-13-built",
        "node": "pve1",
        "image_url": served.url(),
        "checksum": served.checksum,
        "vmid": VMID,
        "storage": "local-lvm",
        "bridge": "vmbr0",
        "template_version": "debian-13-genericcloud-20261016",
        "guest_user": "debian",
    }
    fields.update(kwargs)
    return BuildSpec(**fields)


def _start(pump: Pump, sim: Sim, spec: BuildSpec) -> list[Operation]:
    ops: list[Operation] = pump.call(
        template_build_start, cluster=sim.cluster, spec=spec, user=None, via=RequestedVia.COMMAND
    )
    return ops


def _mutations(sim: Sim) -> Counter[str]:
    return Counter(str(e.key) for e in sim.engine.ledger.mutations())


def test_a_build_is_journalled_and_registered_in_the_catalogue(
    pump: Pump, sim: Sim, served: ImageServer
) -> None:
    (op,) = _start(pump, sim, _spec(served))
    pump.run()

    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert op.kind == OperationKind.TEMPLATE_BUILD and op.proxy is None
    template = Template.objects.get(cluster=sim.cluster, key="debian-13-built")
    assert (template.vmid, template.template_version, template.guest_user) == (
        VMID,
        "debian-13-genericcloud-20261016",
        "debian",
    )
    assert (template.disk_device, template.source_disk_gib, template.copies) == ("scsi0", 8, {})
    config = sim.api.vm_config("pve1", VMID)
    assert str(config["template"]) == "1" and config["serial0"] == "socket"
    # Every task's UPID is in the journal, one per task the node ran for the build.
    upids = set(
        OperationStep.objects.filter(operation=op).exclude(upid="").values_list("upid", flat=True)
    )
    types = sorted(u.split(":")[5] for u in upids)
    assert types == ["download", "qmcreate", "qmtemplate", "resize"]
    result = build_result(op)
    assert result["imageVolume"] == "local:iso/debian-13-genericcloud-amd64.img"
    assert result["state"] == "succeeded" and result["sourceDiskGiB"] == 8


def test_all_nodes_on_local_storage_builds_a_copy_per_node_that_creates_clone(
    pump: Pump, sim: Sim, served: ImageServer
) -> None:
    ops = _start(pump, sim, _spec(served, all_nodes=True))
    assert [o.progress["build"]["vmid"] for o in ops] == [VMID, VMID + 1, VMID + 2]
    pump.run()
    assert {o.state for o in Operation.objects.filter(pk__in=[o.pk for o in ops])} == {
        OperationState.SUCCEEDED
    }
    template = Template.objects.get(cluster=sim.cluster, key="debian-13-built")
    assert template.vmid == VMID
    assert template.copies == {"pve2": VMID + 1, "pve3": VMID + 2}
    assert len(served.requests) == 3  # each node downloaded the image itself

    sim.engine.ledger.clear()
    create = pump.call(
        operations.proxy_create,
        spec=proxy_spec(sim, "on-two", image="debian-13-built", zone="pve2"),
    )
    pump.run()
    create.refresh_from_db()
    assert create.state == OperationState.SUCCEEDED, create.last_error
    clones = [e for e in sim.engine.ledger.mutations() if str(e.key).endswith("/clone")]
    assert [(e.path_params["node"], e.path_params["vmid"]) for e in clones] == [
        ("pve2", str(VMID + 1))
    ]


def test_all_nodes_on_shared_storage_builds_one_template(
    pump: Pump, sim: Sim, served: ImageServer
) -> None:
    ops = _start(pump, sim, _spec(served, all_nodes=True, storage="vmstore"))
    assert len(ops) == 1
    pump.run()
    assert Template.objects.get(key="debian-13-built").copies == {}


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"image_url": "ftp://127.0.0.1/x.qcow2"}, "image-url", "http:// or https://"),
        ({"checksum": "crc32:abcd"}, "checksum", "ALGORITHM one of md5"),
        ({"checksum": "sha256:abcd"}, "checksum", "64 hexadecimal digits"),
        ({"storage": "nope"}, "storage", "no storage 'nope' on node pve1"),
        ({"storage": "local"}, "storage", "does not hold VM disks"),
        ({"image_storage": "local-lvm"}, "image-storage", "does not accept content import or iso"),
        ({"vmid": 100500}, "vmid", "in the cluster's vmidRange 100000-199999"),
        ({"vmid": 99}, "vmid", "is not from 100"),
        ({"vmid": 9000}, "vmid", "VMID 9000 is already taken (on pve1)"),
        ({"guest_user": "root"}, "guest-user", "not root"),
        ({"node": "pve9"}, "node", "is not a node of pvesim"),
    ],
)
def test_bad_input_is_refused_naming_the_field_with_nothing_written(
    pump: Pump, sim: Sim, served: ImageServer, change: dict[str, Any], field: str, text: str
) -> None:
    with pytest.raises(InputProblem) as refused:
        _start(pump, sim, _spec(served, **change))
    assert refused.value.field == field
    assert text in str(refused.value)
    assert not Operation.objects.exists()
    assert not Template.objects.filter(key="debian-13-built").exists()
    assert _mutations(sim) == Counter()


class WorkerKilled(BaseException):
    """The worker died here (nothing in proxyhub catches a BaseException)."""


STAGES = ["lookup", "download", "download_wait", "create", "create_wait", "resize",
          "resize_wait", "convert", "convert_wait"]  # fmt: skip


@pytest.mark.parametrize("stage", STAGES)
def test_a_build_killed_before_its_journal_commit_resumes_without_resubmitting(
    pump: Pump,
    sim: Sim,
    served: ImageServer,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
) -> None:
    """The step ran (its task submitted), the journal transaction was rolled back, the message
    lost: only the claim's expiry and the sweeper bring it back, and the next delivery reads the
    node's tasks and the VM's mark instead of submitting again."""
    settings.PROXYHUB_STEP_CLAIM_SECONDS = 1.0
    settings.PROXYHUB_SWEEPER_GRACE_SECONDS = 0.05
    persist = driver._persist
    armed = [True]

    def dying(
        op: Operation, claim: str, outcome: Outcome, now: datetime, seconds: float, **more: Any
    ) -> str | None:
        # ``more``: what the driver passes besides (slots held, whether it may chain); the
        # return value is the chained step's token, which the driver runs next.
        if not (armed[0] and outcome.result.step == stage and outcome.result.status != "error"):
            return persist(op, claim, outcome, now, seconds, **more)
        armed[0] = False
        with transaction.atomic():
            persist(op, claim, outcome, now, seconds, **more)
            _die()

    monkeypatch.setattr(driver, "_persist", dying)
    (op,) = _start(pump, sim, _spec(served))
    with pytest.raises(WorkerKilled):
        pump.run()
    assert not armed[0], f"stage {stage} never ran"

    deadline = time.monotonic() + 15
    while True:
        op.refresh_from_db()
        if op.state not in ACTIVE_STATES:
            break
        assert time.monotonic() < deadline, f"wedged at {op.progress}"
        pump.call(operations_sweep)
        pump.run()
        time.sleep(0.05)

    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert _mutations(sim) == Counter({key: 1 for key in BUILD_MUTATIONS})
    assert len(served.requests) == 1
    assert Template.objects.get(key="debian-13-built").vmid == VMID


def _die() -> NoReturn:
    raise WorkerKilled()


def test_builds_keep_to_the_nodes_task_slots(
    pump: Pump, sim: Sim, served: ImageServer, settings: Any
) -> None:
    """Two builds on one node with one task slot: their tasks never overlap on the node."""
    settings.PROXYHUB_NODE_TASK_LIMIT = 1
    # Tasks long enough that two builds' downloads would overlap if nothing held them apart.
    engine = sim.engine.sim
    engine.profile = replace(engine.profile, upload=0.3, task=0.2)
    _start(pump, sim, _spec(served, key="one"))
    _start(pump, sim, _spec(served, key="two", vmid=VMID + 100))
    pump.run()

    assert set(Operation.objects.values_list("state", flat=True)) == {OperationState.SUCCEEDED}
    tasks = sorted(
        (t.started_at, t.ended_at)
        for t in sim.engine.scheduler.tasks.values()
        if t.node == "pve1" and t.started_at is not None
    )
    assert len(tasks) == 8
    for (_, end), (start, _) in itertools.pairwise(tasks):
        assert end is not None and end <= start
