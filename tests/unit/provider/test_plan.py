"""The plan preview (seed 003; DESIGN.md §5) against what the create really does.

A preview makes no Proxmox call, so every test here checks the simulator's ledger stays empty
while the plan is built, and compares the plan with a real create run in the same world.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from provider_world import INSTALLATION, World, catalogue

from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.ids import vmid_for
from provisioning.proxmox.marks import CREATED_AT_KEY
from provisioning.proxmox.plan import HASH_FIELDS, Plan, build_plan, hash_input
from provisioning.proxmox.preflight import preflight

CLOUD_INIT = b"#cloud-config\nhostname: test\n"


def plan_of(config: ProxmoxConfig, req: CreateRequest, **overrides: Any) -> Plan:
    """The plan for exactly what ``req`` asks a create to do."""
    fields: dict[str, Any] = {
        "uid": req.uid,
        "vm_name": req.vm_name,
        "zone": req.zone,
        "machine_type": req.machine_type,
        "image": req.image,
        "cloud_init_sha256": hashlib.sha256(req.cloud_init).hexdigest(),
        "cloud_init_bytes": len(req.cloud_init),
    }
    fields.update(overrides)
    return build_plan(config, **fields)


def journal_stages(world: World) -> list[str]:
    """The stage names the driver's journal would hold for the steps run so far."""
    names: list[str] = []
    for result in world.results:
        name = result.step.removesuffix("_wait")
        if not names or names[-1] != name:
            names.append(name)
    return names


def config_with(**overrides: Any) -> ProxmoxConfig:
    installation = overrides.pop("installation_id", INSTALLATION)
    return ProxmoxConfig.from_mapping(catalogue(**overrides), installation_id=installation)


# --- what the plan shows -------------------------------------------------------------------


def test_plan_makes_no_proxmox_call_and_resolves_every_value(world: World) -> None:
    req = world.request("shown", zone="pve2")
    plan = plan_of(world.config, req)
    assert len(world.engine.ledger) == 0
    assert (plan.cluster, plan.uid, plan.vm_name) == ("pvesim", req.uid, "proxy-shown")
    assert (plan.image, plan.template_vmid) == ("debian-13", 9000)
    assert (plan.node, plan.node_source) == ("pve2", "zone")
    assert plan.vmid_candidate == vmid_for(req.uid, 0, 100000, 199999)
    assert (plan.cores, plan.memory_mib, plan.disk_gib) == (1, 1024, 10)
    assert plan.seed_iso_name == world.seed_volid(req).split("/", 1)[1]
    assert plan.seed_volid == world.seed_volid(req)
    assert (plan.install_guest_agent, plan.extra_vendor_data) == (True, False)
    shown = plan.as_dict()
    json.dumps(shown)  # JSON-friendly as it is
    assert shown["vmid"]["candidate"] == plan.vmid_candidate
    assert shown["vmid"]["reserved"] is False
    assert "10 GiB" in shown["resources"]["diskGrowth"]
    assert "unknown" in " ".join(shown["notes"])  # the template's size needs a call
    assert shown["network"]["change"].startswith("as cloned")
    assert shown["planHash"] == plan.plan_hash


def test_plan_for_a_blank_zone_names_the_placement(world_factory: Callable[..., World]) -> None:
    world = world_factory()
    req = world.request("placed", zone="")
    plan = plan_of(world.config, req, placement_node="pve3")
    assert (plan.node, plan.node_source) == ("pve3", "placement")
    assert "placement" in plan.as_dict()["node"]["note"]

    single = world_factory(nodes=["pve1"])
    plan = plan_of(single.config, single.request("alone", zone=""))
    assert (plan.node, plan.node_source) == ("pve1", "only node")


@pytest.mark.parametrize(
    ("field", "value"),
    [("zone", "pve9"), ("machine_type", "huge"), ("image", "arch"), ("zone", "")],
)
def test_unknown_catalogue_keys_fail_as_the_create_does(
    world: World, field: str, value: str
) -> None:
    req = world.request("bad", **{field: value})
    with pytest.raises(PermanentError) as raised:
        plan_of(world.config, req)
    created = world.create(req)
    assert isinstance(created.error, PermanentError)
    assert str(raised.value) == str(created.error)


