"""Power actions (seed 001; DESIGN.md §5) over the in-process simulator.

Counts of what was sent to Proxmox come from the simulator's ledger, never from proxyhub.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from provider_world import GOOD_TEMPLATE, World, catalogue

from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import NotFoundError, PermanentError, TransientError
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.power_checks import PowerRequest
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.steps import StepResult
from tests.support.simtransport import sim_api

POWER = "POST /nodes/{node}/qemu/{vmid}/status/"
START, SHUTDOWN, REBOOT, STOP = (POWER + a for a in ("start", "shutdown", "reboot", "stop"))
KEY = {"start": START, "shutdown": SHUTDOWN, "reboot": REBOOT}
RESOURCES = "GET /cluster/resources"
WHEN = datetime(2026, 11, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Target:
    """A VM of ours, made by a real create."""

    vmid: int
    vm_name: str
    uid: str
    node: str

    def req(self, action: str) -> PowerRequest:
        return PowerRequest(action, self.vmid, self.vm_name, self.uid)  # type: ignore[arg-type]


@pytest.fixture
def ours(world: World) -> Target:
    return _create(world, "pw")


def _create(world: World, name: str) -> Target:
    req = world.request(name)
    done = world.create(req)
    assert done.status == "done", done.error
    world.settle()
    world.engine.ledger.clear()
    world.results.clear()
    return Target(int(str(done.provider_id).split("/")[1]), req.vm_name, req.uid, "pve1")


def _run(world: World, req: PowerRequest, provider: Provider | None = None) -> StepResult:
    p = provider or world.provider
    return world.drive(lambda pr: p.power_step(req, pr), p.new_power_progress())


def _status(world: World, t: Target) -> tuple[str, str]:
    status = world.api.vm_status(t.node, t.vmid)
    return status["status"], status["qmpstatus"]


def _stop_behind_our_back(world: World, t: Target) -> None:
    world.api.stop(t.node, t.vmid)
    world.engine.control.advance(5)
    world.engine.ledger.clear()


def _power_posts(world: World) -> list[str]:
    return [str(e.key) for e in world.engine.ledger.calls("POST") if str(e.key).startswith(POWER)]


# --- happy paths ------------------------------------------------------------------------


def test_shutdown_is_graceful_and_ends_stopped(world: World, ours: Target) -> None:
    result = _run(world, ours.req("shutdown"))

    assert result.status == "done", result.error
    assert _status(world, ours) == ("stopped", "stopped")
    [sent] = world.engine.ledger.calls("POST", SHUTDOWN)
    # DESIGN.md §5: 60 s, never forced; no stop is sent either.
    assert (sent.params["timeout"], sent.params["forceStop"]) == ("60", "0")
    assert _power_posts(world) == [SHUTDOWN]
    # The exact UPID is the receipt the journal keeps (seed 001).
    assert result.details == {
        "action": "shutdown",
        "vmid": ours.vmid,
        "node": "pve1",
        "upid": sent.upid,
        "noop": False,
    }
    assert [r.step for r in world.results][:2] == ["inspect", "submit"]
    assert world.results[-1].step == "settle"


def test_start_runs_a_stopped_vm(world: World, ours: Target) -> None:
    _stop_behind_our_back(world, ours)

    result = _run(world, ours.req("start"))

    assert result.status == "done", result.error
    assert _status(world, ours) == ("running", "running")
    assert _power_posts(world) == [START]
    assert ":qmstart:" in str(result.details["upid"])


def test_reboot_restarts_the_vm(world: World, ours: Target) -> None:
    booted = world.engine.control.vm(ours.vmid)["bootedAt"]

    result = _run(world, ours.req("reboot"))

    assert result.status == "done", result.error
    assert _status(world, ours) == ("running", "running")
    assert world.engine.control.vm(ours.vmid)["bootedAt"] > booted
    [sent] = world.engine.ledger.calls("POST", REBOOT)
    assert sent.params["timeout"] == "60"
    assert _power_posts(world) == [REBOOT]


def test_reboot_waits_through_the_moment_the_vm_reads_stopped(world: World, ours: Target) -> None:
    """On real Proxmox the restart after a reboot is a separate qmstart that runs after the
    qmreboot task ends, so status/current may read ``stopped`` in between (pve-reference
    §7.16). The machine waits for ``running`` instead of failing."""
    req = ours.req("reboot")
    progress = world.provider.new_power_progress()
    while progress["stage"] != "settle":
        progress = world.step(lambda p: world.provider.power_step(req, p), progress).progress
    world.api.stop(ours.node, ours.vmid)  # the gap between qmreboot's end and qmstart
    world.engine.control.advance(5)

    waiting = world.step(lambda p: world.provider.power_step(req, p), progress)
    assert waiting.status == "wait" and waiting.step == "settle"
    world.api.start(ours.node, ours.vmid)  # qmeventd's restart
    result = world.drive(lambda p: world.provider.power_step(req, p), waiting.progress)

    assert result.status == "done", result.error
    # One reboot; the machine itself sent nothing else (the stop and start were ours).
    assert _power_posts(world) == [REBOOT, STOP, START]


def test_blocking_power_with_real_time() -> None:
    api, engine = sim_api(profile="fast", time_scale=0.05)
    config = ProxmoxConfig.from_mapping(catalogue(), installation_id="inst-test")
    provider = Provider(api, config, budgets=Budgets(poll_interval=0.01))
    uid = str(uuid.uuid4())
    provider_id = provider.create(
        CreateRequest(uid, "proxy-blocking", "small", "debian-13", "pve1", b"#cloud-config\n"),
        deadline=Deadline(30),
    )
    vmid = int(provider_id.split("/")[1])
    engine.ledger.clear()

    for action, wanted in (("shutdown", "stopped"), ("start", "running"), ("reboot", "running")):
        req = PowerRequest.from_provider_id(action, provider_id, uid)  # type: ignore[arg-type]
        result = provider.power(req, deadline=Deadline(30))
        assert result.status == "done" and not result.details["noop"]
        assert engine.control.vm(vmid)["status"] == wanted
    assert [engine.ledger.count("POST", KEY[a]) for a in KEY] == [1, 1, 1]

    engine.control.set_lock(vmid, "backup")
    with pytest.raises(PermanentError, match=r"locked \(backup\)"):
        provider.power(PowerRequest("shutdown", vmid, "proxy-blocking", uid), deadline=Deadline(5))


# --- no-ops -------------------------------------------------------------------------------


def test_start_of_a_running_vm_is_skipped(world: World, ours: Target) -> None:
    preview = world.provider.inspect_power(ours.req("start"))
    assert preview.refusal is None
    assert preview.noop == f"VM {ours.vmid} (proxy-pw) on pve1 is already running; start skipped"

    result = _run(world, ours.req("start"))

    assert result.status == "done" and result.message == preview.noop
    assert result.details["noop"] is True
    assert world.engine.ledger.mutations() == []


def test_shutdown_of_a_stopped_vm_is_skipped(world: World, ours: Target) -> None:
    _stop_behind_our_back(world, ours)
    preview = world.provider.inspect_power(ours.req("shutdown"))
    assert preview.refusal is None and preview.status == "stopped"
    assert preview.noop is not None and "already stopped; shutdown skipped" in preview.noop

    result = _run(world, ours.req("shutdown"))

    assert result.status == "done" and result.details["noop"] is True
    assert world.engine.ledger.mutations() == []


# --- refusals (seed 001) -------------------------------------------------------------------


def _set_qmpstatus(state: str) -> Callable[[World, Target], None]:
    """The simulator has no control call for these QMP states (a guest-initiated S3 suspend,
    QEMU started with -S), so the guest's run state is set directly."""

    def setup(world: World, t: Target) -> None:
        with world.engine.lock:
            world.engine.cluster.guests[t.vmid].qmpstatus = state

    return setup


