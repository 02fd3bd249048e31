"""GC on a cluster shared with others removes exactly this installation's old orphans.

The cluster holds, besides the simulator's own guests (an unmarked ``proxy-legacy`` and a
``proxy-other`` marked by another installation):

* two live proxies of ours, made by proxyhub;
* two orphans of ours, marked with this installation's id, created two hours ago, whose UIDs
  belong to no proxy: the only garbage;
* a young orphan of ours, a minute old, below the ten-minute minimum age (a create that has
  not yet written its row must never be collected);
* an old VM marked by another installation sharing the cluster (DESIGN.md §2);
* an unmarked ``proxy-*`` VM someone made by hand (seed 000 entry 12);
* seed ISOs: one for an old orphan (goes with its VM), and a young one no VM is named for.

The foreign VMs are made through Proxmox's API with the token, as another tool would. With
the minimum age then lowered to ten seconds, the young orphan and the orphan seed go too, and
still nothing of anyone else's.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from itstack import DESTROY, STOP, VOLUME_DELETE, Stack, Worker, wait_until

from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.seed import build_seed_iso, parse_seed_name, seed_iso_name

pytestmark = pytest.mark.integration

TEMPLATE = 9000


def _clone(stack: Stack, vmid: int, name: str, description: str | None) -> None:
    params: dict[str, Any] = {"newid": vmid, "name": name, "full": 1}
    if description is not None:
        params["description"] = description
    upid = stack.sim.api("POST", f"/nodes/pve1/qemu/{TEMPLATE}/clone", **params)
    assert stack.sim.wait_task(upid) == "OK"


def _mark(installation: str, age: timedelta) -> tuple[str, str]:
    uid = str(uuid.uuid4())
    return uid, render_mark(uid, datetime.now(UTC) - age, installation)


def _upload_seed(stack: Stack, vm_name: str, installation: str, uid: str) -> str:
    """A seed of this installation's form (issue 11), for ``uid``."""
    iso = build_seed_iso(
        user_data=b"#cloud-config\n",
        instance_id=str(uuid.uuid4()),
        hostname=vm_name,
        vendor_data=None,
        install_guest_agent=False,
    )
    name = seed_iso_name(vm_name, installation_id=installation, uid=uid)
    upid = stack.sim.upload_iso("pve1", "proxy-seeds", name, iso)
    assert stack.sim.wait_task(upid) == "OK"
    return f"proxy-seeds:iso/{name}"


