"""Requests per create, seed release and delete, counted by the simulator's ledger (issue 12).

The warm path a worker runs when each step follows the record the same process just wrote
(``steps.Tickets``): ``realistic`` timings at ``time_scale`` 0.1 (the benchmark suite's), the
default budgets (``Budgets()``: task and status polls every 1 s) and the service's default
address poll (``PROXYHUB_ADDRESS_POLL_SECONDS``, 3 s, as ``services/runners.py`` drives it:
``observe_boot``, else ``get``). The counts are exact so that a read coming back fails here.

Waits are planned from learned durations (``waits.py``), as a worker's are once its first creates
have finished: three whole lifecycles teach the estimates, and the fourth is counted. A cold
first create polls more (``test_waits.py`` shows it converging).
"""

from __future__ import annotations

import uuid
from collections import Counter

from provider_world import INSTALLATION, catalogue

from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.delete import DeleteRequest
from provisioning.proxmox.provider import Provider
from provisioning.proxmox.release import ReleaseRequest
from provisioning.proxmox.steps import TIMING, Progress, StepResult
from provisioning.proxmox.waits import BOOT, InMemoryDurations, Timing, next_wait
from pvesim.clock import ManualClock
from pvesim.simulator import Simulator
from tests.support.simtransport import sim_api

ADDRESS_POLL = 3.0  # the service's default PROXYHUB_ADDRESS_POLL_SECONDS
ADDRESS_BUDGET = 900.0  # and PROXYHUB_ADDRESS_BUDGET_SECONDS
AGENT = "GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"
TASK = "GET /nodes/{node}/tasks/{upid}/status"
STATUS = "GET /nodes/{node}/qemu/{vmid}/status/current"


def _drive(
    engine: Simulator, durations: InMemoryDurations, step: object, progress: Progress
) -> StepResult:
    while True:
        result: StepResult = step(progress)  # type: ignore[operator]
        progress = result.progress
        if TIMING in result.details:  # what the service's driver learns from a finished wait
            durations.learn(Timing.from_dict(result.details[TIMING]))
        if result.status == "wait":
            engine.control.advance(result.delay)
        if result.status in ("done", "error"):
            assert result.status == "done", result.error
            return result


def _look_after(expected: float | None, waited: float) -> float:
    return next_wait(expected=expected, elapsed=waited, cap=ADDRESS_POLL, limit=ADDRESS_BUDGET)


Learned = tuple[Simulator, Provider, InMemoryDurations]


def _learned() -> Learned:
    """A world whose estimates three lifecycles on ``pve1`` taught (the same each time)."""
    clock = ManualClock(start=1_800_000_000.0)
    api, engine = sim_api(profile="realistic", time_scale=0.1, clock=clock)
    config = ProxmoxConfig.from_mapping(catalogue(), installation_id=INSTALLATION)
    durations = InMemoryDurations()
    provider = Provider(api, config, budgets=Budgets(), clock=clock, durations=durations)
    for name in ("learn-1", "learn-2", "learn-3"):
        _lifecycle(engine, provider, durations, name)
    return engine, provider, durations


def _counted(zone: str = "pve1") -> dict[str, Counter[str]]:
    return _lifecycle(*_learned(), "counted", zone=zone)


def _counted_after_a_short_start_estimate() -> dict[str, Counter[str]]:
    """As ``_counted``, after a start whose first look, 50 ms after it, found the VM running:
    the estimate probes down (``waits.PROBE_DOWN``) to less than the 0.1 s a start takes."""
    engine, provider, durations = _learned()
    durations.learn(Timing(kind="qmstart", scope="pve1", seen_running=0.0, seen_done=0.05))
    return _lifecycle(engine, provider, durations, "counted")


