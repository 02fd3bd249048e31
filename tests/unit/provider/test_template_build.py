"""Template builds against the in-process simulator (issue 14; seed 004: downloaded images).

The node downloads the image for real from a loopback server, the VM is created with its disk
imported, and it becomes a template. A build killed at any step boundary, with its record saved
or with the reply of its submission lost, continues from the record alone and submits nothing
twice (seed 001: receipts), and a build never touches a VM it did not make.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from provider_world import World, make_world

from provisioning.proxmox.marks import parse_mark
from provisioning.proxmox.steps import Progress, StepResult
from provisioning.proxmox.template_build import TemplateBuildRequest
from tests.support.imageserver import ImageServer, image_server

VMID = 9100
DOWNLOAD = "POST /nodes/{node}/storage/{storage}/download-url"
CREATE = "POST /nodes/{node}/qemu"
TEMPLATE = "POST /nodes/{node}/qemu/{vmid}/template"


@pytest.fixture
def served() -> Iterator[ImageServer]:
    with image_server() as server:
        yield server


def _request(served: ImageServer, **kwargs: object) -> TemplateBuildRequest:
    fields: dict[str, object] = {
        "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, "build")),
        "key": "debian-13",
        "node": "pve1",
        "vmid": VMID,
        "url": served.url(),
        "checksum": served.checksum,
        "storage": "local-lvm",
        "bridge": "vmbr0",
    }
    fields.update(kwargs)
    return TemplateBuildRequest(**fields)  # type: ignore[arg-type]


def _build(world: World, req: TemplateBuildRequest) -> StepResult:
    p = world.provider
    return world.drive(lambda pr: p.template_build_step(req, pr), p.new_template_build_progress())


def _mutations(world: World) -> Counter[str]:
    return Counter(str(e.key) for e in world.engine.ledger.mutations())


def test_a_build_downloads_imports_and_converts(world: World, served: ImageServer) -> None:
    req = _request(served)
    result = _build(world, req)

    assert result.status == "done", result.error
    config = world.api.vm_config("pve1", VMID)
    assert str(config["template"]) == "1"
    assert str(config["agent"]) == "1"
    assert config["serial0"] == "socket" and config["vga"] == "serial0"
    assert not [k for k, v in config.items() if "cloudinit" in str(v)]
    assert config["scsi0"].startswith("local-lvm:base-9100-disk-0,")
    assert "size=8G" in config["scsi0"]
    assert "bridge=vmbr0" in config["net0"]
    mark = parse_mark(config["description"])
    assert (
        mark.managed and mark.uid == req.uid and mark.installation == world.config.installation_id
    )
    images = world.api.storage_content("pve1", "local", content="iso")
    assert [i["size"] for i in images if i["volid"].endswith("genericcloud-amd64.img")] == [
        len(served.data)
    ]
    assert served.requests == ["/debian-13-genericcloud-amd64.qcow2"]
    assert result.details["sourceDiskGiB"] == 8
    tasks = {t["type"] for t in world.api.node_tasks("pve1", source="all", limit=50)}
    assert {"download", "qmcreate", "resize", "qmtemplate"} <= tasks


def test_a_wrong_checksum_fails_the_download_and_creates_nothing(
    world: World, served: ImageServer
) -> None:
    wrong = "sha256:" + "0" * 64
    result = _build(world, _request(served, checksum=wrong))

    assert result.status == "error" and result.error is not None
    assert result.error.kind == "permanent"
    assert "checksum mismatch: got '" in result.error.message
    assert f"!= expect '{'0' * 64}'" in result.error.message
    assert CREATE not in _mutations(world)
    assert [e for e in world.api.cluster_resources() if e["vmid"] == VMID] == []


def test_a_vm_it_did_not_make_is_never_touched(world: World, served: ImageServer) -> None:
    before = world.api.vm_config("pve1", 100)
    result = _build(world, _request(served, vmid=100))

    assert result.status == "error" and result.error is not None
    assert result.error.kind == "permanent"
    assert "VMID 100 is taken by a guest this build did not make" in result.error.message
    assert _mutations(world) == Counter()
    assert world.api.vm_config("pve1", 100) == before


def test_a_build_of_a_template_already_made_submits_nothing(
    world: World, served: ImageServer
) -> None:
    req = _request(served)
    assert _build(world, req).status == "done"
    world.engine.ledger.clear()

    again = _build(world, req)

    assert again.status == "done"
    assert _mutations(world) == Counter()


def _crash_points(results: list[StepResult]) -> list[tuple[int, bool]]:
    after = [(i, False) for i in range(len(results))]
    lost = [(i, True) for i, r in enumerate(results) if r.submitted]
    return after + lost


def _clean_build() -> tuple[list[tuple[int, bool]], Counter[str]]:
    with image_server(b"image" * 100) as served:
        world = make_world()
        assert _build(world, _request(served)).status == "done"
        return _crash_points(world.results), _mutations(world)


BUILD_POINTS, BUILD_MUTATIONS = _clean_build()


@pytest.mark.parametrize(
    ("crash_at", "lost_reply"),
    BUILD_POINTS,
    ids=[f"step{i}-{'lost-reply' if lost else 'after'}" for i, lost in BUILD_POINTS],
)
def test_a_killed_build_resumes_without_a_second_submission(
    crash_at: int, lost_reply: bool
) -> None:
    with image_server(b"image" * 100) as served:
        world = make_world()
        req = _request(served)
        run = world.provider.template_build_step
        progress: Progress = world.provider.new_template_build_progress()
        for _ in range(crash_at):
            progress = world.step(lambda p: run(req, p), progress).progress
        crashed = world.step(lambda p: run(req, p), progress)
        assert crashed.submitted or not lost_reply
        if not lost_reply:
            progress = crashed.progress
        if crashed.status == "done" and not lost_reply:
            result = crashed
        else:
            fresh = world.fresh_provider()
            result = world.drive(lambda p: fresh.template_build_step(req, p), progress)

        assert result.status == "done", result.error
        assert str(world.api.vm_config("pve1", VMID)["template"]) == "1"
        assert _mutations(world) == BUILD_MUTATIONS
        assert len(served.requests) == 1
