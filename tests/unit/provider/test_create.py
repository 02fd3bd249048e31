"""Create (seed 000 entries 2, 4 to 8 and 10) over the in-process simulator."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from provider_world import CLOUDINIT_TEMPLATE, GOOD_TEMPLATE, World, catalogue

from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import PermanentError, TransientError
from provisioning.proxmox.identity import Identity
from provisioning.proxmox.ids import vmid_for
from provisioning.proxmox.marks import parse_mark, render_mark
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.seed import build_seed_iso, uid_tag
from provisioning.proxmox.steps import TIMING, StepResult, advance
from tests.support.simtransport import sim_api

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
START = "POST /nodes/{node}/qemu/{vmid}/status/start"
RESIZE = "PUT /nodes/{node}/qemu/{vmid}/resize"
UPLOAD = "POST /nodes/{node}/storage/{storage}/upload"
VOLUME = "DELETE /nodes/{node}/storage/{storage}/content/{volume}"
TASK = "GET /nodes/{node}/tasks/{upid}/status"
STATUS = "GET /nodes/{node}/qemu/{vmid}/status/current"


def test_create_returns_only_when_running(world: World) -> None:
    req = world.request("run")
    result = world.create(req)
    assert result.status == "done"
    vmid = int(result.provider_id.split("/")[1])
    status = world.api.vm_status("pve1", vmid)
    assert (status["status"], status["qmpstatus"]) == ("running", "running")
    # Every step before the last left the VM not yet reported: no "done" came early.
    assert [r.status for r in world.results].count("done") == 1
    assert world.results[-1].step == "running"


def test_the_start_wait_that_sees_the_vm_run_ends_the_create(world: World) -> None:
    """Step 9 (the VM runs) is what the start's wait reads: the look that sees it ends the
    create there, journalled as the running check, instead of handing over to a running step
    that reads nothing (issue 12: a delivery per create)."""
    req = world.request("ends")
    result = world.create(req)
    assert result.status == "done"
    steps = [(r.step, r.status) for r in world.results]
    assert steps[-1] == ("running", "done")
    assert steps[-2][0] == "start_wait" and steps[-2][1] == "wait", steps
    assert ("start_wait", "continue") not in steps


def test_create_repeat_returns_same_id_and_creates_nothing(world: World) -> None:
    req = world.request("again")
    first = world.create(req)
    world.settle()
    before = len(world.engine.ledger.mutations())
    second = world.create(req)
    assert second.provider_id == first.provider_id
    assert len(world.engine.ledger.mutations()) == before
    assert len(world.vms_named("proxy-again")) == 1


def test_create_writes_mark_tag_seed_and_sizes(world: World) -> None:
    req = world.request("marked", zone="pve2")
    result = world.create(req)
    vmid = int(result.provider_id.split("/")[1])
    assert vmid == vmid_for(req.uid, 0, 100000, 199999)
    config = world.api.vm_config("pve2", vmid)
    mark = parse_mark(config["description"])
    assert (mark.managed, mark.uid, mark.installation) == (True, req.uid, "inst-test")
    assert mark.created_at is not None
    assert config["tags"] == "proxyhub"
    assert (config["cores"], config["memory"], config["agent"]) == ("1", "1024", "1")
    assert config["ide2"] == f"{world.seed_volid(req)},media=cdrom"
    assert "_" + uid_tag(req.uid) + "-seed.iso" in config["ide2"]
    assert "size=10G" in config["scsi0"]
    clone = world.engine.ledger.calls("POST", CLONE)[0]
    # Cloned from the template's node onto pve2 with target=, as a full clone (entry 4).
    assert clone.path_params["node"] == "pve1"
    assert clone.params["target"] == "pve2" and clone.params["full"] == "1"


def test_create_template_with_cloud_init_drive_is_permanent(world: World) -> None:
    result = world.create(world.request("ci", image="debian-13-cloudinit"))
    assert result.status == "error"
    assert isinstance(result.error, PermanentError)
    assert "cloud-init drive" in str(result.error) and str(CLOUDINIT_TEMPLATE) in str(result.error)
    assert world.engine.ledger.mutations() == []


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("zone", "pve9", 'placement.zone "pve9" is not in proxmox.nodes'),
        ("machine_type", "huge", 'placement.machineType "huge" is not in proxmox.machineTypes'),
        ("image", "arch", 'placement.image "arch" is not in proxmox.templates'),
    ],
)
def test_create_unknown_placement_is_permanent_before_any_call(
    world: World, field: str, value: str, text: str
) -> None:
    result = world.create(world.request("bad", **{field: value}))
    assert isinstance(result.error, PermanentError)
    assert text in str(result.error)
    assert world.engine.ledger.calls() == []


@pytest.mark.parametrize(
    "scsi0",
    [None, "vmstore:base-9000-disk-0,discard=on"],
    ids=["no-boot-disk", "no-readable-size"],
)
def test_create_template_without_a_usable_boot_disk_is_refused_before_the_clone(
    world: World, scsi0: str | None
) -> None:
    """Seed 000 entry 4: a template the create could not use is refused before any VM exists.
    With ``diskGiB`` set, the resize (entry 6) needs the boot disk and its ``size=``; finding
    that out in the configure step left a clone and an uploaded seed that fixing the template
    cannot help."""
    template = world.engine.cluster.guests[GOOD_TEMPLATE]
    if scsi0 is None:
        template.config.pop("scsi0")
        template.config.pop("boot", None)
        template.config.pop("bootdisk", None)
    else:
        template.config["scsi0"] = scsi0
    result = world.create(world.request("nodisk"))  # machine type "small" sets diskGiB
    assert isinstance(result.error, PermanentError)
    assert f"template {GOOD_TEMPLATE} has no boot disk with a readable size" in str(result.error)
    assert world.engine.ledger.mutations() == []


def test_create_template_that_is_not_a_template_is_permanent(world: World) -> None:
    config = ProxmoxConfig.from_mapping(
        {**catalogue(), "templates": {"debian-13": {"vmid": 100}}},
        installation_id="inst-test",
    )
    provider = Provider(world.api, config, clock=world.clock)
    result = world.create(world.request("nt"), provider)
    assert isinstance(result.error, PermanentError)
    assert "VM 100 is not a template" in str(result.error)


def test_create_adopting_a_vm_whose_mark_has_no_uid_writes_the_whole_mark(world: World) -> None:
    """Seed 000 entry 2 adopts our-named VM whose mark carries no uid. Left so, nothing but its
    name would tie it to the proxy (GC would count it an orphan), so the adoption writes the
    proxy's uid and the installation into the mark, keeping what an admin wrote below it and
    the original creation time."""
    req = world.request("blank")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name=req.vm_name)
    world.engine.control.advance(30)
    world.api.set_vm_config(
        "pve1",
        vmid,
        {
            "description": "proxyhub-managed=true\nproxyhub-uid=\n"
            "proxyhub-created-at=2026-11-30T16:00:00Z\nrebuilt by hand after the outage"
        },
    )
    result = world.create(req)
    assert result.status == "done", result.error
    assert result.provider_id == f"vms/{vmid}/{req.vm_name}"  # adopted, not cloned again
    assert len(world.engine.ledger.calls("POST", CLONE)) == 1
    description = world.api.vm_config("pve1", vmid)["description"]
    mark = parse_mark(description)
    assert (mark.managed, mark.uid, mark.installation) == (True, req.uid, "inst-test")
    assert mark.created_at is not None and mark.created_at.isoformat().startswith("2026-11-30T16")
    assert description.endswith("rebuilt by hand after the outage")


def test_create_taken_vmid_inspected_before_probing(world: World) -> None:
    # A foreign VM at attempt 0 is probed past ...
    req = world.request("probe")
    first = vmid_for(req.uid, 0, 100000, 199999)
    upid = world.api.clone("pve1", GOOD_TEMPLATE, newid=first, name="someone-else")
    world.engine.control.advance(30)
    assert world.api.task_status("pve1", upid)["exitstatus"] == "OK"
    result = world.create(req)
    assert result.provider_id == f"vms/{vmid_for(req.uid, 1, 100000, 199999)}/proxy-probe"
    assert world.api.vm_config("pve1", first)["name"] == "someone-else"

    # ... and ours at attempt 0 (cloned, never started) is adopted: no second clone.
    req2 = world.request("adopt")
    vmid = vmid_for(req2.uid, 0, 100000, 199999)
    mark = render_mark(req2.uid, _now(world), "inst-test")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name="proxy-adopt", description=mark)
    world.engine.control.advance(30)
    clones = world.engine.ledger.count("POST", CLONE)
    result = world.create(req2)
    assert result.provider_id == f"vms/{vmid}/proxy-adopt"
    assert world.engine.ledger.count("POST", CLONE) == clones
    assert world.api.vm_status("pve1", vmid)["status"] == "running"


def test_create_same_name_without_our_mark_is_permanent(world: World) -> None:
    req = world.request("squat")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name="proxy-squat")
    world.engine.control.advance(30)
    result = world.create(req)
    assert isinstance(result.error, PermanentError)
    assert str(vmid) in str(result.error) and req.uid in str(result.error)
    assert world.engine.ledger.count("POST", START) == 0


def test_create_resumes_mid_clone_vm_at_deterministic_vmid(world: World) -> None:
    """A crash right after the clone was submitted: a fresh attempt with no record finds the
    nameless, locked VM at attempt 0's VMID, waits for the clone and adopts it."""
    req = world.request("crash")
    progress = world.provider.new_create_progress()
    while True:
        result = world.provider.create_step(req, progress)
        if result.submitted:
            break  # the clone is on Proxmox; its record is lost with the crash
        progress = result.progress
    assert result.step == "clone"
    mid = [e for e in world.api.cluster_resources() if e.get("lock") == "clone"]
    assert len(mid) == 1 and not mid[0].get("name")

    done = world.create(req, world.fresh_provider())
    assert done.provider_id == f"vms/{vmid_for(req.uid, 0, 100000, 199999)}/proxy-crash"
    assert any(r.step == "lock_wait" for r in world.results)
    assert world.engine.ledger.count("POST", CLONE) == 1
    world.settle()
    assert len(world.vms_named("proxy-crash")) == 1