def _lifecycle(
    engine: Simulator,
    provider: Provider,
    durations: InMemoryDurations,
    name: str,
    zone: str = "pve1",
) -> dict[str, Counter[str]]:
    req = CreateRequest(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        vm_name=f"proxy-{name}",
        machine_type="small",  # 10 GiB on a 3 GiB template: the resize runs
        image="debian-13",
        zone=zone,
        cloud_init=b"#cloud-config\n",
    )
    phases: dict[str, Counter[str]] = {}
    seen = len(engine.ledger.calls())

    def close(phase: str) -> None:
        nonlocal seen
        calls = engine.ledger.calls()
        phases[phase] = Counter(str(e.key) for e in calls[seen:])
        seen = len(calls)

    created = _drive(
        engine, durations, lambda p: provider.create_step(req, p), provider.new_create_progress()
    )
    record, pid = created.progress, str(created.provider_id)
    # The address wait as ``services/runners.py`` plans it: with a boot estimate, the first look
    # waits for the expected boot; then looks double up to the address poll. The boot's timing
    # is learned in planned time, as the driver learns it.
    expected = durations.expected(BOOT, req.image)
    waited = 0.0 if expected is None else _look_after(expected, 0.0)
    engine.control.advance(waited)
    seen_running = 0.0
    while True:
        instance = provider.observe_boot(pid, record, uid=req.uid) or provider.get(
            pid, node=str(record["node"])
        )
        if instance.state == "Running":
            break
        seen_running = waited
        delay = _look_after(durations.expected(BOOT, req.image), waited)
        engine.control.advance(delay)
        waited += delay
    durations.learn(Timing(kind=BOOT, scope=req.image, seen_running=seen_running, seen_done=waited))
    close("create")
    release = ReleaseRequest(req.vm_name, req.uid, int(record["vmid"]), zone, zone)
    _drive(
        engine,
        durations,
        lambda p: provider.release_seed_step(release, p),
        provider.new_release_progress(),
    )
    close("release")
    delete = DeleteRequest.from_provider_id(pid, req.uid)
    _drive(
        engine, durations, lambda p: provider.delete_step(delete, p), provider.new_delete_progress()
    )
    close("delete")
    return phases


PHASES = _counted()
ELSEWHERE = _counted(zone="pve2")
EARLY_START = _counted_after_a_short_start_estimate()


def _mutations(calls: Counter[str]) -> int:
    return sum(n for key, n in calls.items() if not key.startswith("GET "))


def test_a_create_reaches_running_in_13_requests_polls_included() -> None:
    calls = PHASES["create"]
    assert sum(calls.values()) == 13 <= 15, calls
    assert _mutations(calls) == 5  # clone, upload, the config write, resize, start
    # Polls: one per task (clone, upload, resize: each waited for its expected time, then read
    # once), one look at the VM's status for the start (at the start's expected end: the look
    # that finds the VM running ends the wait and teaches the start's duration, so its task is
    # not read), and one look at the agent after the image's expected boot.
    assert (calls[TASK], calls[STATUS], calls[AGENT]) == (3, 1, 1), calls
    # The other reads: the listing, the template's config, the clone's config before the write.
    assert calls["GET /cluster/resources"] == 1
    assert calls["GET /nodes/{node}/qemu/{vmid}/config"] == 2
    assert calls["GET /cluster/nextid"] == calls["GET /nodes/{node}/tasks"] == 0


def test_a_start_looked_at_too_soon_costs_one_more_status_read_not_three() -> None:
    # The estimate probing down (waits.py) plans the start's first look before the VM runs. That
    # look waits again without reading the start task (a failed start is read at the next
    # look); the next finds the VM running. It read the task and the status once more before.
    calls = EARLY_START["create"]
    assert sum(calls.values()) == 14, calls
    assert (calls[TASK], calls[STATUS], calls[AGENT]) == (3, 2, 1), calls


def test_a_node_where_nothing_ran_yet_plans_its_waits_from_the_other_nodes() -> None:
    # The same estimates, learned on pve1; the create goes to pve2, where no upload, resize or
    # start ran yet (the clone runs on the template's node, pve1). Each of those waits plans its
    # first look from pve1's estimate instead of looking 50 ms after the submission, so the
    # create and the seed's release cost what they cost on pve1, read for read. (The delete
    # then plans from pve2's own first samples, which the release began to teach.)
    assert ELSEWHERE["create"] == PHASES["create"], ELSEWHERE["create"]
    assert ELSEWHERE["release"] == PHASES["release"], ELSEWHERE["release"]


def test_the_seed_release_after_boot_costs_four_requests_and_at_most_one_early_look() -> None:
    calls = PHASES["release"]
    assert _mutations(calls) == 2  # the eject and the volume delete
    assert calls["GET /nodes/{node}/qemu/{vmid}/config"] == 1
    # One read of the volume delete's task, or two when the estimate has probed down below
    # the task (waits.PROBE_DOWN: a right estimate drifts down until a first look comes early,
    # which here, the fourth delete of its kind, it does).
    assert calls[TASK] in (1, 2), calls
    assert sum(calls.values()) == 3 + calls[TASK], calls


def test_a_delete_of_a_running_vm_costs_ten_requests() -> None:
    calls = PHASES["delete"]
    assert sum(calls.values()) == 10, calls
    assert _mutations(calls) == 3  # stop, destroy, seed delete
    assert calls[TASK] == 3
    # The listing, then the config before each of stop and destroy (a reused VMID is never
    # touched, CAPMOX #856): those stay; the status and task-list reads went.
    assert calls["GET /cluster/resources"] == 1
    assert calls["GET /nodes/{node}/qemu/{vmid}/config"] == 3
    assert calls[STATUS] == calls["GET /nodes/{node}/tasks"] == 0
