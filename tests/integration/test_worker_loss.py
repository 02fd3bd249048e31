"""A whole worker SIGKILLed mid-create and mid-delete (parent and pool, no warning).

Nothing is acknowledged or rejected by a worker killed as a group: the messages it held
(running steps and countdowns) stay unacknowledged in Redis for the visibility timeout (an
hour). Recovery is therefore the journal's: once the killed deliveries' claims expire, Beat's
sweeper re-sends every overdue step with a new token, and each step resumes from what Proxmox
holds (seed 000 entry 10, "what a retry finds").

To kill at the worst moment every time, the simulator holds back its answers to the mutation
under test (a latency fault: the call is applied at once, its reply leaves later), and the
worker is killed as soon as the ledger shows such calls applied: their replies are lost with
the worker, exactly the "submitted but not recorded" case of seed 001's receipts.

Counts come from the simulator: one VM per proxy by its mark's UID, one accepted clone per
proxy, nothing left after the deletes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from itstack import CLONE, DESTROY, Beat, Stack, Worker, wait_until

pytestmark = pytest.mark.integration

COUNT = 12
CLONE_PATH = CLONE.split(" ", 1)[1]
DESTROY_PATH = DESTROY.split(" ", 1)[1]


def _create(stack: Stack, names: list[str], *zone: str) -> None:
    stack.create_proxies(*names, *zone)


def _applied(stack: Stack, after: int, key: str, prefix: str) -> int:
    """How many ``key`` calls the simulator applied for VMs named ``proxy-<prefix>*``."""
    entries = stack.sim.ledger(after=after, key=key)
    if key == CLONE:
        return sum(
            e["status"] == 200 and str(e["params"].get("name", "")).startswith(f"proxy-{prefix}")
            for e in entries
        )
    return sum(bool(e["mutation"]) for e in entries)


def _kill_when(stack: Stack, worker: Worker, count: int, after: int, key: str, prefix: str) -> None:
    wait_until(
        lambda: _applied(stack, after, key, prefix) >= count,
        timeout=60,
        interval=0.05,
        what=f"{count} {key} calls applied",
    )
    worker.kill()
    stack.sim.control("clear_faults")


@dataclass
class KilledCreate:
    names: list[str]
    rows: dict[str, dict[str, Any]]
    clone_calls: list[dict[str, Any]]


@pytest.fixture(scope="module")
def killed_mid_create(stack: Stack, _main_worker: Worker) -> Iterator[KilledCreate]:
    """Twelve creates on ``pve2`` (so every clone crosses from the template's node ``pve1``),
    the worker killed while clone replies are held back, restarted, converged under Beat."""
    if not _main_worker.alive:
        _main_worker.start()
    names = [f"kc-{i:02d}" for i in range(1, COUNT + 1)]
    beat = stack.beat()  # the sweeper every 2 s, reconcile every 5 s (see conftest.TIMINGS)
    try:
        before = stack.sim.last_seq()
        stack.sim.control("latency", seconds=1.5, method="POST", path=CLONE_PATH)
        _create(stack, names, "--zone", "pve2")
        _kill_when(stack, _main_worker, 4, before, CLONE, "kc-")
        assert all(row["phase"] != "Running" for row in stack.proxies("kc-"))
        _main_worker.start()
        stack.wait_phase(names, "Running", timeout=120)
    finally:
        stack.sim.control("clear_faults")
        if not _main_worker.alive:
            _main_worker.start()
        beat.stop()
        stack.beats.remove(beat)
    yield KilledCreate(
        names,
        {row["name"]: row for row in stack.proxies("kc-")},
        stack.sim.ledger(after=before, key=CLONE),
    )
    left = [row["name"] for row in stack.proxies("kc-")]  # the worker fixture may have been first
    if left:
        stack.manage("proxies", "delete", *left)
        stack.wait_phase(left, "Deleted", timeout=60)


def test_worker_killed_mid_create_converges_to_one_vm_per_proxy(
    stack: Stack, killed_mid_create: KilledCreate
) -> None:
    names, rows = killed_mid_create.names, killed_mid_create.rows
    ours = [v for v in stack.sim.vms() if str(v.get("name", "")).startswith("proxy-kc-")]
    assert sorted(v["name"] for v in ours) == [f"proxy-{n}" for n in names]
    uids = Counter(
        line.removeprefix("proxyhub-uid=")
        for vm in ours
        for line in stack.sim.vm_config(vm["node"], vm["vmid"]).get("description", "").splitlines()
        if line.startswith("proxyhub-uid=")
    )
    assert uids == {row["uid"]: 1 for row in rows.values()}, "exactly one VM per proxy"
    assert all(row["ip"] for row in rows.values())
    journal = stack.probe("journal", "kc-")
    assert Counter((op["kind"], op["state"]) for op in journal) == {("create", "succeeded"): COUNT}


def test_worker_killed_mid_create_never_submits_a_clone_twice(
    killed_mid_create: KilledCreate,
) -> None:
    # A clone whose reply was lost must be found at its VMID, never submitted again (seed 001:
    # a lost result stays unknown until the observed state settles it; create.py's docstring).
    accepted = [e for e in killed_mid_create.clone_calls if e["status"] == 200]
    clones = Counter(e["params"]["name"] for e in accepted)
    twice = sorted(
        (e["params"]["name"], e["params"]["newid"], e["params"].get("target"), e["seq"])
        for e in accepted
        if clones[e["params"]["name"]] > 1
    )
    assert clones == {f"proxy-{n}": 1 for n in killed_mid_create.names}, (
        f"clones accepted twice for one proxy (name, newid, target, seq): {twice}"
    )


def test_worker_killed_mid_delete_converges_with_nothing_left(
    stack: Stack, worker: Worker, beat: Beat
) -> None:
    names = [f"kd-{i:02d}" for i in range(1, COUNT + 1)]
    _create(stack, names)
    stack.wait_phase(names, "Running", timeout=90)

    before = stack.sim.last_seq()
    stack.sim.control("latency", seconds=1.5, method="DELETE", path=DESTROY_PATH)
    stack.manage("proxies", "delete", *names)
    _kill_when(stack, worker, 3, before, DESTROY, "kd-")
    assert len(stack.proxies("kd-")) > 0, "the kill came too late to interrupt the deletes"
    worker.start()
    stack.wait_phase(names, "Deleted", timeout=120)

    assert [v for v in stack.sim.vms() if str(v.get("name", "")).startswith("proxy-kd-")] == []
    assert [v for _, v in stack.sim.seeds() if "proxy-kd-" in v] == []
    journal = stack.probe("journal", "kd-")
    assert Counter((op["kind"], op["state"]) for op in journal) == {
        ("create", "succeeded"): COUNT,
        ("delete", "succeeded"): COUNT,
    }
