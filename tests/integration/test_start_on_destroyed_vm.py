"""A start asked for a VM someone destroyed behind proxyhub's back: it ends at once, and
reconcile brings the proxy back Running on one new VM.

Issue 10 and seed 001: a power action on a VM that no longer exists cannot heal, so it must not
retry until its ceiling. It ends ``failed`` on its first delivery ("the VM no longer exists"),
submits nothing to Proxmox, and leaves the proxy marked as having no VM; since the operator's
start says it should run, reconcile (Beat, as deployed) re-creates it.

Beat is started only once the start has failed: with reconcile running during the out-of-band
destroy it would re-create the VM before the operator asks (that path is reconcile's own test);
here the start must meet the missing VM.
"""

from __future__ import annotations

from collections import Counter

import pytest
from itstack import CLONE, START, Stack, Worker, wait_until

pytestmark = pytest.mark.integration

NAME = "oob-1"
# A bystander on the same cluster, untouched by any of this.
OTHER = "oob-2"


def _start_operations(stack: Stack) -> list[dict]:
    return [op for op in stack.probe("journal", NAME) if op["kind"] == "start"]


def _mark_uids(stack: Stack) -> Counter[str]:
    """The ``proxyhub-uid`` of every VM on the cluster, one count per VM."""
    uids: Counter[str] = Counter()
    for vm in stack.sim.vms():
        description = stack.sim.vm_config(vm["node"], vm["vmid"]).get("description", "")
        for line in description.splitlines():
            if line.startswith("proxyhub-uid="):
                uids[line.removeprefix("proxyhub-uid=")] += 1
    return uids


def test_a_start_on_a_vm_destroyed_out_of_band_fails_at_once_and_reconcile_recreates_it(
    stack: Stack, worker: Worker
) -> None:
    stack.create_proxies(NAME, OTHER)
    stack.wait_phase([NAME, OTHER], "Running", timeout=90)
    stack.manage("proxies", "shutdown", NAME)
    stack.wait_phase([NAME], "Stopped", timeout=60)
    first = stack.proxies(NAME)[0]
    other = stack.proxies(OTHER)[0]

    # Out of band, with Proxmox's own API: stop (it is already stopped; an admin's script does
    # not know) and destroy.
    node, vmid = first["node"], first["vmid"]
    upid = stack.sim.api("POST", f"/nodes/{node}/qemu/{vmid}/status/stop")
    assert stack.sim.wait_task(upid) == "OK"
    upid = stack.sim.api("DELETE", f"/nodes/{node}/qemu/{vmid}")
    assert stack.sim.wait_task(upid) == "OK"
    assert vmid not in {int(v["vmid"]) for v in stack.sim.vms()}

    before = stack.sim.last_seq()
    stack.manage("proxies", "start", NAME)
    ended = wait_until(
        lambda: [op for op in _start_operations(stack) if op["state"] in ("failed", "succeeded")],
        timeout=30,
        interval=0.5,
        what="the start operation ended",
    )
    assert len(ended) == 1
    start = ended[0]
    assert start["state"] == "failed"
    assert "no longer exists" in start["lastError"], start["lastError"]
    assert start["attempts"] == 0, "it ended on its first delivery, no retry counted"
    assert [e for e in stack.sim.ledger(after=before) if e["mutation"]] == [], (
        "nothing was submitted to Proxmox for a VM that does not exist"
    )
    row = stack.proxies(NAME)[0]
    assert (row["phase"], row["providerId"], row["vmid"]) == ("Pending", None, None)
    assert stack.probe("proxies", NAME)[0]["desiredPower"] == "on"

    # Reconcile, as Beat runs it, brings the proxy back.
    beat = stack.beat()
    try:
        stack.wait_phase([NAME], "Running", timeout=90)
        wait_until(
            lambda: stack.proxies(NAME)[0]["ip"], timeout=30, what="the new VM's address known"
        )
    finally:
        beat.stop()
        stack.beats.remove(beat)

    row = stack.proxies(NAME)[0]
    ours = [v for v in stack.sim.vms() if v.get("name") == f"proxy-{NAME}"]
    assert len(ours) == 1, ours
    assert (ours[0]["vmid"], ours[0]["node"], ours[0]["status"]) == (
        row["vmid"],
        row["node"],
        "running",
    )
    assert _mark_uids(stack)[row["uid"]] == 1, "exactly one VM carries the proxy's mark"
    clones = [e for e in stack.sim.ledger(after=before, key=CLONE) if e["mutation"]]
    assert [e["params"]["name"] for e in clones] == [f"proxy-{NAME}"]
    starts = [e for e in stack.sim.ledger(after=before, key=START) if e["mutation"]]
    assert [int(e["path_params"]["vmid"]) for e in starts] == [row["vmid"]]
    journal = stack.probe("journal", NAME)
    assert [(op["kind"], op["state"], op["via"]) for op in journal] == [
        ("create", "succeeded", "command"),
        ("shutdown", "succeeded", "command"),
        ("start", "failed", "command"),
        ("create", "succeeded", "beat"),
    ]

    bystander = stack.proxies(OTHER)[0]
    assert (bystander["phase"], bystander["vmid"]) == ("Running", other["vmid"])

    stack.manage("proxies", "delete", NAME, OTHER)
    stack.wait_phase([NAME, OTHER], "Deleted", timeout=60)