def test_create_clone_already_exists_race_runs_ownership_check(world: World) -> None:
    req = world.request("race")
    progress = world.provider.new_create_progress()
    result = world.step(lambda p: world.provider.create_step(req, p), progress)
    assert result.progress["stage"] == "clone"
    vmid = result.progress["vmid"]
    # Someone else takes the VMID between our listing and our clone.
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name="sneaky")
    world.engine.control.advance(30)
    done = world.drive(lambda p: world.provider.create_step(req, p), result.progress)
    assert done.status == "done"
    assert done.provider_id == f"vms/{vmid_for(req.uid, 1, 100000, 199999)}/proxy-race"
    # The VMID was seen taken cluster-wide before any clone was sent onto it.
    checks = world.engine.ledger.calls("GET", "GET /cluster/nextid")
    assert [c.status for c in checks if c.params.get("vmid") == str(vmid)] == [400]
    clones = world.engine.ledger.calls("POST", CLONE)
    assert [c.params["newid"] for c in clones if c.params["name"] == "proxy-race"] == [
        str(vmid_for(req.uid, 1, 100000, 199999))
    ]
    assert world.api.vm_config("pve1", vmid)["name"] == "sneaky"


def test_create_seed_upload_overwrites_without_delete(world: World) -> None:
    req = world.request("seed")
    stale = b"stale" * 1000
    stale_name = world.seed_volid(req).split("/", 1)[1]
    world.api.upload_iso("pve1", "proxy-seeds", filename=stale_name, content=stale)
    world.engine.control.advance(5)
    world.engine.ledger.clear()
    world.create(req)
    assert world.engine.ledger.count("DELETE", VOLUME) == 0
    expected = build_seed_iso(
        user_data=req.cloud_init,
        instance_id=req.uid,
        hostname=req.vm_name,
        vendor_data=None,
        install_guest_agent=True,
    )
    stored = world.engine.control.volume_data("pve1", world.seed_volid(req))
    assert stored == expected


