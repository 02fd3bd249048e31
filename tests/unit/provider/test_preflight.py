"""The preflight (seed 003; DESIGN.md §5) over the in-process simulator.

Every check passes on the good template and fails, or is unknown, on the bad ones; nothing but
GET reaches the simulator (its ledger says so); a denied privilege or an unanswered request is
never a pass; messages are proxyhub's own text. Where a check fails, the create run in the same
world is shown to fail too, so the preflight predicts rather than invents.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from provider_world import GOOD_TEMPLATE, World
from test_plan import plan_of

from provisioning.proxmox import preflight_checks
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.ids import vmid_for
from provisioning.proxmox.plan import Plan
from provisioning.proxmox.preflight import CHECK_CODES, preflight
from provisioning.proxmox.preflight_checks import Check
from provisioning.proxmox.preflight_reads import WriteRefused, read_only

GIB = 1024**3
# Proxmox's own texts and values read from Proxmox configs: none may reach a message unless
# the catalogue chose it.
RAW = (
    "Permission check failed",
    "No route to host",
    "No such storage",
    "Parameter verification failed",
    "already exists",
    "can't lock file",
    "vmstore",
    "vmbr0",
    "base-9000",
    "media=cdrom",
)


def run(world: World, plan: Plan, deadline: Deadline | None = None) -> dict[str, Check]:
    checks = preflight(world.api, world.config, plan, deadline=deadline)
    # What the catalogue names, proxyhub chose, and may show.
    chosen = {world.config.bridge, world.config.storage, world.config.iso_storage}
    for check in checks:
        for raw in set(RAW) - chosen:
            assert raw not in check.message, (check, raw)
        secret = world.engine.token.rsplit("=", 1)[-1]
        assert secret not in check.message
    assert [c.code for c in checks] == [
        code
        for code in CHECK_CODES
        if (code != "template_boot_disk" or plan.disk_gib)
        and (code != "privileges" or world.config.pool)
    ]
    return {c.code: c for c in checks}


def statuses(checks: dict[str, Check]) -> dict[str, str]:
    return {code: c.status for code, c in checks.items()}


def plan_for(world: World, name: str = "pf", **kwargs: Any) -> Plan:
    return plan_of(world.config, world.request(name, **kwargs))


def assert_gets_only(world: World) -> None:
    calls = world.engine.ledger.calls()
    assert calls, "the preflight asked Proxmox nothing"
    assert {c.method for c in calls} == {"GET"}
    assert world.engine.ledger.mutations() == []


# --- the good template --------------------------------------------------------------------


@pytest.mark.parametrize("zone", ["pve1", "pve2"])
def test_good_template_passes_every_check_with_gets_only(
    world_factory: Callable[..., World], zone: str
) -> None:
    world = world_factory()
    checks = run(world, plan_for(world, zone=zone))
    assert set(statuses(checks).values()) == {"passed"}, checks
    assert_gets_only(world)
    if zone == "pve2":  # the clone runs on the template's node: both must answer
        assert "pve1" in checks["node_online"].message


def test_configured_bridge_and_storage_pass(world_factory: Callable[..., World]) -> None:
    world = world_factory(bridge="vmbr0", vlanTag=4, storage="local-lvm")
    checks = run(world, plan_for(world, zone="pve1"))
    assert set(statuses(checks).values()) == {"passed"}, checks


def test_read_only_api_refuses_writes_before_they_leave(world: World) -> None:
    with pytest.raises(WriteRefused):
        read_only(world.api).start("pve1", GOOD_TEMPLATE)
    assert world.engine.ledger.calls() == []


# --- the template (seed 000 entry 4) ------------------------------------------------------


def test_cloud_init_template_fails_its_check_and_the_create(world: World) -> None:
    req = world.request("ci", image="debian-13-cloudinit")
    checks = run(world, plan_of(world.config, req))
    assert checks["template_no_cloudinit_drive"].status == "failed"
    assert checks["template_exists"].status == "passed"
    assert checks["template_is_template"].status == "passed"
    assert isinstance(world.create(req).error, PermanentError)


@pytest.mark.parametrize(
    ("vmid", "failing"),
    [(9500, "template_exists"), (200, "template_exists"), (100, "template_is_template")],
    ids=["absent", "container", "plain-vm"],
)
def test_template_that_cannot_be_cloned_fails(
    world_factory: Callable[..., World], vmid: int, failing: str
) -> None:
    world = world_factory(templates={"debian-13": {"vmid": vmid}})
    req = world.request("nt")
    checks = run(world, plan_of(world.config, req))
    assert checks[failing].status == "failed"
    if vmid == 9500:
        # Nothing to read: what depends on the template is unknown, never passed.
        for code in ("template_is_template", "template_no_cloudinit_drive", "template_boot_disk"):
            assert checks[code].status == "unknown", code
        assert checks["target_storage"].status == "unknown"
        assert checks["bridge"].status == "unknown"
    assert isinstance(world.create(req).error, PermanentError)


def test_template_hidden_by_permissions_is_unknown_not_absent(world: World) -> None:
    world.engine.control.deny(f"/vms/{GOOD_TEMPLATE}", "VM.Audit")
    checks = run(world, plan_for(world))
    assert checks["template_exists"].status == "unknown"
    assert f"VM.Audit on /vms/{GOOD_TEMPLATE}" in checks["template_exists"].message
    assert "passed" not in {
        checks[c].status
        for c in ("template_is_template", "template_no_cloudinit_drive", "template_boot_disk")
    }


def test_disk_that_would_need_shrinking_fails(world: World) -> None:
    checks = run(world, plan_for(world, machine_type="tiny"))
    assert checks["template_boot_disk"].status == "failed"
    assert "shrinking" in checks["template_boot_disk"].message


def test_boot_disk_without_readable_size_fails_as_the_create_does(world: World) -> None:
    template = world.engine.cluster.guests[GOOD_TEMPLATE]
    template.config["scsi0"] = "vmstore:base-9000-disk-0,discard=on"
    req = world.request("nosize")
    checks = run(world, plan_of(world.config, req))
    assert checks["template_boot_disk"].status == "failed"
    assert isinstance(world.create(req).error, PermanentError)


def test_no_disk_size_check_without_disk_gib(world: World) -> None:
    checks = run(world, plan_for(world, machine_type="nodisk"))
    assert "template_boot_disk" not in checks
    assert set(statuses(checks).values()) == {"passed"}


# --- storages ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "code", "words"),
    [
        ({"isoStorage": "nosuch"}, "iso_storage", "does not exist"),
        ({"isoStorage": "local-lvm"}, "iso_storage", "does not allow ISO images"),
        ({"storage": "nosuch"}, "target_storage", "does not exist"),
        ({"storage": "proxy-seeds"}, "target_storage", "does not allow VM disk images"),
    ],
)
def test_storage_missing_or_of_the_wrong_kind_fails(
    world_factory: Callable[..., World], overrides: dict[str, Any], code: str, words: str
) -> None:
    world = world_factory(**overrides)
    checks = run(world, plan_for(world))
    assert checks[code].status == "failed"
    assert words in checks[code].message
    others = {c: s for c, s in statuses(checks).items() if c != code}
    assert set(others.values()) == {"passed"}, others


def test_local_storage_cannot_take_a_clone_from_another_node(
    world_factory: Callable[..., World],
) -> None:
    world = world_factory(storage="local-lvm")
    req = world.request("far", zone="pve2")  # the template lives on pve1
    checks = run(world, plan_of(world.config, req))
    assert checks["target_storage"].status == "failed"
    assert "not shared" in checks["target_storage"].message
    assert world.create(req).status == "error"


def test_full_storages_fail(world: World) -> None:
    seeds = world.engine.cluster.nodes["pve1"].storages["proxy-seeds"]
    seeds.base_used = seeds.total - 1024**2
    vmstore = world.engine.cluster.nodes["pve1"].storages["vmstore"]
    vmstore.base_used = vmstore.total - 5 * GIB - vmstore.used + vmstore.base_used
    checks = run(world, plan_for(world))
    assert checks["iso_storage"].status == "failed"
    assert checks["target_storage"].status == "failed"
    assert "10 GiB" in checks["target_storage"].message  # the grown disk, not the template's


# --- network ----------------------------------------------------------------------------------


def test_configured_bridge_missing_on_the_node_fails(world_factory: Callable[..., World]) -> None:
    world = world_factory(bridge="vmbr9")
    checks = run(world, plan_for(world))
    assert checks["bridge"].status == "failed"
    assert "bridge vmbr9 does not exist on node pve1" in checks["bridge"].message


@pytest.mark.parametrize("bridge", [None, "vmbr0"])
def test_template_without_net0_fails(
    world_factory: Callable[..., World], bridge: str | None
) -> None:
    world = world_factory(**({"bridge": bridge} if bridge else {}))
    del world.engine.cluster.guests[GOOD_TEMPLATE].config["net0"]
    checks = run(world, plan_for(world))
    assert checks["bridge"].status == "failed"
    assert "no net0" in checks["bridge"].message


# --- the VMID candidate (seed 000 entry 2, seed 003's nextid check) ---------------------------


def test_candidate_taken_by_another_vm_fails_but_does_not_block(world: World) -> None:
    req = world.request("taken")
    candidate = vmid_for(req.uid, 0, 100000, 199999)
    world.engine.control.create_vms(1, start_vmid=candidate, node="pve1", name_prefix="other-")
    checks = run(world, plan_of(world.config, req))
    assert checks["vmid_candidate"].status == "failed"
    assert "not blocked" in checks["vmid_candidate"].message
    world.engine.ledger.clear()
    created = world.create(req)
    assert created.status == "done"
    assert created.provider_id == f"vms/{vmid_for(req.uid, 1, 100000, 199999)}/proxy-taken"


def test_candidate_holding_this_proxys_vm_passes(world: World) -> None:
    req = world.request("mine")
    world.create(req)
    world.settle()
    world.engine.ledger.clear()
    checks = run(world, plan_of(world.config, req))
    assert checks["vmid_candidate"].status == "passed"
    assert "adopts" in checks["vmid_candidate"].message
    assert_gets_only(world)


def test_candidate_holding_a_namesake_without_our_mark_fails(world: World) -> None:
    req = world.request("squat")
    candidate = vmid_for(req.uid, 0, 100000, 199999)
    world.api.clone("pve1", GOOD_TEMPLATE, newid=candidate, name="proxy-squat")
    world.settle(30)
    world.engine.ledger.clear()
    checks = run(world, plan_of(world.config, req))
    assert checks["vmid_candidate"].status == "failed"
    assert "not this proxy's" in checks["vmid_candidate"].message
    assert_gets_only(world)
    assert isinstance(world.create(req).error, PermanentError)


def test_candidate_without_uid_is_unknown(world: World) -> None:
    checks = run(world, plan_of(world.config, world.request("new"), uid=None))
    assert checks["vmid_candidate"].status == "unknown"


# --- nodes, privileges, failures and the budget --------------------------------------------------


def test_offline_node_fails_and_what_lives_on_it_is_unknown(world: World) -> None:
    world.engine.control.node_offline("pve2")
    checks = run(world, plan_for(world, zone="pve2"))
    assert checks["node_online"].status == "failed"
    assert "node pve2" in checks["node_online"].message
    for code in ("iso_storage", "target_storage", "bridge"):
        assert checks[code].status == "unknown", code


def test_offline_template_node_fails_and_the_template_is_unknown(world: World) -> None:
    world.engine.control.node_offline("pve1")
    checks = run(world, plan_for(world, zone="pve2"))
    assert checks["node_online"].status == "failed"
    assert "template's node pve1" in checks["node_online"].message
    for code in ("template_is_template", "template_no_cloudinit_drive", "template_boot_disk"):
        assert checks[code].status == "unknown", code


@pytest.mark.parametrize(
    ("path", "privilege", "code", "named"),
    [
        ("/nodes/pve1", "Sys.Audit", "node_online", "Sys.Audit on /nodes/pve1"),
        ("/storage/proxy-seeds", "*", "iso_storage", "Datastore.Audit on /storage/proxy-seeds"),
        ("/storage/vmstore", "*", "target_storage", "Datastore.Audit"),
        (f"/vms/{GOOD_TEMPLATE}", "VM.Audit", "template_exists", "VM.Audit"),
    ],
)
def test_denied_privilege_is_unknown_never_passed(
    world: World, path: str, privilege: str, code: str, named: str
) -> None:
    world.engine.control.deny(path, privilege)
    checks = run(world, plan_for(world))
    assert checks[code].status == "unknown"
    assert named in checks[code].message


def test_unexpected_proxmox_error_is_unknown(world: World) -> None:
    world.engine.control.fail_call("GET", "/nodes/{node}/network", kind="500")
    checks = run(world, plan_for(world))
    assert checks["bridge"].status == "unknown"
    assert "unexpected error" in checks["bridge"].message


def test_a_bug_in_one_check_leaves_the_others_standing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(value: str, key: str) -> str:
        raise RuntimeError("bug")

    monkeypatch.setattr(preflight_checks, "_option", broken)
    checks = run(world, plan_for(world))
    assert checks["bridge"].status == "unknown"
    assert {s for c, s in statuses(checks).items() if c != "bridge"} == {"passed"}


def test_expired_budget_asks_nothing_and_passes_nothing(world: World) -> None:
    checks = run(world, plan_for(world), deadline=Deadline(0))
    assert set(statuses(checks).values()) == {"unknown"}
    assert "time budget" in checks["node_online"].message
    assert world.engine.ledger.calls() == []


def test_slow_answer_runs_out_the_budget(world: World) -> None:
    world.engine.control.latency(0.5, "GET", "/nodes/{node}/status")
    checks = run(world, plan_for(world), deadline=Deadline(0.1))
    assert checks["node_online"].status == "unknown"
    assert "time budget" in checks["node_online"].message


def test_plan_of_another_cluster_is_refused(world: World) -> None:
    plan = plan_for(world)
    other = dataclasses.replace(world.config, name="elsewhere")
    with pytest.raises(ValueError):
        preflight(world.api, other, plan)


def test_preflight_of_a_large_cloud_init_counts_it_against_the_iso_storage(world: World) -> None:
    seeds = world.engine.cluster.nodes["pve1"].storages["proxy-seeds"]
    seeds.base_used = seeds.total - seeds.used + seeds.base_used - 6 * 1024**2
    small = plan_for(world)
    large = plan_of(
        world.config,
        world.request("pf"),
        cloud_init_sha256=hashlib.sha256(b"x").hexdigest(),
        cloud_init_bytes=3 * 1024**2,
    )
    assert run(world, small)["iso_storage"].status == "passed"
    assert run(world, large)["iso_storage"].status == "failed"


def test_each_read_is_made_once(world: World) -> None:
    """Checks share their reads: one listing, one template config, no path asked twice."""
    run(world, plan_for(world, zone="pve2"))
    calls = world.engine.ledger.calls()
    keys = [c.key for c in calls]
    assert keys.count("GET /cluster/resources") == 1
    assert keys.count("GET /nodes/{node}/qemu/{vmid}/config") == 1
    paths = [c.path for c in calls]
    assert len(paths) == len(set(paths)), paths
