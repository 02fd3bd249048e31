"""The plan set (issue 14, seed 003): one hash over everything a bulk commit depends on, and in
plain words what changed between the plan shown and the plan the commit would make.

Pure: no Django, no database, no Proxmox.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.node_choice import NodeLoad, PlacementInputs, pick_node
from provisioning.proxmox.plan import HASH_FIELDS, Plan, build_plan
from provisioning.proxmox.plan_set import (
    COVERED,
    canonical,
    plan_set_document,
    plan_set_hash,
    what_changed,
)

CLOUD_INIT = b"#cloud-config\nchpasswd: {list: 'root:PLANSET-SECRET'}\n"
MIB = 1024**2


def _config(**overrides: Any) -> ProxmoxConfig:
    data: dict[str, Any] = {
        "name": "lab",
        "url": "https://127.0.0.1:8006",
        "tokenFile": "/nonexistent/token",
        "nodes": ["pve1", "pve2", "pve3"],
        "isoStorage": "proxy-seeds",
        "templates": {"debian-13": {"vmid": 9000}},
        "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10}},
    }
    data.update(overrides)
    return ProxmoxConfig.from_mapping(data, installation_id="inst-1")


def _plan(config: ProxmoxConfig, name: str, node: str, **fields: Any) -> tuple[str, Plan]:
    values: dict[str, Any] = {
        "uid": None,
        "vm_name": name,
        "zone": "",
        "machine_type": "small",
        "image": "debian-13",
        "cloud_init_sha256": hashlib.sha256(CLOUD_INIT).hexdigest(),
        "cloud_init_bytes": len(CLOUD_INIT),
        "placement_node": node,
    }
    values.update(fields)
    return name, build_plan(config, **values)


def _inputs(**in_flight: int) -> PlacementInputs:
    return PlacementInputs(
        cluster="lab",
        loads=tuple(
            NodeLoad(node=n, in_flight=in_flight.get(n, 0)) for n in ("pve1", "pve2", "pve3")
        ),
    )


def _doc(
    config: ProxmoxConfig | None = None,
    nodes: tuple[str, ...] = ("pve1", "pve2", "pve3"),
    inputs: PlacementInputs | None = None,
    **fields: Any,
) -> dict[str, Any]:
    config = config or _config()
    plans = [_plan(config, f"web-{i}", node, **fields) for i, node in enumerate(nodes, 1)]
    return plan_set_document(plans, {"lab": inputs or _inputs()})


def test_every_input_of_a_plans_hash_is_held_by_the_set() -> None:
    assert [key for key, _ in HASH_FIELDS] == list(COVERED)


def test_the_same_inputs_hash_the_same_and_hold_no_cloud_init() -> None:
    first, again = _doc(), _doc()
    assert plan_set_hash(first) == plan_set_hash(again)
    assert len(plan_set_hash(first)) == 64
    assert "PLANSET-SECRET" not in canonical(first)
    # Round trip through JSON (the page and the plan file): the same hash.
    assert plan_set_hash(json.loads(json.dumps(first))) == plan_set_hash(first)
    assert what_changed(first, again) == []


def test_a_machine_type_change_is_named() -> None:
    shown = _doc()
    now = _doc(_config(machineTypes={"small": {"cores": 1, "memoryMiB": 2048, "diskGiB": 10}}))
    assert plan_set_hash(shown) != plan_set_hash(now)
    assert what_changed(shown, now) == ["machine type small: memory 1024 MiB → 2048 MiB"]


def test_a_template_change_is_named_per_node() -> None:
    shown = _doc()
    now = _doc(_config(templates={"debian-13": {"vmid": 9001}}))
    changes = what_changed(shown, now)
    assert "template debian-13 on pve1: VM 9000 → VM 9001" in changes
    assert len(changes) == 3


def test_a_placement_change_names_the_proxy_and_the_inputs() -> None:
    shown = _doc(inputs=_inputs())
    now = _doc(nodes=("pve2", "pve3", "pve1"), inputs=_inputs(pve1=1))
    changes = what_changed(shown, now)
    assert "placement inputs on pve1: creates in flight 0 → 1" in changes
    assert "placement: pve1 → pve2 for web-1" in changes
    assert "placement: pve3 → pve1 for web-3" in changes


def test_a_cloud_init_or_vendor_data_change_is_named_without_its_digest() -> None:
    shown = _doc()
    other = hashlib.sha256(b"#cloud-config\n{}\n").hexdigest()
    now = _doc(cloud_init_sha256=other)
    changes = what_changed(shown, now)
    assert changes == ["cloud-init changed for web-1, web-2, web-3"]
    assert other not in " ".join(changes)
    vendor = _doc(_config(vendorData="#cloud-config\npackages: [htop]\n"))
    assert what_changed(shown, vendor) == ["cluster lab: vendor-data changed"]


def test_a_spec_change_and_a_new_name_are_named() -> None:
    shown = _doc()
    now = plan_set_document(
        [
            _plan(_config(), "web-1", "", zone="pve1"),
            _plan(_config(), "web-2", "pve2"),
            _plan(_config(), "web-4", "pve3"),
        ],
        {"lab": _inputs()},
    )
    changes = what_changed(shown, now)
    assert "no longer in the plan: web-3" in changes
    assert "not in the shown plan: web-4" in changes
    assert "zone: (blank) → pve1 for web-1" in changes


def test_a_bare_difference_is_never_silent() -> None:
    shown = _doc()
    now = json.loads(json.dumps(shown))
    now["extra"] = 1
    assert what_changed(shown, now) == ["the plan changed"]


def test_pick_node_spreads_a_batch_by_in_flight_then_proxies_then_order() -> None:
    inputs = PlacementInputs(
        cluster="lab",
        loads=(NodeLoad("pve1", proxies=2), NodeLoad("pve2", proxies=0), NodeLoad("pve3")),
    )
    placed = []
    for _ in range(4):
        node = pick_node(inputs)
        assert node is not None
        placed.append(node)
        inputs = inputs.with_placed(node, 1024 * MIB)
    assert placed == ["pve2", "pve3", "pve1", "pve2"]


def test_pick_node_with_health_takes_ready_nodes_by_memory_left() -> None:
    inputs = PlacementInputs(
        cluster="lab",
        loads=(
            NodeLoad("pve1", checked=True, ready=False, reason="offline"),
            NodeLoad("pve2", checked=True, mem_left_bytes=2048 * MIB),
            NodeLoad("pve3", checked=True, mem_left_bytes=4096 * MIB),
        ),
    )
    assert pick_node(inputs) == "pve3"
    assert pick_node(inputs.with_placed("pve3", 3072 * MIB).with_placed("pve2", 0)) == "pve2"
    none_ready = PlacementInputs(
        cluster="lab", loads=(NodeLoad("pve1", checked=True, ready=False, reason="offline"),)
    )
    assert pick_node(none_ready) is None
    assert "pve1 offline" in none_ready.not_ready_reasons()
