"""The maintenance switch with a real worker over Redis (issue 14): creates asked for while the
cluster is in maintenance wait, visibly and without writing to Proxmox, and reach Running once
it is turned off, sent at once by the switch rather than by their re-check.

The re-check interval is set far beyond the test's timeouts, so only the switch turned off can
move the creates: a test that passed by waiting out the re-check would prove nothing.
"""

from __future__ import annotations

import pytest
from itstack import Stack, Worker, wait_until

pytestmark = pytest.mark.integration

PREFIX = "maint-"
NAMES = [f"{PREFIX}1", f"{PREFIX}2"]
SLOW_RECHECK = {"PROXYHUB_MAINTENANCE_RECHECK_SECONDS": "3600"}


def _creates(stack: Stack) -> list[dict]:
    return [op for op in stack.probe("journal", PREFIX) if op["kind"] == "create"]


def test_creates_wait_for_maintenance_write_nothing_and_run_once_it_is_off(
    stack: Stack, worker: Worker
) -> None:
    own = stack.worker("maint", env=SLOW_RECHECK)
    try:
        worker.stop()  # only the worker with the long re-check delivers steps here
        stack.manage(
            "maintenance", "on", "--cluster", "pvesim", "--reason", "rack move", env=SLOW_RECHECK
        )
        before = stack.sim.last_seq()
        stack.create_proxies(*NAMES)
        waiting = wait_until(
            lambda: (
                [
                    op
                    for op in _creates(stack)
                    if op["state"] == "waiting"
                    and op["lastError"].startswith("waiting for maintenance on cluster pvesim")
                ]
                if len(_creates(stack)) == 2
                else None
            ),
            timeout=60,
            interval=0.5,
            what="both creates waiting for maintenance",
        )
        assert len(waiting) == 2 and all("rack move" in op["lastError"] for op in waiting)
        assert all(op["attempts"] == 0 for op in waiting)
        assert [e for e in stack.sim.ledger(after=before) if e["mutation"]] == []

        listed = stack.manage_json("maintenance", "status", "--json")
        assert [(w["cluster"], w["node"]) for w in listed] == [("pvesim", "")]
        stack.manage("maintenance", "off", "--cluster", "pvesim")
        stack.wait_phase(NAMES, "Running", timeout=120)
        assert {op["state"] for op in _creates(stack)} == {"succeeded"}
        assert [e for e in stack.sim.ledger(after=before) if e["mutation"]]
    finally:
        stack.manage("maintenance", "off", "--cluster", "pvesim", check=False)
        own.stop()
