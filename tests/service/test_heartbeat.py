"""One renewer thread per process (issue 12): a block that holds a lease no longer starts and
joins a thread of its own, and every lease held is still renewed every third of its length
while its block runs, and never after it ends."""

from __future__ import annotations

import threading
import time

from provisioning.services.heartbeat import renewed


def _renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("renew", "lease-renewer"))]


def test_leases_held_together_are_renewed_on_their_own_periods_by_one_thread() -> None:
    beats: dict[str, list[float]] = {"short": [], "long": []}
    with renewed(lambda: beats["short"].append(time.monotonic()), every=0.1, name="short"):
        with renewed(lambda: beats["long"].append(time.monotonic()), every=0.35, name="long"):
            time.sleep(0.8)
        ended = time.monotonic()
        time.sleep(0.4)
    assert len(_renewers()) == 1, _renewers()
    assert len(beats["short"]) >= 5, beats  # every 0.1 s over 1.2 s
    assert 1 <= len(beats["long"]) <= 2, beats  # at 0.35 s and 0.7 s
    assert all(at <= ended for at in beats["long"]), (beats, ended)  # none after its block


def test_a_block_starts_no_thread_once_the_renewer_runs() -> None:
    with renewed(lambda: None, every=10.0, name="first"):
        pass
    before = {t.ident for t in _renewers()}
    for n in range(20):
        with renewed(lambda: None, every=10.0, name=f"step-{n}"):
            assert {t.ident for t in _renewers()} == before
    assert len(before) == 1


def test_a_renewal_under_way_ends_before_its_block_does() -> None:
    started, done = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.3)
        done.set()

    with renewed(slow, every=0.05, name="slow"):
        assert started.wait(2.0)
    assert done.is_set()


def test_a_failing_renewal_is_tried_again() -> None:
    tries: list[float] = []

    def failing() -> None:
        tries.append(time.monotonic())
        raise RuntimeError("database restarting")

    with renewed(failing, every=0.05, name="failing"):
        time.sleep(0.4)
    assert len(tries) >= 3, tries
