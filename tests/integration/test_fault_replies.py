"""Transient faults are settled where they happen, with a real worker over HTTPS (issue 16).

The HTTPS simulator applies a mutation and then drops the connection (its reply is lost) on the
clone, the upload and the start of a create, and on the stop and destroy of a delete; and it
resets one read after another of a create. Counted from the simulator's ledger: each mutation
was accepted once (the step read back what Proxmox held instead of sending it again), and the
journal shows no failed delivery (the faults were absorbed in the deliveries that met them).
"""

from __future__ import annotations

from collections import Counter

import pytest
from itstack import CLONE, DESTROY, START, STOP, UPLOAD, Stack, Worker

pytestmark = pytest.mark.integration

PLACEMENT = ("--cluster", "pvesim", "--machine-type", "small", "--image", "debian-13")


def _path(key: str) -> str:
    return key.split(" ", 1)[1]


def _accepted(stack: Stack, after: int, key: str) -> int:
    return sum(e["status"] == 200 for e in stack.sim.ledger(after=after, key=key))


def _journal(stack: Stack, prefix: str) -> list[dict[str, object]]:
    return list(stack.probe("journal", prefix))


def test_lost_replies_of_every_mutation_are_read_back_not_sent_again(
    stack: Stack, worker: Worker
) -> None:
    """One lost reply per mutation. (A create whose clone reply AND upload reply are both lost
    uploads its seed a second time: with the clone adopted, the node's time of the clone is not
    known, so the read-back cannot tell our seed from a stale one of an earlier proxy, and the
    upload overwrites with the same bytes, as seed 000 entry 5 allows.)"""
    for name, lost in (("fr-1", (CLONE, START)), ("fr-2", (UPLOAD,))):
        before = stack.sim.last_seq()
        for key in lost:
            method, path = key.split(" ", 1)
            stack.sim.control("drop_reply", method=method, path=path, nth=1)
        stack.manage("proxies", "create", name, *PLACEMENT, "--zone", "pve1")
        stack.wait_phase([name], "Running", timeout=90)
        stack.sim.control("clear_faults")
        for key in (CLONE, UPLOAD, START):
            assert _accepted(stack, before, key) == 1, (name, key)
        dropped = [e for e in stack.sim.ledger(after=before) if e.get("fault") == "drop"]
        assert len(dropped) == len(lost)

    before = stack.sim.last_seq()
    for key in (STOP, DESTROY):
        method, path = key.split(" ", 1)
        stack.sim.control("drop_reply", method=method, path=path, nth=1)
    stack.manage("proxies", "delete", "fr-1")
    stack.wait_phase(["fr-1"], "Deleted", timeout=90)
    stack.sim.control("clear_faults")
    for key in (STOP, DESTROY):
        assert _accepted(stack, before, key) == 1, key
    stack.manage("proxies", "delete", "fr-2")
    stack.wait_phase(["fr-2"], "Deleted", timeout=90)
    ops = _journal(stack, "fr-")
    assert Counter((op["kind"], op["state"]) for op in ops) == {
        ("create", "succeeded"): 2,
        ("delete", "succeeded"): 2,
    }
    assert all(op.get("faults", 0) == 0 for op in ops), [
        (op["proxyName"], op["kind"], op.get("faults"), op["lastError"], op["steps"]) for op in ops
    ]


@pytest.mark.parametrize("nth", [1, 2, 3, 4])
def test_a_create_meeting_a_reset_read_after_read_completes_without_a_failed_delivery(
    stack: Stack, worker: Worker, nth: int
) -> None:
    name = f"fg-{nth}"
    before = stack.sim.last_seq()
    stack.sim.control("fail_call", method="GET", path=None, nth=nth, kind="reset")
    stack.manage("proxies", "create", name, *PLACEMENT, "--zone", "pve1")
    stack.wait_phase([name], "Running", timeout=90)
    stack.sim.control("clear_faults")
    assert _accepted(stack, before, CLONE) == 1
    (op,) = _journal(stack, name)
    assert op["state"] == "succeeded" and op.get("faults", 0) == 0, op
    stack.manage("proxies", "delete", name)
    stack.wait_phase([name], "Deleted", timeout=60)