def _template(world: World, t: Target) -> None:
    _stop_behind_our_back(world, t)
    world.api.set_vm_config(t.node, t.vmid, {"template": 1})


REFUSALS: list[tuple[str, str, Callable[[World, Target], None], str]] = [
    (
        "locked",
        "shutdown",
        lambda w, t: w.engine.control.set_lock(t.vmid, "backup"),
        "is locked (backup). wait for the Proxmox task holding the lock to finish, or clear a "
        "stale lock with `qm unlock {vmid}`, then retry",
    ),
    (
        "hibernated",
        "start",
        lambda w, t: w.engine.control.hibernate_vm(t.vmid),
        "is hibernated (lock: suspended). resume it in Proxmox",
    ),
    (
        "paused",
        "shutdown",
        lambda w, t: w.engine.control.pause_vm(t.vmid),
        "is paused (QEMU runs, the guest does not). resume it in Proxmox (`qm resume {vmid}`)",
    ),
    (
        "start-of-paused",
        "start",
        lambda w, t: w.engine.control.pause_vm(t.vmid),
        "is paused (QEMU runs, the guest does not)",
    ),
    ("suspended", "reboot", _set_qmpstatus("suspended"), "is suspended (QEMU runs"),
    ("prelaunch", "shutdown", _set_qmpstatus("prelaunch"), "is prelaunch (QEMU runs"),
    (
        "pending-value",
        "reboot",
        lambda w, t: w.engine.control.add_pending(t.vmid, "cores", 4),
        "has pending configuration changes (cores). apply or revert them in Proxmox",
    ),
    (
        "pending-delete",
        "shutdown",
        lambda w, t: w.engine.control.add_pending(t.vmid, "tags", delete=True),
        "has pending configuration changes (tags)",
    ),
    (
        "hookscript",
        "shutdown",
        lambda w, t: w.engine.control.set_hookscript(t.vmid, "local:snippets/guard.pl"),
        "has a hook script (local:snippets/guard.pl). remove the hookscript option",
    ),
    (
        "ha-managed",
        "reboot",
        lambda w, t: w.engine.control.set_ha(t.vmid, True, "started"),
        "is managed by Proxmox HA (state started). power it through Proxmox HA",
    ),
    ("template", "start", _template, "is a template. templates are never powered"),
    (
        "reboot-of-stopped",
        "reboot",
        _stop_behind_our_back,
        "is stopped, so it cannot be rebooted (Proxmox: VM {vmid} not running). start it instead",
    ),
]