def test_create_resize_waits_for_task(world: World) -> None:
    world.create(world.request("grow"))
    calls = world.engine.ledger.calls()
    resize = next(e for e in calls if e.key == RESIZE)
    start = next(e for e in calls if e.key == START)
    polls = [
        e
        for e in calls
        if e.key == TASK and e.path_params["upid"] == resize.upid and e.seq < start.seq
    ]
    assert polls, "the resize task was never polled before the start"
    last = world.api.task_status("pve1", resize.upid)
    assert last["exitstatus"] == "OK"
    # The start came only after a poll saw the resize task stopped.
    assert any(r.upid == resize.upid and r.status == "continue" for r in world.results), (
        "no step saw the resize task end"
    )


def test_create_resize_skipped_when_not_larger(world: World) -> None:
    world.create(world.request("small-disk", machine_type="tiny"))
    world.create(world.request("no-disk", machine_type="nodisk"))
    assert world.engine.ledger.count("PUT", RESIZE) == 0


def test_create_vlan_tag_appended_keeps_mac_and_options(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(vlanTag=4)
    req = world.request("vlan")
    progress = world.provider.new_create_progress()
    while progress.get("stage") != "configure":
        progress = world.step(lambda p: world.provider.create_step(req, p), progress).progress
    vmid = progress["vmid"]
    before = world.api.vm_config("pve1", vmid)["net0"]
    done = world.drive(lambda p: world.provider.create_step(req, p), progress)
    assert done.status == "done"
    after = world.api.vm_config("pve1", vmid)["net0"]
    assert after == before + ",tag=4"
    ip = world.provider.get(done.provider_id)
    world.engine.control.advance(30)
    ip = world.provider.get(done.provider_id)
    assert ip.ip is not None and ip.ip.startswith("10.24.")


def test_create_noagent_template_gets_agent_from_vendor_data(
    world_factory: Callable[..., World],
) -> None:
    for install, expect in ((True, "Running"), (False, "Provisioning")):
        world = world_factory(installGuestAgent=install)
        done = world.create(world.request("va", image="debian-13-noagent"))
        world.engine.control.advance(600)
        assert world.provider.get(done.provider_id).state == expect


def test_provider_cancelled_returns_promptly() -> None:
    """A blocking create waiting on a slow clone returns soon after its deadline is cancelled."""
    api, _ = sim_api(profile="realistic", time_scale=100.0)
    config = ProxmoxConfig.from_mapping(catalogue(), installation_id="inst-test")
    provider = Provider(api, config, budgets=Budgets())
    deadline = Deadline(600)
    req = _request("slow")
    timer = threading.Timer(0.3, deadline.cancel)
    timer.start()
    started = time.monotonic()
    with pytest.raises(TransientError, match="cancelled"):
        provider.create(req, deadline=deadline)
    assert time.monotonic() - started < 1.5
    timer.cancel()

    expired = Deadline(0.2)
    started = time.monotonic()
    with pytest.raises(TransientError):
        provider.create(_request("slow2"), deadline=expired)
    assert time.monotonic() - started < 1.5


def test_blocking_create_and_delete_with_real_time() -> None:
    api, engine = sim_api(profile="fast", time_scale=0.05)
    config = ProxmoxConfig.from_mapping(catalogue(), installation_id="inst-test")
    provider = Provider(api, config, budgets=Budgets(poll_interval=0.01))
    req = _request("blocking")
    provider_id = provider.create(req, deadline=Deadline(30))
    assert engine.control.vm(int(provider_id.split("/")[1]))["status"] == "running"
    provider.delete(provider_id, uid=req.uid, deadline=Deadline(30))
    assert engine.ledger.count("DELETE", "DELETE /nodes/{node}/qemu/{vmid}") == 1


def _request(name: str) -> CreateRequest:
    return CreateRequest(
        uid=str(uuid.uuid4()),
        vm_name=f"proxy-{name}",
        machine_type="small",
        image="debian-13",
        zone="pve1",
        cloud_init=b"#cloud-config\n",
    )


def _now(world: World) -> datetime:
    return datetime.fromtimestamp(int(world.clock()), UTC)


def test_create_lost_clone_reply_to_another_node_is_not_cloned_again(world: World) -> None:
    """The clone to pve2 was applied and moved there, but its reply was lost. Proxmox would
    accept a second clone (its refusal only looks at the template's node), so the create must
    see the VMID taken cluster-wide and adopt, not clone again."""
    req = world.request("far", zone="pve2")
    progress = world.provider.new_create_progress()
    while True:
        result = world.step(lambda p: world.provider.create_step(req, p), progress)
        if result.submitted:
            break  # the reply is lost: the record stays at "clone"
        progress = result.progress
    assert result.step == "clone"
    world.engine.control.advance(30)  # the clone finishes and lands on pve2
    done = world.drive(lambda p: world.fresh_provider().create_step(req, p), progress)
    assert done.status == "done"
    assert world.engine.ledger.count("POST", CLONE) == 1
    world.settle()
    assert len(world.vms_named("proxy-far")) == 1


def test_create_clone_refused_as_already_existing_looks_again(world: World) -> None:
    """Proxmox's own refusal ("config file already exists"), for a VMID taken between the
    cluster-wide check and the clone, sends the create back to the ownership check."""
    req = world.request("refused")
    vmid = vmid_for(req.uid, 0, 100000, 199999)
    world.engine.control.fail_call(
        "POST",
        "/nodes/{node}/qemu/{vmid}/clone",
        kind="status",
        status=500,
        message=f"unable to create VM {vmid}: config file already exists",
    )
    done = world.create(req)
    assert done.status == "done"
    assert any(r.message.endswith("checking whose it is") for r in world.results)
    assert world.engine.ledger.count("POST", CLONE) == 2
    assert len(world.engine.ledger.mutations("POST", CLONE)) == 1


# --- a lost upload reply is read back (issue 16) ------------------------------------------------


def _drive_from(world: World, req: CreateRequest, progress: dict[str, Any]) -> StepResult:
    p = world.provider
    return world.drive(lambda pr: p.create_step(req, pr), progress)


def test_a_lost_upload_reply_is_read_back_not_sent_again(world: World) -> None:
    world.engine.control.drop_reply("POST", "/nodes/{node}/storage/{storage}/upload")
    req = world.request("lost-upload")
    first = world.create(req)
    assert first.status == "error" and first.error is not None and first.error.reply_lost
    assert first.progress["stage"] == "upload" and first.progress["upload_sent"]
    done = _drive_from(world, req, first.progress)
    assert done.status == "done"
    uploads = world.engine.ledger.calls("POST", UPLOAD)
    assert [e.status for e in uploads] == [200]  # applied once, its reply lost, never resent


def test_a_stale_seed_of_the_same_name_is_not_taken_for_a_lost_upload(world: World) -> None:
    """An earlier proxy of the same name left its seed (same size); the upload of ours fails
    before it is applied. The read-back must not take the stale seed for ours."""
    req = world.request("stale")
    ours = build_seed_iso(
        user_data=req.cloud_init,
        instance_id=req.uid,
        hostname=req.vm_name,
        vendor_data=world.config.vendor_data,
        install_guest_agent=world.config.install_guest_agent,
    )
    world.api.upload_iso(
        "pve1",
        "proxy-seeds",
        filename=world.seed_volid(req).split("/", 1)[1],
        content=b"x" * len(ours),
    )
    world.settle(60)  # the stale seed is older than the clone to come
    world.engine.control.fail_call("POST", "/nodes/{node}/storage/{storage}/upload", kind="reset")
    first = world.create(req)
    assert first.status == "error" and first.error is not None and first.error.reply_lost
    done = _drive_from(world, req, first.progress)
    assert done.status == "done"
    assert world.engine.control.volume_data("pve1", world.seed_volid(req)) == ours


def test_a_lost_start_reply_is_read_back_even_once_the_task_has_ended(world: World) -> None:
    """The start was applied and its task already ended by the time the step reads back: the
    node's task list shows a start task the record did not know, which is ours (seed 001)."""
    world.engine.control.drop_reply("POST", "/nodes/{node}/qemu/{vmid}/status/start")
    req = world.request("lost-start")
    first = world.create(req)
    assert first.status == "error" and first.error is not None and first.error.reply_lost
    assert first.progress["stage"] == "start" and first.progress["known_tasks"] == []
    world.engine.control.advance(30)  # the start task ends before anyone looks again
    done = _drive_from(world, req, first.progress)
    assert done.status == "done"
    assert [e.status for e in world.engine.ledger.calls("POST", START)] == [200]


def _stepped_to(world: World, req: CreateRequest, stage: str) -> dict[str, Any]:
    """The create's record once its steps reached ``stage``."""
    provider = world.provider
    progress = provider.new_create_progress()
    for _ in range(200):
        progress = world.step(lambda pr: provider.create_step(req, pr), progress).progress
        if progress.get("stage") == stage:
            return progress
    raise AssertionError(f"the create never reached {stage}: {progress}")


def test_a_vm_stopped_after_its_start_is_started_again(world: World) -> None:
    """The start task ended and then something stopped the VM (a stop queued on the node):
    the create goes back to its start instead of reading "stopped" until its ceiling."""
    provider = world.provider
    req = world.request("restart")
    progress = _stepped_to(world, req, "start_wait")
    world.engine.control.advance(5.0)  # the start ends
    # A cold record at the running check (a start's wait that saw its task end, or that found
    # the task failed while the VM ran, leaves one): the stage reads the status.
    progress = dict(advance(progress, "running"), ticket=None)
    vmid, node = int(progress["vmid"]), str(progress["node"])
    world.api.stop(node, vmid)
    world.engine.control.advance(5.0)
    assert world.api.vm_status(node, vmid)["status"] == "stopped"

    stopped = world.step(lambda pr: provider.create_step(req, pr), progress)
    assert stopped.status == "error" and stopped.error is not None
    assert stopped.error.kind == "transient"
    assert stopped.progress["stage"] == "start"
    done = world.drive(lambda pr: provider.create_step(req, pr), stopped.progress)
    assert done.status == "done", done.error
    assert world.api.vm_status(node, vmid)["status"] == "running"


def test_a_vm_destroyed_before_its_start_starts_over_without_its_identity(world: World) -> None:
    """Entry 10: "does not exist" inside a create is transient and starts it over from the
    lookup. The identity read at the configure described the VM that is gone, so the record
    drops it and the result says the VM is gone (seed 001: kept, it would make the next clone
    at this VMID look restored from a backup)."""
    provider = world.provider
    req = world.request("gone")
    progress = _stepped_to(world, req, "start")
    assert progress.get("smbios_uuid"), progress
    vmid, node = int(progress["vmid"]), str(progress["node"])
    world.api.destroy(node, vmid)
    world.engine.control.advance(5.0)

    # The start is taken as a task (or refused) and its wait finds no VM.
    gone = world.step(lambda pr: provider.create_step(req, pr), progress)
    for _ in range(20):
        if gone.status == "error":
            break
        world.engine.control.advance(5.0)
        gone = world.step(lambda pr: provider.create_step(req, pr), gone.progress)
    assert gone.status == "error" and gone.error is not None and gone.vm_gone
    assert gone.error.kind == "transient"
    assert gone.progress["stage"] == "lookup"
    assert not gone.progress.get("smbios_uuid") and not gone.progress.get("vmgenid")
    done = world.drive(lambda pr: provider.create_step(req, pr), gone.progress)
    assert done.status == "done", done.error
    made = world.api.vm_config(node, vmid)
    assert done.progress["smbios_uuid"] in made["smbios1"]


def test_a_failed_start_is_read_at_the_look_after_the_first(world: World) -> None:
    """The first look that finds the VM not running waits again without reading the start task
    (issue 12: a look that came too soon costs one read); the next reads the task, and a start
    that failed sends the record back to its start."""
    provider = world.provider
    req = world.request("failed-start")
    world.engine.control.fail_next_task("qmstart", "start failed: QEMU exited with code 1")
    progress = _stepped_to(world, req, "start_wait")
    world.engine.control.advance(5.0)  # the start has long failed
    seen = len(world.engine.ledger)

    first = world.step(lambda pr: provider.create_step(req, pr), progress)
    assert first.status == "wait" and first.progress["stage"] == "start_wait"
    assert [e.key for e in world.engine.ledger.calls()[seen:]] == [STATUS]

    second = world.step(lambda pr: provider.create_step(req, pr), first.progress)
    assert second.status == "error" and second.error is not None
    assert second.error.kind == "transient" and "QEMU exited" in str(second.error)
    assert second.progress["stage"] == "start"
    # The second look: the VM's status, the task read that found the failure, and the status
    # read that checks the VM is not running after all (a start can fail while the VM runs).
    assert [e.key for e in world.engine.ledger.calls()[seen:]] == [STATUS, STATUS, TASK, STATUS]
    done = world.drive(lambda pr: provider.create_step(req, pr), second.progress)
    assert done.status == "done", done.error


@pytest.mark.parametrize("recorded", [True, False])
def test_a_lookup_that_finds_no_vm_says_a_recorded_identity_is_gone(
    world: World, recorded: bool
) -> None:
    """Seed 001: a proxy that records the identity of a VM, for which the lookup finds no VM of
    ours, had that VM destroyed; the lookup says so (``vm_gone``), in the step before the
    clone, so its caller forgets the identity before a new VM takes the VMID. With nothing
    recorded there is nothing to forget."""
    identity = Identity("4a2ce6d1-775d-46ec-bf59-994b7de5a3a1", "55fea08e-143e-4e04-bdd7")
    req = replace(world.request("vanished"), identity=identity if recorded else Identity())
    looked = world.step(
        lambda pr: world.provider.create_step(req, pr), world.provider.new_create_progress()
    )
    assert looked.status == "continue" and looked.progress["stage"] == "clone"
    assert looked.vm_gone is recorded
    assert world.engine.ledger.mutations() == []  # said before anything is cloned


def _create_with(world: World, req: CreateRequest, may_follow: Any) -> list[StepResult]:
    """Every step of a create whose steps may go on as ``may_follow`` says."""
    world.drive(
        lambda p: world.provider.create_step(req, p, may_follow=may_follow),
        world.provider.new_create_progress(),
    )
    return world.results


def test_the_steps_after_a_task_ended_go_on_to_the_stages_that_follow(world: World) -> None:
    """Issue 12: the poll that sees the upload end writes the config and submits the resize,
    and the one that sees the resize end submits the start (``CreateMachine.follows``): no
    step of their own, each still reported as passed, with the poll's timing kept."""
    results = _create_with(world, world.request("follow"), lambda record: True)
    steps = [r.step for r in results]
    assert "configure" not in steps and "resize" in steps and "start" in steps
    resize = next(r for r in results if r.step == "resize")
    assert resize.status == "wait" and resize.upid
    assert [(p.step, p.status) for p in resize.passed] == [
        ("upload_wait", "continue"),
        ("configure", "continue"),
    ]
    assert TIMING in resize.details  # the upload's wait, for the estimates
    start = next(r for r in results if r.step == "start")
    assert [p.step for p in start.passed] == ["resize_wait"]
    # Each stage still ran once: one config write, one resize, one start.
    assert world.engine.ledger.count("PUT", RESIZE) == 1
    assert world.engine.ledger.count("POST", START) == 1


def test_no_stage_is_followed_unless_the_caller_allows_it(world: World) -> None:
    """Without ``may_follow``, or when it says no for the next stage's record, every stage is a
    step of its own, as the services need when a slot or a maintenance switch is in question."""
    asked: list[str] = []

    def only_configure(record: dict[str, Any]) -> bool:
        asked.append(str(record.get("stage")))
        return record.get("stage") == "configure"

    results = _create_with(world, world.request("asked"), only_configure)
    # The configure was allowed: it ran in the upload's poll, and ended that step.
    (configure,) = [r for r in results if r.step == "configure"]
    assert [p.step for p in configure.passed] == ["upload_wait"]
    # The resize and the start were asked about and refused: each a step of its own.
    assert {"resize", "start"} <= set(asked)
    assert all(not r.passed for r in results if r.step in ("resize", "start"))
    world.results.clear()
    plain = _create_with(world, world.request("plain"), None)
    assert "configure" in [r.step for r in plain]
    assert all(not r.passed for r in plain)


def test_the_lookup_is_never_followed(world: World) -> None:
    """The lookup's verdict (a VM gone, an identity to forget) commits before any clone."""
    results = _create_with(world, world.request("first"), lambda record: True)
    assert results[0].step == "lookup" and results[0].status == "continue"
    assert all(p.step != "lookup" for r in results for p in r.passed)
