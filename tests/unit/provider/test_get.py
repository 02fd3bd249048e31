"""Get (seed 000 entries 7 and 9) over the in-process simulator."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from provider_world import GOOD_TEMPLATE, World

from provisioning.proxmox.errors import NotFoundError, PermanentError, TransientError
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.observe import map_state

AGENT_PATH = "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"
AGENT = "GET " + AGENT_PATH


def _running(world: World, name: str = "g") -> tuple[str, int]:
    done = world.create(world.request(name))
    assert done.status == "done", done.error
    return str(done.provider_id), int(str(done.provider_id).split("/")[1])


@pytest.mark.parametrize(
    ("status", "qmpstatus", "expected"),
    [
        ("stopped", "stopped", "Stopped"),
        ("running", "running", None),  # the agent decides
        ("running", "prelaunch", "Provisioning"),
        ("running", "paused", "Stopped"),
        ("running", "suspended", "Stopped"),
        ("running", "io-error", "Stopped"),
        ("running", "inmigrate", "Stopped"),
        ("weird", "", "Stopped"),
        ("", "", "Stopped"),
    ],
)
def test_map_state_table(status: str, qmpstatus: str, expected: str | None) -> None:
    assert map_state(status, qmpstatus) == expected


def test_get_unknown_state_is_stopped(world: World) -> None:
    provider_id, vmid = _running(world)
    world.engine.control.pause_vm(vmid)  # qmpstatus "paused": not a state proxyhub runs
    assert world.provider.get(provider_id).state == "Stopped"


def test_get_paused_is_stopped_from_status_current(world: World) -> None:
    provider_id, vmid = _running(world, "paused")
    world.settle()
    world.engine.control.pause_vm(vmid)
    entry = next(e for e in world.api.cluster_resources() if e["vmid"] == vmid)
    assert entry["status"] == "running"  # the listing cannot tell a paused VM apart
    instance = world.provider.get(provider_id)
    assert (instance.state, instance.qmpstatus) == ("Stopped", "paused")


def test_get_running_without_ip_is_provisioning(world: World) -> None:
    provider_id, _ = _running(world, "early")
    instance = world.provider.get(provider_id)
    assert (instance.state, instance.ip) == ("Provisioning", None)


def test_get_running_with_ip_is_running(world: World) -> None:
    provider_id, _ = _running(world, "late")
    world.settle(30)
    instance = world.provider.get(provider_id)
    assert instance.state == "Running"
    assert instance.ip is not None and instance.ip.startswith("10.20.")


def test_get_reads_uid_and_created_at_from_backend(world: World) -> None:
    req = world.request("ids")
    provider_id = str(world.create(req).provider_id)
    world.settle()
    instance = world.provider.get(provider_id)
    assert instance.uid == req.uid
    assert instance.installation == "inst-test"
    assert instance.created_at is not None
    assert abs(instance.created_at.timestamp() - 1_800_000_000) < 120


def test_get_agent_messages_table(world: World) -> None:
    provider_id, vmid = _running(world, "agent")
    world.settle(30)
    assert world.provider.get(provider_id).state == "Running"

    # 500 "VM <vmid> is not running": stopped between the status read and the agent call.
    world.engine.control.fail_call(
        "GET", AGENT_PATH, kind="status", status=500, message=f"VM {vmid} is not running"
    )
    with pytest.raises(TransientError):
        world.provider.get(provider_id)

    # 500 "QEMU guest agent is not running": still booting, or the install failed.
    world.engine.control.fail_call(
        "GET", AGENT_PATH, kind="status", status=500, message="QEMU guest agent is not running"
    )
    assert world.provider.get(provider_id).state == "Provisioning"

    # Anything else: cannot tell.
    world.engine.control.fail_call(
        "GET",
        AGENT_PATH,
        kind="status",
        status=500,
        message=f"VM {vmid} qga command 'guest-ping' failed - got timeout",
    )
    with pytest.raises(TransientError):
        world.provider.get(provider_id)

    # 500 "No QEMU guest agent configured": can never report an address, so Stopped.
    world.engine.control.remove_agent(vmid)
    assert world.provider.get(provider_id).state == "Stopped"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (403, "Permission check failed (/vms/{vmid}, VM.Monitor)"),
        (500, "Configuration file 'nodes/pve1/qemu-server/{vmid}.conf' does not exist"),
        (400, "Parameter verification failed."),
        (501, "Method 'GET /nodes/pve1/qemu/{vmid}/agent/network-get-interfaces' not implemented"),
    ],
    ids=["403", "does-not-exist", "400", "501"],
)
def test_get_agent_anything_else_is_transient_as_entry_7s_table_says(
    world: World, status: int, message: str
) -> None:
    """Seed 000 entry 7: an agent answer outside the table's rows means "cannot tell", which is
    transient, never permanent or not-found: the agent's answer says nothing about the VM's
    existence or the token's rights elsewhere (the status read just before found the VM)."""
    provider_id, vmid = _running(world, "odd-agent")
    world.settle(30)
    world.engine.control.fail_call(
        "GET", AGENT_PATH, kind="status", status=status, message=message.format(vmid=vmid)
    )
    with pytest.raises(TransientError) as caught:
        world.provider.get(provider_id)
    assert type(caught.value) is TransientError, type(caught.value)
    assert "guest agent" in str(caught.value)