@pytest.mark.parametrize(
    ("action", "setup", "sentence"),
    [r[1:] for r in REFUSALS],
    ids=[r[0] for r in REFUSALS],
)
def test_refusal(
    world: World,
    ours: Target,
    action: str,
    setup: Callable[[World, Target], None],
    sentence: str,
) -> None:
    setup(world, ours)
    world.engine.ledger.clear()
    req = ours.req(action)

    preview = world.provider.inspect_power(req)
    result = _run(world, req)

    assert result.status == "error"
    assert isinstance(result.error, PermanentError)
    assert f"VM {ours.vmid} (proxy-pw) on pve1 " + sentence.format(vmid=ours.vmid) in str(
        result.error
    )
    # The confirmation page shows the very sentence the operation fails with.
    assert preview.refusal == str(result.error)
    assert preview.noop is None
    assert world.engine.ledger.mutations() == []


def test_ha_seen_in_the_listing_alone_is_refused(world: World, ours: Target) -> None:
    """``hastate`` exists only in /cluster/resources (pve-reference §7.9); a listing the caller
    already holds is used as is, with no second listing."""
    listing = world.api.cluster_resources()
    for entry in listing:
        if entry["vmid"] == ours.vmid:
            entry["hastate"] = "request_stop"
    world.engine.ledger.clear()

    preview = world.provider.inspect_power(ours.req("shutdown"), listing=listing)

    assert preview.refusal is not None
    assert "managed by Proxmox HA (state request_stop)" in preview.refusal
    assert world.engine.ledger.count("GET", RESOURCES) == 0


# --- the mark check --------------------------------------------------------------------------


