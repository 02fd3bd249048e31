"""The seam retries reads where the fault happened and flags mutations whose reply was lost
(issue 16), over the in-process simulator's own fault switches."""

from __future__ import annotations

import pytest

from provisioning.proxmox.api import Api, ReadRetry, reply_may_be_lost, retryable_read_failure
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import (
    ApiError,
    ConnectFailed,
    ReplyLost,
    RequestTimeout,
    classify,
)
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport

RESOURCES = "/cluster/resources"


@pytest.fixture
def engine() -> Simulator:
    return Simulator(profile="instant")


def _api(engine: Simulator, retries: int, sleeps: list[float]) -> Api:
    return Api(
        SimTransport(engine), reads=ReadRetry(retries=retries, pause=0.2), sleep=sleeps.append
    )


@pytest.mark.parametrize(
    ("kind", "paused"), [("500", True), ("595", False), ("596", False), ("reset", False)]
)
def test_a_read_meeting_a_transient_fault_is_sent_again(
    engine: Simulator, kind: str, paused: bool
) -> None:
    sleeps: list[float] = []
    engine.control.fail_call("GET", RESOURCES, kind=kind, times=2)
    assert _api(engine, 3, sleeps).cluster_resources()
    assert len(engine.ledger.calls("GET", f"GET {RESOURCES}")) == 3
    if paused:
        # Contention (500 "got timeout"): at once, then after a jittered pause from the upper
        # half of 0.2 s.
        assert len(sleeps) == 1 and 0.1 <= sleeps[0] <= 0.2
    else:
        assert sleeps == []  # a dropped connection or a 59x is simply sent again


def test_the_retries_are_bounded_and_the_last_failure_stands(engine: Simulator) -> None:
    sleeps: list[float] = []
    engine.control.fail_call("GET", RESOURCES, kind="500", times=10)
    with pytest.raises(ApiError) as failed:
        _api(engine, 3, sleeps).cluster_resources()
    assert failed.value.status == 500
    assert len(engine.ledger.calls("GET", f"GET {RESOURCES}")) == 4
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9  # the pause doubles, jittered


def test_a_read_is_not_retried_without_a_policy_or_past_its_deadline(engine: Simulator) -> None:
    engine.control.fail_call("GET", RESOURCES, kind="reset", times=10)
    with pytest.raises(ConnectFailed):
        _api(engine, 0, []).cluster_resources()
    assert len(engine.ledger.calls("GET", f"GET {RESOURCES}")) == 1
    engine.control.clear_faults()
    engine.control.fail_call("GET", RESOURCES, kind="500", times=10)
    with pytest.raises(ApiError):
        _api(engine, 3, []).cluster_resources(deadline=Deadline(0.05))
    # the first retry (no pause) fits the deadline; the paused ones do not
    assert len(engine.ledger.calls("GET", f"GET {RESOURCES}")) == 3


def test_a_refusal_or_a_missing_vm_is_not_retried(engine: Simulator) -> None:
    sleeps: list[float] = []
    api = _api(engine, 3, sleeps)
    with pytest.raises(ApiError):
        api.vm_config("pve1", 123456)  # does not exist: a fact, not a fault
    assert len(engine.ledger.calls("GET", "GET /nodes/{node}/qemu/{vmid}/config")) == 1


def test_a_mutation_is_never_repeated_and_its_lost_reply_is_flagged(engine: Simulator) -> None:
    engine.control.drop_reply("POST", "/nodes/{node}/qemu/{vmid}/clone")
    with pytest.raises(ReplyLost) as lost:
        _api(engine, 3, []).clone("pve1", 9000, newid=100500, name="proxy-x")
    assert len(engine.ledger.calls("POST", "POST /nodes/{node}/qemu/{vmid}/clone")) == 1
    error = classify("create", lost.value)
    assert error.kind == "transient" and error.reply_lost and error.unreachable


def test_a_mutation_refused_before_it_was_applied_is_not_a_lost_reply(engine: Simulator) -> None:
    engine.control.fail_call("POST", "/nodes/{node}/qemu/{vmid}/clone", kind="500")
    with pytest.raises(ApiError) as refused:
        _api(engine, 3, []).clone("pve1", 9000, newid=100501, name="proxy-y")
    assert not classify("create", refused.value).reply_lost


def test_which_failures_are_retried_and_which_lose_a_reply() -> None:
    assert retryable_read_failure(ConnectFailed("x"))
    assert retryable_read_failure(ApiError(500, "got timeout"))
    assert retryable_read_failure(ApiError(503, "Service Unavailable"))
    assert not retryable_read_failure(ApiError(500, "VM 1 does not exist"))
    assert not retryable_read_failure(ApiError(403, "Permission check failed"))
    assert not retryable_read_failure(RequestTimeout("slow"))  # it already spent its time
    assert reply_may_be_lost(ConnectFailed("reset"))
    assert not reply_may_be_lost(ConnectFailed("refused", before_send=True))
    assert reply_may_be_lost(RequestTimeout("read timed out"))
    assert reply_may_be_lost(ApiError(596, "Connection timed out"))
    assert not reply_may_be_lost(ApiError(595, "Connection refused"))
