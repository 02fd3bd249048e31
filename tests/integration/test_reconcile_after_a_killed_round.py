"""Reconcile runs again soon after its worker is killed in the middle of a round.

A round's job lease is short and renewed while the round runs (``leases.job_lease``); a worker
killed mid-round stops renewing it, so the lease lapses within ``PROXYHUB_JOB_LEASE_SECONDS``
(30 s) and the next Beat run reconciles again. (Before, the lease was sized to outlast the
round, 360 s, and nothing renewed or freed it: a kill stopped reconcile for six minutes. This
tier first met that as three tests failing after a worker was killed during a Beat round.)

Here one proxy runs, Beat reconciles every 5 s, and the simulator holds every
``/cluster/resources`` answer back 5 s, so a round is in its listing when the ledger shows that
listing; the worker is killed then and started again. Its proxy's VM is then stopped behind
proxyhub's back, and reconcile must start it again within 45 s of the kill: with Beat
reconciling every 5 s, that leaves a lease as long as a step claim (20 s) plenty of room.
"""

from __future__ import annotations

import time

import pytest
from itstack import START, Beat, Stack, Worker, wait_until

pytestmark = pytest.mark.integration

NAME = "kr-1"
BOUND_SECONDS = 45.0
LISTING = "/cluster/resources"


def test_reconcile_runs_again_within_45_s_of_a_worker_killed_mid_round(
    stack: Stack, worker: Worker, beat: Beat
) -> None:
    stack.create_proxies(NAME)
    stack.wait_phase([NAME], "Running", timeout=90)
    row = stack.proxies(NAME)[0]

    before = stack.sim.last_seq()
    stack.sim.control("latency", seconds=5, method="GET", path=LISTING)
    try:
        wait_until(
            lambda: stack.sim.ledger(after=before, key=f"GET {LISTING}"),
            timeout=30,
            interval=0.05,
            what="a reconcile round listing the cluster",
        )
        worker.kill()
        killed = time.time()
    finally:
        stack.sim.control("clear_faults")
    worker.start()

    stopped = stack.sim.last_seq()
    upid = stack.sim.api("POST", f"/nodes/{row['node']}/qemu/{row['vmid']}/status/stop")
    assert stack.sim.wait_task(upid) == "OK"

    def started_again() -> bool:
        starts = stack.sim.ledger(after=stopped, key=START)
        return any(e["mutation"] and int(e["path_params"]["vmid"]) == row["vmid"] for e in starts)

    wait_until(
        started_again,
        timeout=max(1.0, BOUND_SECONDS - (time.time() - killed)),
        interval=0.5,
        what="reconcile starting the VM stopped out of band",
    )
    stack.wait_phase([NAME], "Running", timeout=60)

    stack.manage("proxies", "delete", NAME)
    stack.wait_phase([NAME], "Deleted", timeout=60)