def _foreign(world: World, vmid: int, name: str, description: str | None) -> None:
    world.api.clone("pve1", GOOD_TEMPLATE, newid=vmid, name=name, description=description)
    world.engine.control.advance(30)
    world.api.start("pve1", vmid)
    world.engine.control.advance(30)
    world.engine.ledger.clear()


OTHER_UID = str(uuid.uuid4())
NOT_OURS = [
    ("no-mark", "proxy-pw", None, "carries no proxyhub mark"),
    (
        "other-proxy",
        "proxy-pw",
        render_mark(OTHER_UID, WHEN, "inst-test"),
        f"belongs to proxy uid {OTHER_UID}",
    ),
    (
        "vmid-reused",
        "newcomer",
        render_mark(OTHER_UID, WHEN, "inst-test"),
        "is named 'newcomer', not proxy-pw: its VMID was reused",
    ),
]


@pytest.mark.parametrize(
    ("name", "description", "why"), [r[1:] for r in NOT_OURS], ids=[r[0] for r in NOT_OURS]
)
def test_a_vm_that_is_not_ours_is_refused(
    world: World, name: str, description: str | None, why: str
) -> None:
    _foreign(world, 150020, name, description)
    req = PowerRequest("shutdown", 150020, "proxy-pw", world.request("pw").uid)

    preview = world.provider.inspect_power(req)
    result = _run(world, req)

    assert isinstance(result.error, PermanentError)
    assert why in result.error.message
    assert "proxyhub powers only the VMs it created" in result.error.remediation
    assert preview.refusal == str(result.error) and preview.name == name
    assert world.engine.ledger.mutations() == []
    assert _status(world, Target(150020, name, "", "pve1"))[0] == "running"


def test_a_container_at_the_vmid_is_refused(world: World) -> None:
    result = _run(world, PowerRequest("shutdown", 200, "proxy-pw", "u"))

    assert isinstance(result.error, PermanentError)
    assert "VMID 200 holds a lxc guest, not proxy-pw" in result.error.message
    assert world.engine.ledger.mutations() == []


def test_refusals_are_checked_again_right_before_dispatch(world: World, ours: Target) -> None:
    """The intent is recorded first; between it and the dispatch the VM may change hands."""
    req = ours.req("shutdown")
    intent = world.step(
        lambda p: world.provider.power_step(req, p), world.provider.new_power_progress()
    )
    assert intent.status == "continue" and intent.progress["stage"] == "submit"
    world.engine.control.set_ha(ours.vmid, True, "started")

    result = world.step(lambda p: world.provider.power_step(req, p), intent.progress)

    assert isinstance(result.error, PermanentError)
    assert "managed by Proxmox HA" in result.error.message
    assert world.engine.ledger.mutations() == []


def test_a_vanished_vm_is_not_found(world: World, ours: Target) -> None:
    req = PowerRequest("start", 150999, "proxy-gone", "u")
    with pytest.raises(NotFoundError):
        world.provider.inspect_power(req)
    result = _run(world, req)
    assert isinstance(result.error, NotFoundError)


def test_a_vm_on_a_node_that_does_not_answer_is_transient(world: World, ours: Target) -> None:
    world.engine.control.node_offline("pve1")
    result = _run(world, ours.req("shutdown"))
    assert isinstance(result.error, TransientError)
    assert world.engine.ledger.mutations() == []


# --- receipts: lost replies and failed tasks (seed 001) ---------------------------------------