def test_get_agent_answering_without_ipv4_is_provisioning(world: World) -> None:
    provider_id, vmid = _running(world, "noip")
    profile = world.engine.profile
    assert profile.agent_start < profile.address_after, "the fast profile models this window"
    world.engine.control.advance(
        profile.agent_start + (profile.address_after - profile.agent_start) / 2
    )
    assert world.api.agent_network_interfaces("pve1", vmid)  # the agent answers ...
    assert world.provider.get(provider_id).state == "Provisioning"  # ... with no IPv4 yet


def test_get_locked_is_transient_never_not_found(world: World) -> None:
    provider_id, vmid = _running(world, "locked")
    world.settle()
    world.engine.control.set_lock(vmid, "backup")
    with pytest.raises(TransientError) as caught:
        world.provider.get(provider_id)
    assert not isinstance(caught.value, NotFoundError)
    assert "locked (backup)" in str(caught.value)


def test_get_mid_clone_nameless_entry_is_transient(world: World) -> None:
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150000, name="proxy-mid")
    with pytest.raises(TransientError) as caught:
        world.provider.get("vms/150000/proxy-mid")
    assert not isinstance(caught.value, NotFoundError)


def test_get_vmid_reused_or_unmarked_is_not_found(world: World) -> None:
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150001, name="someone-else")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150002, name="proxy-nomark")
    world.settle()
    with pytest.raises(NotFoundError, match="now 'someone-else'"):
        world.provider.get("vms/150001/proxy-gone")
    with pytest.raises(NotFoundError, match="no proxyhub mark"):
        world.provider.get("vms/150002/proxy-nomark")
    with pytest.raises(NotFoundError):
        world.provider.get("vms/150003/proxy-never")


def test_get_hibernated_is_stopped_without_status_or_agent(world: World) -> None:
    mark = render_mark("u-1", _when(), "inst-test")
    world.api.clone("pve1", GOOD_TEMPLATE, newid=150004, name="proxy-hib", description=mark)
    world.settle()
    world.engine.control.hibernate_vm(150004)
    world.engine.ledger.clear()
    assert world.provider.get("vms/150004/proxy-hib").state == "Stopped"
    keys = {e.key for e in world.engine.ledger.calls()}
    assert "GET /nodes/{node}/qemu/{vmid}/status/current" not in keys and AGENT not in keys


def test_get_node_offline_is_transient(world: World) -> None:
    provider_id, _ = _running(world, "offline")
    world.engine.control.node_offline("pve1")
    with pytest.raises(TransientError) as caught:
        world.provider.get(provider_id)
    assert not isinstance(caught.value, NotFoundError)


