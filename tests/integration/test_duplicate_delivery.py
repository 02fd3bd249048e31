"""Duplicate step messages on two workers never run one proxy's chain twice or at once.

A broker may deliver a message twice (a redelivery after a lost ack, a sweeper re-send racing
a late countdown). Here a child process floods Redis with copies of every in-flight step, each
carrying the token the driver currently expects, while two worker instances (two prefork
processes each) take them. Half the proxies are deleted mid-create, so a delete operation
supersedes a create whose step may be running at that moment.

What must hold, read from the simulator's ledger per VM: no Proxmox mutation is done twice,
and once a delete has touched a VM no create step touches it again (the operations' chains on
one proxy never interleave: the lease hands the proxy over only when the create's running
delivery has finished).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from itstack import (
    CLONE,
    CONFIG_PUT,
    CREATE_MUTATIONS,
    DELETE_MUTATIONS,
    DESTROY,
    RESIZE,
    SEED_EJECT,
    START,
    UPLOAD,
    VOLUME_DELETE,
    Beat,
    Stack,
    Worker,
    mutations_by_vm,
    wait_until,
)

pytestmark = pytest.mark.integration


def _delete(stack: Stack, names: list[str]) -> None:
    """``proxies delete``, retried when PostgreSQL picked it as a deadlock victim.

    Known defect (reported to the lead): ``proxy_request_delete`` locks the proxy row and then
    updates its operations, while the driver's ``_persist`` updates the operation and then the
    proxy, so a delete racing a step's journal write can deadlock. An operator would run the
    command again; so does this test, which is about duplicate deliveries.
    """

    def attempt() -> bool:
        # Those the failed attempt already marked are Deleting (or gone): not asked again.
        rows = [r for r in stack.proxies() if r["name"] in names and r["phase"] != "Deleting"]
        if not rows:
            return True
        done = stack.manage("proxies", "delete", *(r["name"] for r in rows), check=False)
        if done.returncode == 0:
            return True
        assert "deadlock detected" in done.stderr, done.stderr
        return False

    wait_until(attempt, timeout=30, interval=0.5, what="the delete request")


def test_duplicated_steps_on_two_workers_never_repeat_or_interleave_mutations(
    stack: Stack, worker: Worker, second_worker: Worker, beat: Beat
) -> None:
    # Beat runs as deployed: its sweeper re-sends what a failed delivery left behind.
    names = [f"dup-{i:02d}" for i in range(1, 13)]
    keep, drop = names[:6], names[6:]
    before = stack.sim.last_seq()
    # The flood starts first and waits for the work: started after the creates, on a loaded
    # machine it could come up once they were over and find nothing to duplicate.
    flood = stack.probe_async("duplicate", "dup-", "--copies", "3", "--seconds", "90")

    def some_clones() -> bool:
        clones = stack.sim.ledger(after=before, key=CLONE)
        return (
            sum(str(e["params"].get("name")) in {f"proxy-{n}" for n in drop} for e in clones) >= 2
        )

    try:
        stack.create_proxies(*names)
        wait_until(some_clones, timeout=60, interval=0.05, what="clones of the proxies to delete")
        _delete(stack, drop)
        stack.wait_phase(keep, "Running", timeout=120)
        stack.wait_phase(drop, "Deleted", timeout=120)
        out, err = flood.communicate(timeout=120)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    assert flood.returncode == 0, err
    sent = json.loads(out)
    assert sent["sent"] >= 3 * len(names), f"the flood sent too little to prove anything: {sent}"

    entries = stack.sim.ledger(after=before)
    by_vm = mutations_by_vm(entries)
    for name in names:
        calls = by_vm.get(f"proxy-{name}", [])
        kinds = Counter(key for _, key in calls)
        repeated = {key: n for key, n in kinds.items() if key in CREATE_MUTATIONS and n > 1}
        assert repeated == {}, f"{name}: create mutations done more than once: {repeated}"
        assert kinds[DESTROY] <= 1, f"{name}: destroyed {kinds[DESTROY]} times"
        first_delete = min((seq for seq, key in calls if key in DELETE_MUTATIONS), default=None)
        if first_delete is not None:
            late = [key for seq, key in calls if seq > first_delete and key in CREATE_MUTATIONS]
            assert late == [], f"{name}: create steps ran after its delete began: {late}"
    for name in keep:
        kinds = Counter(key for _, key in by_vm[f"proxy-{name}"])
        # The seed's release after boot (issue 11) may or may not have run yet: at most once.
        assert kinds.pop(SEED_EJECT, 0) <= 1 and kinds.pop(VOLUME_DELETE, 0) <= 1, name
        assert kinds == {CLONE: 1, UPLOAD: 1, CONFIG_PUT: 1, RESIZE: 1, START: 1}, name

    vms = {str(v.get("name")) for v in stack.sim.vms()}
    assert {f"proxy-{n}" for n in keep} <= vms
    assert {f"proxy-{n}" for n in drop} & vms == set()
    assert [v for _, v in stack.sim.seeds() if any(f"proxy-{n}_" in v for n in drop)] == []

    stack.manage("proxies", "delete", *keep)
    stack.wait_phase(keep, "Deleted", timeout=60)
