"""A fleet's whole life through the public commands, counted on the simulator.

``proxies create`` / ``wait`` / ``list --json`` / ``delete`` drive real workers over Redis;
what exists is read from Proxmox's own API and the simulator's ledger, never from proxyhub's
database alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from itstack import CLONE, START, STOP, Stack, Worker, wait_until

pytestmark = pytest.mark.integration

# The simulator's default guests (pvesim/defaults.py) that are not ours.
DEFAULT_VMS = {9000, 9001, 9002, 100, 101, 102}


def _create(stack: Stack, prefix: str, count: int) -> list[str]:
    stack.create_proxies("--count", str(count), "--prefix", prefix)
    width = len(str(count))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, count + 1)]


def _agent_ipv4(stack: Stack, node: str, vmid: int) -> str:
    reply = stack.sim.api("GET", f"/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces")
    for interface in reply["result"]:
        if interface["name"] == "lo":
            continue
        for address in interface.get("ip-addresses", []):
            if address["ip-address-type"] == "ipv4":
                return str(address["ip-address"])
    return ""


def _ours(vms: list[dict[str, Any]], prefix: str) -> dict[str, dict[str, Any]]:
    return {str(v["name"]): v for v in vms if str(v.get("name", "")).startswith(prefix)}


def test_twenty_proxies_run_with_addresses_and_leave_nothing_once_deleted(
    stack: Stack, worker: Worker
) -> None:
    before = stack.sim.last_seq()
    names = _create(stack, "fleet", 20)
    stack.wait_phase(names, "Running", timeout=120)

    rows = {row["name"]: row for row in stack.proxies("fleet-")}
    assert sorted(rows) == names
    vms = _ours(stack.sim.vms(), "proxy-fleet-")
    assert sorted(vms) == [f"proxy-{n}" for n in names]
    for name, row in rows.items():
        vm = vms[f"proxy-{name}"]
        assert row["phase"] == "Running"
        assert (vm["vmid"], vm["node"], vm["status"]) == (row["vmid"], row["node"], "running")
        assert row["providerId"] == f"vms/{vm['vmid']}/proxy-{name}"
        # The address proxyhub shows is the one the guest agent reports.
        assert row["ip"] and row["ip"] == _agent_ipv4(stack, vm["node"], vm["vmid"])
        mark = stack.sim.vm_config(vm["node"], vm["vmid"])["description"].splitlines()
        assert f"proxyhub-uid={row['uid']}" in mark
    clones = Counter(e["params"]["name"] for e in stack.sim.ledger(after=before, key=CLONE))
    assert clones == {f"proxy-{n}": 1 for n in names}
    # Without zones, the fleet spreads over every node.
    assert {row["node"] for row in rows.values()} == {"pve1", "pve2", "pve3"}

    stack.manage("proxies", "delete", *names)
    stack.wait_phase(names, "Deleted", timeout=120)

    remaining = stack.sim.vms()
    assert _ours(remaining, "proxy-fleet-") == {}
    assert [v for _, v in stack.sim.seeds() if "proxy-fleet-" in v] == []
    assert {int(v["vmid"]) for v in remaining} >= DEFAULT_VMS, "only our VMs were deleted"
    assert stack.proxies("fleet-") == []
    journal = stack.probe("journal", "fleet-")
    assert Counter(op["kind"] for op in journal) == {"create": 20, "delete": 20}
    assert [op for op in journal if op["state"] != "succeeded"] == []


def _reconcile(stack: Stack) -> str:
    """``manage.py reconcile``; only one round runs at a time, so a held lease is retried."""

    def attempt() -> str | None:
        done = stack.manage("reconcile", check=False)
        if done.returncode == 0:
            return done.stdout
        assert "lease" in done.stderr, done.stderr
        return None

    return wait_until(attempt, timeout=30, interval=0.5, what="a reconcile round")


def test_a_second_reconcile_after_convergence_makes_no_mutating_call(
    stack: Stack, worker: Worker
) -> None:
    names = _create(stack, "recon", 5)
    stack.wait_phase(names, "Running", timeout=90)
    victim = stack.proxies(names[0])[0]
    # Behind proxyhub's back: someone stops one VM in Proxmox.
    upid = stack.sim.api("POST", f"/nodes/{victim['node']}/qemu/{victim['vmid']}/status/stop")
    assert stack.sim.wait_task(upid) == "OK"

    first = stack.sim.last_seq()
    assert "start 1" in _reconcile(stack)

    # The start operation ends when the VM runs; its address is read by later rounds, as
    # Beat's would. A round re-reads a VM's identity when the listing dates its start after
    # the last read (seed 001, reconcile._started_since_identity_read), and the listing's
    # uptime is in whole seconds: a read within a second of the start leaves the start dated
    # before or after it, round by round, so which later round reads it again is chance
    # (stop 24's CI: a quiet round, then one that read it). The first round here comes two
    # seconds after the boot, so its read is past that second and no later round repeats it.
    def booted_two_seconds_ago() -> bool:
        path = f"/nodes/{victim['node']}/qemu/{victim['vmid']}/status/current"
        status = stack.sim.api("GET", path)
        return status["status"] == "running" and int(status.get("uptime", 0)) >= 2

    wait_until(booted_two_seconds_ago, timeout=60, interval=0.25, what="the restarted boot")

    # Converged: every proxy Running with an address again, and a round that found nothing to do.
    def converged() -> bool:
        out = _reconcile(stack)
        rows = stack.proxies("recon-")
        settled = all(row["phase"] == "Running" and row["ip"] for row in rows)
        return settled and "converged 5" in out and "checked" not in out

    wait_until(converged, timeout=60, interval=0.5, what="convergence after the restart")
    starts = stack.sim.ledger(after=first, key=START)
    assert [int(e["path_params"]["vmid"]) for e in starts if e["mutation"]] == [victim["vmid"]]
    assert stack.sim.ledger(after=first, key=STOP) == []

    # The round after a quiet one: still nothing to do, for one listing.
    converged = stack.sim.last_seq()
    assert "converged 5" in _reconcile(stack)
    calls = stack.sim.ledger(after=converged)
    assert [e for e in calls if e["mutation"] or e["method"] != "GET"] == []
    # One listing per cluster per round serves every converged proxy (DESIGN.md §5).
    assert [e["key"] for e in calls] == ["GET /cluster/resources"]

    stack.manage("proxies", "delete", *names)
    stack.wait_phase(names, "Deleted", timeout=60)