def test_plan_without_uid_has_no_vmid_candidate(world: World) -> None:
    plan = plan_of(world.config, world.request("new"), uid=None)
    assert plan.uid is None and plan.vmid_candidate is None
    assert "assigned when the proxy is created" in plan.mark_lines[1]


def test_plan_refuses_a_malformed_cloud_init_hash(world: World) -> None:
    req = world.request("hash")
    for bad in ("abc", "A" * 64, ""):
        with pytest.raises(ValueError):
            plan_of(world.config, req, cloud_init_sha256=bad, cloud_init_bytes=10)
    # No cloud-init at all is the empty content's hash, however the caller spells it.
    empty = plan_of(world.config, req, cloud_init_sha256="", cloud_init_bytes=0)
    spelled = plan_of(
        world.config, req, cloud_init_sha256=hashlib.sha256(b"").hexdigest(), cloud_init_bytes=0
    )
    assert empty.plan_hash == spelled.plan_hash


# --- the plan against a real create ------------------------------------------------------


@pytest.mark.parametrize("machine_type", ["small", "nodisk"])
def test_plan_steps_are_the_stages_the_create_runs(
    world_factory: Callable[..., World], machine_type: str
) -> None:
    world = world_factory()
    req = world.request("steps", machine_type=machine_type)
    plan = plan_of(world.config, req)
    result = world.create(req)
    assert result.status == "done"
    # "address" and "seed_release" are the service's stages after the provider's create
    # (runners.py); with the seed kept, the release is not planned.
    assert [s.name for s in plan.steps] == [*journal_stages(world), "address", "seed_release"]
    kept = plan_of(world.config, req, keep_seed_iso=True)
    assert [s.name for s in kept.steps] == [*journal_stages(world), "address"]
    assert kept.plan_hash != plan.plan_hash
    assert ("resize" in [s.name for s in plan.steps]) == (machine_type == "small")


def test_a_shrinking_disk_is_the_one_plan_the_create_cannot_follow(world: World) -> None:
    """Machine type ``tiny`` asks for 2 GiB of a 3 GiB template: the plan shows a resize the
    create skips (Proxmox never shrinks), and the preflight is what says so."""
    req = world.request("tiny", machine_type="tiny")
    plan = plan_of(world.config, req)
    checks = {c.code: c for c in preflight(world.api, world.config, plan)}
    assert checks["template_boot_disk"].status == "failed"
    world.results.clear()
    world.create(req)
    assert "resize" in [s.name for s in plan.steps]
    assert "resize" not in journal_stages(world)


def test_plan_shows_what_the_create_writes(world_factory: Callable[..., World]) -> None:
    world = world_factory(bridge="vmbr0", vlanTag=4)
    req = world.request("writes", zone="pve2")
    plan = plan_of(world.config, req)
    result = world.create(req)
    vmid = int(str(result.provider_id).split("/")[1])
    assert vmid == plan.vmid_candidate
    config = world.api.vm_config(plan.node, vmid)
    for key, value in plan.configure.items():
        assert config[key] == value, key
    assert plan.rewrites_net0 and "tag=4" in plan.network_change
    assert "bridge=vmbr0" in config["net0"] and "tag=4" in config["net0"]
    lines = config["description"].splitlines()
    assert [ln for ln in lines if not ln.startswith(CREATED_AT_KEY)] == [
        ln for ln in plan.mark_lines if not ln.startswith(CREATED_AT_KEY)
    ]
    assert any(ln.startswith(CREATED_AT_KEY + "=20") for ln in lines)


# --- the hash -------------------------------------------------------------------------------