def test_gc_lists_and_removes_exactly_our_old_orphans(stack: Stack, worker: Worker) -> None:
    live = ["gc-live-1", "gc-live-2"]
    stack.create_proxies(*live)
    stack.wait_phase(live, "Running", timeout=90)
    live_rows = stack.proxies("gc-live-")
    first = live_rows[0]
    description = stack.sim.vm_config(first["node"], first["vmid"])["description"]
    ours = next(
        line.split("=", 1)[1]
        for line in description.splitlines()
        if line.startswith("proxyhub-installation=")
    )

    old_uid_1, old_mark_1 = _mark(ours, timedelta(hours=2))
    old_uid_2, old_mark_2 = _mark(ours, timedelta(hours=2))
    _, young_mark = _mark(ours, timedelta(minutes=1))
    _, other_mark = _mark("another-proxyhub", timedelta(hours=2))
    garbage = {199_001: ("proxy-gc-old-1", old_uid_1), 199_002: ("proxy-gc-old-2", old_uid_2)}
    _clone(stack, 199_001, "proxy-gc-old-1", old_mark_1)
    _clone(stack, 199_002, "proxy-gc-old-2", old_mark_2)
    _clone(stack, 199_003, "proxy-gc-young", young_mark)
    _clone(stack, 199_004, "proxy-gc-other", other_mark)
    _clone(stack, 199_005, "proxy-gc-byhand", None)
    old_seed = _upload_seed(stack, "proxy-gc-old-1", ours, old_uid_1)
    young_seed = _upload_seed(stack, "proxy-gc-ghost", ours, str(uuid.uuid4()))
    young_seed_at = time.time()
    everything_else = {int(v["vmid"]) for v in stack.sim.vms()} - set(garbage)

    before = stack.sim.last_seq()
    planned = stack.manage_json("gc", "--dry-run", "--json")
    assert [e for e in stack.sim.ledger(after=before) if e["method"] != "GET"] == []
    expected = sorted(("vm", vmid, name, uid) for vmid, (name, uid) in garbage.items())
    assert sorted((i["kind"], i["vmid"], i["name"], i["uid"]) for i in planned) == expected, planned

    removed = stack.manage_json("gc", "--json")
    assert sorted(i["vmid"] for i in removed) == sorted(garbage)

    def gone() -> bool:
        vmids = {int(v["vmid"]) for v in stack.sim.vms()}
        seeds = {v for _, v in stack.sim.seeds()}
        return not (vmids & set(garbage)) and old_seed not in seeds

    wait_until(gone, timeout=60, interval=0.2, what="the old orphans and their seed removed")

    assert {int(v["vmid"]) for v in stack.sim.vms()} == everything_else
    assert young_seed in {v for _, v in stack.sim.seeds()}
    for row in stack.proxies("gc-live-"):
        assert row["phase"] == "Running"
    # Every mutation GC caused was aimed at the garbage: its VMs and their seed ISOs.
    garbage_names = {name for name, _ in garbage.values()}
    for entry in stack.sim.ledger(after=before):
        if not entry["mutation"]:
            continue
        assert entry["key"] in {STOP, DESTROY, VOLUME_DELETE}, entry["key"]
        if entry["key"] == VOLUME_DELETE:
            volume = str(entry["path_params"]["volume"]).rsplit("/", 1)[-1]
            parsed = parse_seed_name(volume)
            assert parsed is not None and parsed.vm_name in garbage_names, volume
        else:
            assert int(entry["path_params"]["vmid"]) in garbage, entry["path"]
    journal = stack.probe("journal", "gc-old-")
    assert sorted((op["kind"], op["state"], op["via"]) for op in journal) == [
        ("delete", "succeeded", "beat"),
        ("delete", "succeeded", "beat"),
    ]

    # An operator lowers the minimum age to 10 s: the young orphan (a minute old) and the
    # orphan seed no VM is named for (uploaded over 10 s ago) are now garbage; nothing else.
    quick = {"PROXYHUB_GC_MIN_AGE_SECONDS": "10"}
    wait_until(lambda: time.time() - young_seed_at > 10, timeout=15, what="the seed aged 10 s")
    planned = stack.manage_json("gc", "--dry-run", "--json", env=quick)
    assert sorted((i["kind"], i["name"], i["volid"]) for i in planned) == [
        ("seed", "proxy-gc-ghost", young_seed),
        ("vm", "proxy-gc-young", None),
    ], planned
    stack.manage_json("gc", "--json", env=quick)

    def young_gone() -> bool:
        names = {str(v.get("name")) for v in stack.sim.vms()}
        return "proxy-gc-young" not in names and young_seed not in {v for _, v in stack.sim.seeds()}

    wait_until(young_gone, timeout=60, interval=0.2, what="the young orphan and the seed removed")
    names = {str(v.get("name")) for v in stack.sim.vms()}
    assert {"proxy-gc-other", "proxy-gc-byhand", "proxy-legacy", "proxy-other"} <= names
    assert {f"proxy-{n}" for n in live} <= names

    stack.manage("proxies", "delete", *live)
    stack.wait_phase(live, "Deleted", timeout=60)


def test_gc_json_is_a_json_document_at_the_default_log_level(stack: Stack, worker: Worker) -> None:
    done = stack.manage("gc", "--dry-run", "--json")
    assert isinstance(json.loads(done.stdout), list)
