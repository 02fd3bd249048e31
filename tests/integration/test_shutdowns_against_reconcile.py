"""Twenty shutdowns raced against back-to-back reconcile rounds with a slow listing: all kept.

Issue 10, "How it is proven". Reconcile decides on a snapshot taken before a listing that may
take seconds; meanwhile the operator shuts proxies down. A round that acted on its snapshot would
start a VM the operator just stopped, or write back the old ``desired_power``. Reconcile's answer
(services/reconcile.py, "Decisions on fresh state") is to re-decide under the proxy's row lock
and drop any decision whose proxy moved since the snapshot.

Here the simulator holds every ``/cluster/resources`` answer back by two seconds, rounds of
``manage.py reconcile`` run back to back in a thread for the whole test, and twenty
``proxies shutdown`` requests go out in small batches at random moments. Afterwards every VM is
stopped in Proxmox, every proxy is ``Stopped`` with ``desired_power`` off, and the ledger shows no
start submitted for any of them, each VM shut down exactly once.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from itstack import SHUTDOWN, START, Stack, Worker, wait_until
from measured import Measure

pytestmark = pytest.mark.integration

COUNT = 20
PREFIX = "race-"
# Every listing is slow, the workers' too (a shutdown step lists the cluster before it acts), so
# two workers share the shutdowns.
LISTING_LATENCY = 2.0


@dataclass
class ReconcileLoop:
    """``manage.py reconcile`` back to back until stopped; counts the rounds that ran."""

    stack: Stack
    rounds: list[tuple[float, float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ReconcileLoop:
        self._thread = threading.Thread(target=self._run, name="reconcile-loop", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.time()
            done = self.stack.manage("reconcile", check=False)
            if done.returncode == 0:
                self.rounds.append((began, time.time(), done.stdout.strip()))
            else:
                self.failures.append(done.stderr[-2000:])

    def outcomes(self, since: float) -> Counter[str]:
        """What the rounds that ended after ``since`` did, summed ("busy 3, converged 17")."""
        total: Counter[str] = Counter()
        for _, end, out in self.rounds:
            if end > since and ":" in out:
                for part in out.split(":", 1)[1].split(","):
                    what, _, count = part.strip().rpartition(" ")
                    if count.isdigit():
                        total[what] += int(count)
        return total

    def completed_since(self, moment: float) -> int:
        return sum(began >= moment for began, _, _ in self.rounds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)


def test_twenty_shutdowns_raced_against_back_to_back_slow_reconcile_rounds_are_all_kept(
    stack: Stack, worker: Worker, second_worker: Worker, measure: Measure
) -> None:
    names = [f"{PREFIX}{i:02d}" for i in range(1, COUNT + 1)]
    stack.create_proxies(*names)
    stack.wait_phase(names, "Running", timeout=120)
    vmids = {int(row["vmid"]) for row in stack.proxies(PREFIX)}

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)  # the seed is in every failure message, to replay the moments
    stack.sim.control("latency", seconds=LISTING_LATENCY, method="GET", path="/cluster/resources")
    loop = ReconcileLoop(stack).start()
    try:
        wait_until(lambda: loop.rounds, timeout=60, what="a first slow reconcile round")
        before = stack.sim.last_seq()
        shutdowns_began = time.time()
        pending = rng.sample(names, k=len(names))
        while pending:
            size = rng.randint(2, 5)
            batch, pending = pending[:size], pending[size:]
            # A command takes a second or two itself; this spreads them over a round's phases.
            time.sleep(rng.uniform(0.0, LISTING_LATENCY / 2))
            stack.manage("proxies", "shutdown", *batch)
        stack.wait_phase(names, "Stopped", timeout=180)
        # A round that began once every VM was stopped has them stopped in its listing: the
        # case where a round that kept the operator's old wish would start them again.
        settled = time.time()
        wait_until(
            lambda: loop.completed_since(settled) >= 1,
            timeout=60,
            what="a whole reconcile round after the shutdowns",
        )
    finally:
        loop.stop()
        stack.sim.control("clear_faults")

    during = sum(end > shutdowns_began for _, end, _ in loop.rounds)
    # For the record: how often a round's decision met a proxy the operator had moved since its
    # snapshot ("changed": dropped) rather than one still busy with its shutdown ("busy").
    measure(
        "reconcile rounds overlapping the shutdowns",
        during,
        "rounds",
        seed=seed,
        outcomes=dict(loop.outcomes(shutdowns_began)),
    )
    assert during >= 4, f"only {during} reconcile rounds overlapped the shutdowns (seed {seed})"
    assert loop.failures == [] or all("lease" in f for f in loop.failures), loop.failures

    vms = {int(v["vmid"]): v for v in stack.sim.vms() if int(v["vmid"]) in vmids}
    assert {vmid: vm["status"] for vmid, vm in vms.items()} == dict.fromkeys(vmids, "stopped"), (
        f"seed {seed}"
    )
    rows = {row["name"]: row for row in stack.probe("proxies", PREFIX)}
    assert {n: (r["phase"], r["desiredPower"]) for n, r in rows.items()} == dict.fromkeys(
        names, ("Stopped", "off")
    ), f"seed {seed}"

    entries = stack.sim.ledger(after=before)
    started = [
        int(e["path_params"]["vmid"])
        for e in entries
        if e["key"] == START and e["mutation"] and int(e["path_params"]["vmid"]) in vmids
    ]
    assert started == [], f"starts submitted for proxies the operator shut down (seed {seed})"
    shut = Counter(
        int(e["path_params"]["vmid"]) for e in entries if e["key"] == SHUTDOWN and e["mutation"]
    )
    assert shut == dict.fromkeys(vmids, 1), f"one shutdown per VM (seed {seed})"
    journal = stack.probe("journal", PREFIX)
    assert Counter((op["kind"], op["state"]) for op in journal) == {
        ("create", "succeeded"): COUNT,
        ("shutdown", "succeeded"): COUNT,
    }, f"seed {seed}"

    stack.manage("proxies", "delete", *names)
    stack.wait_phase(names, "Deleted", timeout=120)