@pytest.mark.parametrize("bad", ["", "vms/123", "vm/123/x", "vms/0123/x", "vms/123/", "vms/99/x"])
def test_get_malformed_id_is_permanent(world: World, bad: str) -> None:
    with pytest.raises(PermanentError):
        world.provider.get(bad)
    assert world.engine.ledger.calls() == []


def _when() -> datetime:
    return datetime(2026, 11, 1, tzinfo=UTC)


def test_get_with_a_known_node_skips_the_listing(world: World) -> None:
    provider_id, _ = _running(world, "hinted")
    world.settle(30)
    world.engine.ledger.clear()
    hinted = world.provider.get(provider_id, node="pve1")
    assert world.engine.ledger.count("GET", "GET /cluster/resources") == 0
    assert hinted == world.provider.get(provider_id)


def test_get_with_a_stale_node_hint_finds_a_moved_vm_through_the_listing(world: World) -> None:
    """Seed 000 entry 1: the ID is location-free so that a migrated VM stays addressable. The
    hint is only a shortcut: a VM that is not on the hinted node any more is looked up in the
    listing (one extra request, only then), and only a VM the listing lacks is not found."""
    provider_id, vmid = _running(world, "moved")
    world.settle(30)
    world.engine.ledger.clear()
    moved = world.provider.get(provider_id, node="pve2")  # it runs on pve1
    assert (moved.node, moved.state) == ("pve1", "Running")
    assert world.engine.ledger.count("GET", "GET /cluster/resources") == 1
    world.api.stop("pve1", vmid)
    world.settle(30)
    world.api.destroy("pve1", vmid)
    world.settle(30)
    with pytest.raises(NotFoundError):
        world.provider.get(provider_id, node="pve1")


def test_get_with_a_node_hint_keeps_entry_9s_rows_for_a_lock(world: World) -> None:
    """The rows the listing entry would have decided are decided by the node's own config: a
    lock other than ``suspended`` is transient, never not-found or a state."""
    provider_id, vmid = _running(world, "hinted-lock")
    world.settle(30)
    world.engine.control.set_lock(vmid, "backup")
    with pytest.raises(TransientError) as caught:
        world.provider.get(provider_id, node="pve1")
    assert type(caught.value) is TransientError and "locked (backup)" in str(caught.value)


def test_every_get_and_the_calls_of_a_create_log_what_entry_20_names(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Entry 20: "proxmox vm fetched" with state, ip and uid on every return of Get, not only
    the agent's; the clone's line names the new VM, the upload's its file."""
    caplog.set_level(logging.INFO, logger="proxyhub.proxmox")
    req = world.request("logged")
    provider_id = str(world.create(req).provider_id)
    vmid = int(provider_id.split("/")[1])
    clone = next(r for r in caplog.records if getattr(r, "call", "") == "clone")
    assert (clone.newid, clone.vm_name) == (str(vmid), "proxy-logged")  # type: ignore[attr-defined]
    upload = next(r for r in caplog.records if getattr(r, "call", "") == "upload_iso")
    assert upload.upload_filename == world.seed_volid(req).split("/", 1)[1]  # type: ignore[attr-defined]
    world.api.stop("pve1", vmid)
    world.settle(30)
    caplog.clear()
    assert world.provider.get(provider_id).state == "Stopped"  # decided by status/current
    (fetched,) = [r for r in caplog.records if r.getMessage() == "proxmox vm fetched"]
    assert (fetched.state, fetched.uid, fetched.vmid) == ("Stopped", req.uid, vmid)  # type: ignore[attr-defined]


def test_get_with_a_node_hint_on_a_node_that_does_not_answer_is_transient(world: World) -> None:
    """Entry 9's ``status: unknown`` row (a node that does not answer) decided without the
    listing: the hinted node's config read fails, which is transient, never not-found."""
    provider_id, _ = _running(world, "hinted-offline")
    world.settle(30)
    world.engine.control.node_offline("pve1")
    with pytest.raises(TransientError) as caught:
        world.provider.get(provider_id, node="pve1")
    assert not isinstance(caught.value, NotFoundError)
