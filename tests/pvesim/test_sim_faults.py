"""Injected faults, as a client on the other side of the seam experiences them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.deadline import Cancelled, Deadline, DeadlineExceeded
from provisioning.proxmox.errors import (
    ApiError,
    ConnectFailed,
    ProxmoxError,
    ReplyLost,
    RequestTimeout,
)
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport

CLONE = "/nodes/{node}/qemu/{vmid}/clone"
RESOURCES = "/cluster/resources"


def test_kind_500_is_a_lock_timeout_and_changes_nothing(
    engine: Simulator, api: Api, api_error: Any
) -> None:
    engine.control.fail_call("POST", CLONE, kind="500")
    err = api_error(lambda: api.clone("pve1", 9000, newid=100300, name="proxy-a"))
    assert (err.status, err.message) == (
        500,
        "can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout",
    )
    assert 100300 not in {e["vmid"] for e in api.cluster_resources()}
    assert engine.ledger.mutations() == []


@pytest.mark.parametrize(
    ("kind", "reason"), [("595", "Connection refused"), ("596", "Connection timed out")]
)
def test_proxy_errors_have_an_empty_body_and_the_reason_as_message(
    engine: Simulator, api: Api, api_error: Any, kind: str, reason: str
) -> None:
    engine.control.fail_call("GET", RESOURCES, kind=kind)
    err = api_error(api.cluster_resources)
    assert (err.status, err.message, err.errors) == (int(kind), reason, {})
    assert api.cluster_resources()  # only the first matching call fails


def test_reset_raises_connect_failed_without_applying(engine: Simulator, api: Api) -> None:
    engine.control.fail_call("POST", CLONE, kind="reset")
    # The client cannot tell a reset before the work from one after it: the reply is lost.
    with pytest.raises(ReplyLost) as raised:
        api.clone("pve1", 9000, newid=100301, name="proxy-a")
    assert isinstance(raised.value.cause, ConnectFailed)
    assert 100301 not in {e["vmid"] for e in api.cluster_resources()}


def test_a_dropped_reply_hides_a_mutation_that_happened(engine: Simulator, api: Api) -> None:
    engine.control.drop_reply("POST", CLONE)
    with pytest.raises(ReplyLost) as raised:
        api.clone("pve1", 9000, newid=100302, name="proxy-dropped")
    assert isinstance(raised.value.cause, ConnectFailed)
    entries = {e["vmid"]: e for e in api.cluster_resources()}
    assert entries[100302]["name"] == "proxy-dropped"
    [call] = engine.ledger.calls("POST", CLONE)
    assert call.mutation and call.fault == "drop" and call.status == 200
    assert call.upid is not None and ":qmclone:9000:" in call.upid


def test_stall_waits_for_the_request_timeout_then_times_out(engine: Simulator) -> None:
    api = Api(SimTransport(engine, request_timeout=0.05))
    engine.control.fail_call("GET", RESOURCES, kind="stall")
    started = time.monotonic()
    with pytest.raises(RequestTimeout):
        api.cluster_resources()
    assert 0.04 <= time.monotonic() - started < 1.0


def test_stall_ends_early_when_the_caller_cancels(engine: Simulator) -> None:
    api = Api(SimTransport(engine, request_timeout=30))
    engine.control.fail_call("GET", RESOURCES, kind="stall")
    deadline = Deadline(30)
    threading.Timer(0.05, deadline.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        api.cluster_resources(deadline=deadline)
    assert time.monotonic() - started < 1.0


def test_latency_holds_the_answer_and_respects_the_deadline(engine: Simulator, api: Api) -> None:
    engine.control.latency(0.05, "GET", RESOURCES)
    started = time.monotonic()
    api.cluster_resources()
    assert time.monotonic() - started >= 0.045
    engine.control.latency(5, "GET", RESOURCES)
    with pytest.raises(DeadlineExceeded):
        api.cluster_resources(deadline=Deadline(0.05))


def test_a_custom_status_and_message(engine: Simulator, api: Api, api_error: Any) -> None:
    engine.control.fail_call(
        "GET", "/nodes/{node}/status", kind="status", status=500, message="pvestatd is down"
    )
    err = api_error(lambda: api.node_status("pve1"))
    assert (err.status, err.message) == (500, "pvestatd is down")


def test_the_nth_call_fails_and_times_counts_on(engine: Simulator, api: Api) -> None:
    engine.control.fail_call("GET", RESOURCES, nth=2, times=2, kind="595")
    outcomes = []
    for _ in range(5):
        try:
            api.cluster_resources()
            outcomes.append("ok")
        except ProxmoxError:
            outcomes.append("fail")
    assert outcomes == ["ok", "fail", "fail", "ok", "ok"]


def test_a_rule_without_method_and_path_matches_every_call(engine: Simulator, api: Api) -> None:
    engine.control.fail_call(None, None, nth=1, kind="596")
    with pytest.raises(ApiError):
        api.version()
    assert api.version()


def _pattern(seed: int) -> list[bool]:
    engine = Simulator(profile="instant", seed=seed, token_secret="s")
    api = Api(SimTransport(engine))
    engine.control.error_rate(0.3, kind="595", method="GET", path=RESOURCES)
    failed = []
    for _ in range(40):
        try:
            api.cluster_resources()
            failed.append(False)
        except ProxmoxError:
            failed.append(True)
    return failed


def test_error_rates_are_seeded() -> None:
    first, again, other = _pattern(7), _pattern(7), _pattern(8)
    assert first == again
    assert first != other
    assert 4 <= sum(first) <= 20


def test_clear_faults_removes_every_rule(engine: Simulator, api: Api) -> None:
    engine.control.error_rate(1.0, kind="595")
    engine.control.latency(1.0)
    engine.control.clear_faults()
    assert api.version()["version"]
    assert engine.control.faults() == []