@pytest.mark.parametrize("finished_meanwhile", [False, True], ids=["task-running", "task-ended"])
@pytest.mark.parametrize("action", ["start", "shutdown", "reboot"])
def test_lost_reply_is_read_back_never_resubmitted(
    world: World, ours: Target, action: str, finished_meanwhile: bool
) -> None:
    """The POST reaches Proxmox and its task starts, but the reply is lost with the worker.
    A fresh worker resuming from the record finds that task as the receipt, whether it still
    runs or has already ended, and submits nothing again."""
    if action == "start":
        _stop_behind_our_back(world, ours)
    world.engine.control.drop_reply("POST", KEY[action].split(" ", 1)[1])
    req = ours.req(action)
    progress = world.provider.new_power_progress()
    lost = world.step(lambda p: world.provider.power_step(req, p), progress)
    while lost.status == "continue":
        lost = world.step(lambda p: world.provider.power_step(req, p), lost.progress)
    assert lost.step == "submit" and isinstance(lost.error, TransientError)
    if finished_meanwhile:
        world.engine.control.advance(30)

    result = _run_from(world, req, lost.progress)

    assert result.status == "done", result.error
    assert world.engine.ledger.count("POST", KEY[action]) == 1
    assert _power_posts(world) == [KEY[action]]
    expected = ("stopped", "stopped") if action == "shutdown" else ("running", "running")
    assert _status(world, ours) == expected
    [sent] = world.engine.ledger.calls("POST", KEY[action])
    assert result.details["upid"] == sent.upid


def _run_from(world: World, req: PowerRequest, progress: dict[str, object]) -> StepResult:
    fresh = world.fresh_provider()
    return world.drive(lambda p: fresh.power_step(req, p), progress)


def test_a_recorded_receipt_is_only_polled(world: World, ours: Target) -> None:
    req = ours.req("shutdown")
    progress = world.provider.new_power_progress()
    while progress["stage"] != "wait":
        progress = world.step(lambda p: world.provider.power_step(req, p), progress).progress
    upid = progress["upid"]
    assert progress["receipt"] == upid

    # Replayed twice by fresh workers from the same record.
    for _ in range(2):
        assert _run_from(world, req, progress).status == "done"

    assert world.engine.ledger.count("POST", SHUTDOWN) == 1


def test_shutdown_timeout_ends_the_action_and_forces_nothing(world: World, ours: Target) -> None:
    """The guest ignores the powerdown: Proxmox ends the task with its timeout error after the
    60 s and, without forceStop, leaves the VM running (pve-reference §3.2, §7.16). Seed 001:
    a stopped task with an error is failed and not retried."""
    world.engine.control.fail_next_task("qmshutdown", "VM quit/powerdown failed - got timeout")

    result = _run(world, ours.req("shutdown"))

    assert result.status == "error" and isinstance(result.error, PermanentError)
    assert result.error.op == "power"
    assert result.error.message == (
        f"VM {ours.vmid} (proxy-pw) did not power off within 60 s of the graceful shutdown "
        "(Proxmox: VM quit/powerdown failed - got timeout)"
    )
    assert "nothing was forced, so the VM still runs" in result.error.remediation
    assert _status(world, ours) == ("running", "running")
    assert _power_posts(world) == [SHUTDOWN]
    # The failed receipt stays the record: nothing leads to a second submission.
    assert result.progress["stage"] == "wait" and result.progress["upid"] == result.upid
    again = _run_from(world, ours.req("shutdown"), result.progress)
    assert again.status == "error" and isinstance(again.error, PermanentError)
    assert world.engine.ledger.count("POST", SHUTDOWN) == 1


def test_a_failed_start_task_ends_the_action_with_its_exit_status(
    world: World, ours: Target
) -> None:
    _stop_behind_our_back(world, ours)
    world.engine.control.fail_next_task("qmstart", "start failed: QEMU exited with code 1")

    result = _run(world, ours.req("start"))

    assert isinstance(result.error, PermanentError)
    assert "start failed: QEMU exited with code 1" in result.error.message
    assert _status(world, ours)[0] == "stopped"
    assert world.engine.ledger.count("POST", "/nodes/{node}/qemu/{vmid}/status/start") == 1


# --- the request ----------------------------------------------------------------------------


def test_request_from_provider_id() -> None:
    req = PowerRequest.from_provider_id("reboot", "vms/150001/proxy-a", "u-1")
    assert (req.action, req.vmid, req.vm_name, req.uid) == ("reboot", 150001, "proxy-a", "u-1")
    with pytest.raises(PermanentError):
        PowerRequest.from_provider_id("start", "vms/01/proxy-a")
    with pytest.raises(ValueError, match="power action"):
        PowerRequest("stop", 150001, "proxy-a")  # type: ignore[arg-type]