def test_plan_hash_is_deterministic_and_documented(world: World) -> None:
    req = world.request("same")
    first = plan_of(world.config, req)
    again = plan_of(config_with(), req)  # a config built afresh from the same document
    assert first.plan_hash == again.plan_hash
    text = hash_input(first)
    assert list(json.loads(text)) == [key for key, _ in HASH_FIELDS]
    assert " " not in text  # compact
    assert first.plan_hash == hashlib.sha256(text.encode()).hexdigest()


def _changed_catalogue(path: str, value: Any) -> dict[str, Any]:
    data = catalogue()
    *parents, leaf = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    return data


def test_every_input_changes_the_plan_hash(world: World) -> None:
    req = world.request("inputs")
    other = hashlib.sha256(b"other").hexdigest()
    variants: dict[str, Plan] = {
        "uid": plan_of(world.config, req, uid=str(uuid.uuid4())),
        "vm_name": plan_of(world.config, req, vm_name="proxy-renamed"),
        "zone": plan_of(world.config, req, zone="pve2"),
        "zone blank, placed on the same node": plan_of(
            world.config, req, zone="", placement_node="pve1"
        ),
        "machine_type": plan_of(world.config, req, machine_type="nodisk"),
        "image": plan_of(world.config, req, image="debian-13-noagent"),
        "cloud_init_sha256": plan_of(world.config, req, cloud_init_sha256=other),
        "cloud_init_bytes": plan_of(world.config, req, cloud_init_bytes=len(CLOUD_INIT) + 1),
        "installation": plan_of(config_with(installation_id="inst-other"), req),
    }
    config_changes: dict[str, Any] = {
        "name": "pvesim-b",
        "isoStorage": "local",
        "storage": "local-lvm",
        "bridge": "vmbr1",
        "vlanTag": 7,
        "vmidRange": {"min": 100000, "max": 199998},
        "machineTypes.small.cores": 2,
        "machineTypes.small.memoryMiB": 2048,
        "machineTypes.small.diskGiB": 12,
        "templates.debian-13.vmid": 9001,
        "vendorData": "#cloud-config\nruncmd: [true]\n",
        "installGuestAgent": False,
    }
    for path, value in config_changes.items():
        config = ProxmoxConfig.from_mapping(
            _changed_catalogue(path, value), installation_id=INSTALLATION
        )
        variants[path] = plan_of(config, req)
    baseline = plan_of(world.config, req).plan_hash
    hashes = {name: plan.plan_hash for name, plan in variants.items()}
    assert baseline not in hashes.values()
    assert len(set(hashes.values())) == len(hashes), hashes


def test_settings_outside_the_plan_leave_the_hash_alone(world: World) -> None:
    """Connection settings and unused catalogue entries are not inputs of the plan."""
    req = world.request("outside")
    baseline = plan_of(world.config, req).plan_hash
    for path, value in {
        "url": "https://10.0.0.9:8006",
        "tokenFile": "/elsewhere/token",
        "requestTimeoutSeconds": 5,
        "templates.debian-13-cloudinit.vmid": 9100,
        "machineTypes.tiny.cores": 4,
    }.items():
        config = ProxmoxConfig.from_mapping(
            _changed_catalogue(path, value), installation_id=INSTALLATION
        )
        assert plan_of(config, req).plan_hash == baseline, path


def test_no_cloud_init_or_vendor_data_content_in_the_plan(
    world_factory: Callable[..., World],
) -> None:
    vendor = "#cloud-config\nwrite_files: [{path: /etc/x, content: VENDOR-SECRET-7}]\n"
    world = world_factory(vendorData=vendor)
    secret = b"#cloud-config\npassword: USERDATA-SECRET-3\n"
    req = world.request("secret", cloud_init=secret)
    plan = plan_of(world.config, req)
    for text in (json.dumps(plan.as_dict()), hash_input(plan), repr(plan)):
        assert "USERDATA-SECRET-3" not in text and "VENDOR-SECRET-7" not in text
    assert plan.cloud_init_sha256 == hashlib.sha256(secret).hexdigest()
    assert plan.extra_vendor_data is True
    assert plan.as_dict()["vendorData"] == {"installGuestAgent": True, "extraVendorData": True}
