"""The crash-point matrix: a worker killed at every step boundary of a create and of a delete
(reliability.md §5, Reliability item 1; issue 10, "How it is proven").

Create: F1 to F12, one per step boundary of seed 000 entry 10 and DESIGN §5, F13 to F15 for
the seed's release after the address (issue 11), and F16 for a create whose VM was destroyed
outside proxyhub before the worker died (found by the state machine; the operator's delete
follows it). Delete: D1 to D6, entry 11. Each test kills the worker at its point, then
recovers the way production does and no other way: the dead delivery's claim expires,
``operations_sweep`` sends the step again, and the deliveries that follow read back what
Proxmox holds before they act. No operator acts (but F16's delete).

A kill is ``WorkerKilled``, a ``BaseException`` that nothing in proxyhub catches, raised at one
of four seams:

* ``before_call``: just before a request reaches Proxmox;
* ``after_call``: just after Proxmox answered, before proxyhub reads the answer (with
  ``drop_reply``: the mutation is applied and its reply lost);
* ``before_commit``: the step ran and its journal transaction is rolled back, as a dead
  connection's is, so nothing the step learned is recorded;
* ``after_commit``: the journal committed, and the next step's message was never sent.

The delivery stops right there, as after ``os._exit``: a kill inside a delivery leaves its claim
held, and the message it held is gone (the pump popped it and holds no other).

Pass, from the simulator's VMs, marks and ledger: exactly one VM per live proxy by mark UID and
none for a deleted one; no foreign VM touched (one squats on the proxy's first VMID, so the
lookup must walk past it); at most one successful clone per proxy and never a clone for a VMID
already holding our VM; no mutation sent twice, so none whose UPID was journalled; the proxy's
seed ISO gone once its guest has an address (released, issue 11), and with
``PROXYHUB_KEEP_SEED_ISO`` (the delete flows) kept while it lives (its CD-ROM) and gone once it
is deleted. From the journal: every
operation terminal, ours ``succeeded``, the proxy ``Running`` with an address or gone, and no
operation but the ones the test started (the recovery needed no operator).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID

import pytest
from django.conf import settings
from django.db import transaction
from pump import Pump, Sim, seed_volid_of, task_ended

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import ACTIVE_STATES, OperationState, Phase
from provisioning.proxmox.ids import canonical_uid, vmid_for
from provisioning.proxmox.marks import parse_mark
from provisioning.services import dispatch, driver, operations
from provisioning.services.installation import installation_id
from provisioning.services.operations import ProxySpec
from provisioning.services.runners import Outcome
from provisioning.services.sweeper import operations_sweep
from pvesim.ledger import LedgerEntry
from pvesim.profiles import Profile

pytestmark = pytest.mark.django_db

RESOURCES = "/cluster/resources"
CLONE = "/nodes/{node}/qemu/{vmid}/clone"
UPLOAD = "/nodes/{node}/storage/{storage}/upload"
CONFIG = "/nodes/{node}/qemu/{vmid}/config"
RESIZE = "/nodes/{node}/qemu/{vmid}/resize"
START = "/nodes/{node}/qemu/{vmid}/status/start"
STOP = "/nodes/{node}/qemu/{vmid}/status/stop"
DESTROY = "/nodes/{node}/qemu/{vmid}"
VOLUME = "/nodes/{node}/storage/{storage}/content/{volume}"

NODES = ("pve1", "pve2", "pve3")
SEEDS = "proxy-seeds"
# The shortest claim the policy allows: a dead delivery's step is free again after a second.
CLAIM_SECONDS = 1.0
# Past the claim, the time the recovery may take before the operation counts as wedged.
RECOVERY_BUDGET_SECONDS = 8.0
# A task that outlives the dead delivery's claim, as a real clone or destroy outlives a 20-s one,
# with room for a loaded machine between the claim's expiry and the first sweep.
LONG_TASK_SECONDS = CLAIM_SECONDS + 1.5
SWEEP_PAUSE_SECONDS = 0.05


class WorkerKilled(BaseException):
    """The worker process died here. A ``BaseException``, like the ``SystemExit`` of a hard
    exit: no ``except Exception`` in proxyhub sees it, so no handler, retry, journal write or
    message send runs after the point."""


@dataclass(frozen=True)
class Death:
    """What the dead worker left behind, read right after it died."""

    stage: str  # the stage the journal holds: the one the next delivery runs
    claim_held: bool
    receipts: frozenset[str]  # the UPIDs in the journal


# Where a Proxmox task is in flight at the death, the recovery meets it either ended or still
# running (the common case on a real cluster, where a clone takes longer than a claim).
IN_FLIGHT = pytest.mark.parametrize(
    "in_flight", [False, True], ids=["task-ended-by-recovery", "task-running-at-recovery"]
)


def _spec(sim: Sim) -> ProxySpec:
    return ProxySpec(
        name="alpha",
        cluster=sim.cluster,
        machine_type="small",
        image="debian-13",
        zone="pve1",
        cloud_init=b"#cloud-config\nhostname: alpha\n",
    )


def _stage(op: Operation) -> str:
    progress = op.progress or {}
    if progress.get("stage") in ("address", "seed_release"):
        return str(progress["stage"])
    machine = progress.get("create") or progress.get("delete") or {}
    return str(machine.get("stage", ""))


def _receipts(op: Operation) -> frozenset[str]:
    return frozenset(
        OperationStep.objects.filter(operation=op).exclude(upid="").values_list("upid", flat=True)
    )


def _is(outcome: Outcome, step: str, status: str, finished: bool) -> bool:
    name = outcome.phase_name or outcome.result.step
    return name == step and outcome.result.status == status and outcome.finished == finished


def _target(entry: LedgerEntry) -> int | None:
    """The VMID a mutation acts on: a clone's new VM, not the template it reads."""
    text = entry.params.get("newid") if entry.key and entry.key.endswith("/clone") else None
    text = text or entry.path_params.get("vmid")
    return int(text) if text else None


def _identity(entry: LedgerEntry) -> tuple[Any, ...]:
    # A config write is told apart by what it sets: the configure step's and the seed's eject
    # are two writes by design; the same write twice is a resubmission.
    written = tuple(sorted(entry.params)) if entry.key == f"PUT {CONFIG}" else ()
    return (
        entry.method,
        entry.key,
        tuple(sorted(entry.path_params.items())),
        _target(entry),
        written,
    )


def _sent_mutations(sim: Sim) -> list[LedgerEntry]:
    """Every mutating request that reached Proxmox, applied or refused (a refused resubmission
    is still a resubmission); the guest agent's POSTs only read."""
    return [
        e
        for e in sim.engine.ledger.calls()
        if e.method != "GET" and "/agent" not in (e.key or e.path)
    ]


@dataclass
class Crash:
    """Kills the worker at one point of a create or a delete, then recovers as production does.

    Arm one seam (``before_call``, ``after_call``, ``before_commit``, ``after_commit``), start
    the flow (``create``, or ``running_proxy`` then ``delete``), ``run_to_death``, ``recover``,
    then ``assert_created`` or ``assert_deleted``.
    """

    pump: Pump
    sim: Sim
    monkeypatch: pytest.MonkeyPatch
    armed: str = ""
    kills: int = 0
    op: Operation | None = None
    started: list[UUID] = field(default_factory=list)
    foreign: dict[int, dict[str, Any]] = field(default_factory=dict)
    usual_profile: Profile | None = None
    seed: str = ""  # the proxy's seed volume id
    keep_seed: bool = False
    recovery_began: float | None = None  # the simulator's clock at the first message re-sent

    # --- the seams ------------------------------------------------------------------------

    def _die(self, *_: Any) -> NoReturn:
        assert self.armed, "a kill fired twice"
        seam, self.armed = self.armed, ""
        self.kills += 1
        raise WorkerKilled(seam)

    def before_call(self, method: str, path: str) -> None:
        """Kill the worker just before its next ``method path`` request reaches Proxmox."""
        self.armed = f"before {method} {path}"
        self.sim.before(f"{method} {path}", self._die)

    def after_call(self, method: str, path: str) -> None:
        """Kill the worker once Proxmox answered its next ``method path`` request, before the
        answer is read (with ``drop_reply``, the answer is lost on the wire anyway)."""
        self.armed = f"after {method} {path}"
        self.sim.after(f"{method} {path}", self._die)

    def before_commit(self, step: str, status: str, *, finished: bool = False) -> None:
        """Kill the worker just before the journal transaction of ``step`` commits, when it
        ends with ``status``: everything it wrote is rolled back, its message never sent."""
        self.armed = f"before the commit of {step} ({status})"
        persist = driver._persist

        def dying(
            op: Operation, claim: str, outcome: Outcome, now: datetime, seconds: float, **kw: Any
        ) -> str | None:
            if not (self.armed and _is(outcome, step, status, finished)):
                return persist(op, claim, outcome, now, seconds, **kw)
            # The outer block stands for the connection that dies before COMMIT: it takes back
            # the journal rows and the message registered to go after the commit.
            with transaction.atomic():
                persist(op, claim, outcome, now, seconds, **kw)
                self._die()

        self.monkeypatch.setattr(driver, "_persist", dying)

    def after_commit(self, step: str, status: str) -> None:
        """Kill the worker right after the journal of ``step`` (ending with ``status``)
        committed, before it sent the next step's message."""
        self.armed = f"after the commit of {step} ({status})"
        persist = driver._persist
        send = dispatch.send_after_commit

        def dying(
            op: Operation, claim: str, outcome: Outcome, now: datetime, seconds: float, **kw: Any
        ) -> str | None:
            if not (self.armed and _is(outcome, step, status, False)):
                return persist(op, claim, outcome, now, seconds, **kw)
            lost: list[tuple[Any, ...]] = []
            self.monkeypatch.setattr(dispatch, "send_after_commit", lambda *args: lost.append(args))
            try:
                # A next step run in the same delivery (driver: no other step due) has no
                # message: dying here leaves it due with none, as a lost message does.
                chained = persist(op, claim, outcome, now, seconds, **kw)
            finally:
                self.monkeypatch.setattr(dispatch, "send_after_commit", send)
            assert lost or chained, f"{step} committed without a next message to lose"
            self._die()

        self.monkeypatch.setattr(driver, "_persist", dying)

    def outlive_the_claim(self, method: str, path: str) -> None:
        """The task that the next ``method path`` request starts runs past the dead delivery's
        claim, so the recovery meets it still running. Only that task is slow: the profile is
        back to usual once the worker died."""

        def slow(_: Any) -> None:
            engine = self.sim.engine.sim
            self.usual_profile = engine.profile
            engine.profile = replace(
                engine.profile,
                clone=LONG_TASK_SECONDS,
                start=LONG_TASK_SECONDS,
                task=LONG_TASK_SECONDS,
            )

        self.sim.before(f"{method} {path}", slow)

    def assert_recovery_met_it_running(self, upid: str | None) -> None:
        assert upid is not None and self.recovery_began is not None
        task = self.sim.engine.scheduler.tasks[upid]
        assert task.ended_at is not None and task.ended_at > self.recovery_began, (
            "the task ended before the recovery began"
        )

    # --- the flows --------------------------------------------------------------------------

    def create(self) -> Operation:
        """Ask for the proxy. Before its first step runs, a foreign VM takes the first VMID the
        lookup probes, so every test also proves that VM is walked past and left alone."""
        op = self._start(operations.proxy_create, spec=_spec(self.sim))
        proxy = Proxy.objects.get(pk=op.proxy_id)
        self.seed = seed_volid_of(proxy)
        cluster = self.sim.cluster
        first = vmid_for(proxy.uid, 0, cluster.vmid_min, cluster.vmid_max)
        squatter = self.sim.engine.control.create_vms(
            1, start_vmid=first, node="pve2", name_prefix="squatter-", running=True, tags=None
        )
        assert squatter == [first]
        self.foreign = self._guests()
        return op

    def running_proxy(self) -> Proxy:
        """A proxy created without a fault: where every delete starts. It keeps its seed
        (``PROXYHUB_KEEP_SEED_ISO``), so the delete is the one that removes it."""
        self.keep_seed = True
        self.monkeypatch.setattr(settings, "PROXYHUB_KEEP_SEED_ISO", True)
        op = self.create()
        self.pump.run()
        op.refresh_from_db()
        assert op.state == OperationState.SUCCEEDED, op.last_error
        proxy = Proxy.objects.get()
        assert proxy.phase == Phase.RUNNING
        return proxy

    def delete(self) -> Operation:
        return self._start(operations.proxy_request_delete, proxy=Proxy.objects.get())

    def _start(self, service: Any, **kwargs: Any) -> Operation:
        op: Operation = self.pump.call(service, **kwargs)
        self.op = op
        self.started.append(op.pk)
        return op

    def run_to_death(self) -> Death:
        """Deliver until the armed kill fires; the operation is left unfinished."""
        with pytest.raises(WorkerKilled):
            self.pump.run()
        assert self.kills == 1
        return self._death()

    def lose_the_first_message(self) -> Death:
        """The process that committed the operation dies before its message leaves."""
        assert self.pump.drop_all() == 1
        return self._death()

    def _death(self) -> Death:
        if self.usual_profile is not None:
            self.sim.engine.sim.profile, self.usual_profile = self.usual_profile, None
        op = self._op()
        op.refresh_from_db()
        assert op.state in ACTIVE_STATES
        assert not self.pump.queue  # nothing will move it now but the sweeper
        death = Death(_stage(op), bool(op.claim_token), _receipts(op))
        if death.claim_held:
            # A held claim is a worker that may still be running: the sweeper leaves it be.
            assert self.pump.call(operations_sweep) == 0
        return death

    def recover(self, *, swept: bool = True) -> int:
        """Production's recovery and nothing else: sweep and deliver until the operation ends.
        Returns how many messages the sweeper sent. ``swept``: the operation's message died
        with the worker, so the sweeper must be what moved it (False for an operation started
        after the death, whose own message is still on its way)."""
        op = self._op()
        deadline = time.monotonic() + CLAIM_SECONDS + RECOVERY_BUDGET_SECONDS
        resent = 0
        while True:
            op.refresh_from_db()
            if op.state not in ACTIVE_STATES:
                assert resent or not swept, "the operation ended without the sweeper"
                return resent
            assert time.monotonic() < deadline, (
                f"wedged: {op.kind} still {op.state} at stage {_stage(op)!r}; {op.last_error}"
            )
            sent = self.pump.call(operations_sweep)
            if sent and self.recovery_began is None:
                self.recovery_began = self.sim.engine.clock()
            resent += sent
            self.pump.run()
            time.sleep(SWEEP_PAUSE_SECONDS)

    # --- what must hold afterwards ----------------------------------------------------------

    def assert_created(self) -> None:
        op = self._op()
        op.refresh_from_db()
        assert op.state == OperationState.SUCCEEDED, op.last_error
        proxy = Proxy.objects.get()
        assert proxy.phase == Phase.RUNNING and proxy.ip, (proxy.phase, proxy.ip)
        assert self._our_vms() == {canonical_uid(proxy.uid): [proxy.vmid]}
        # Released once the guest had its address; kept, its CD-ROM on its node only.
        assert self._seeds() == ({proxy.node} if self.keep_seed else set())
        self._assert_everywhere()

    def assert_deleted(self) -> None:
        op = self._op()
        op.refresh_from_db()
        assert op.state == OperationState.SUCCEEDED, op.last_error
        assert not Proxy.objects.exists()
        assert self._our_vms() == {}
        assert self._seeds() == set()
        self._assert_everywhere()

    def _assert_everywhere(self) -> None:
        assert not self.armed, "the kill never fired"
        assert not Operation.objects.filter(state__in=ACTIVE_STATES).exists()
        # No operator acted: the operations are the ones the test started, and no other.
        assert set(Operation.objects.values_list("pk", flat=True)) == set(self.started)
        self._assert_foreign_untouched()
        self._assert_clones()
        self._assert_no_mutation_twice()

    def _assert_foreign_untouched(self) -> None:
        assert self._guests(set(self.foreign)) == self.foreign
        targets = {_target(e) for e in _sent_mutations(self.sim)}
        touched = sorted(vmid for vmid in self.foreign if vmid in targets)
        assert not touched, f"foreign VMs touched: {touched}"

    def _assert_clones(self) -> None:
        """At most one successful clone per proxy; never a clone for a VMID holding our VM."""
        clones = self.sim.engine.ledger.calls("POST", CLONE)
        applied = Counter(e.params.get("name") for e in clones if e.mutation)
        assert all(n == 1 for n in applied.values()), applied
        holding: set[int | None] = set()
        for entry in self.sim.engine.ledger.calls():
            if entry.key == f"POST {CLONE}":
                assert _target(entry) not in holding, f"a clone for VM {_target(entry)}, ours"
                if entry.mutation:
                    holding.add(_target(entry))
            elif entry.key == f"DELETE {DESTROY}" and entry.mutation:
                holding.discard(_target(entry))

    def _assert_no_mutation_twice(self) -> None:
        """Each mutation reached Proxmox once: none was resubmitted, in particular none whose
        UPID the journal held (a receipt is only ever polled, seed 001)."""
        sent = _sent_mutations(self.sim)
        journalled = set(OperationStep.objects.exclude(upid="").values_list("upid", flat=True))
        for entry in sent:
            if entry.upid in journalled:
                again = [m for m in sent if m.seq > entry.seq and _identity(m) == _identity(entry)]
                assert not again, (
                    f"{entry.key} sent again after its UPID {entry.upid} was journalled"
                )
        counts = Counter(_identity(m) for m in sent)
        assert all(n == 1 for n in counts.values()), {k: n for k, n in counts.items() if n > 1}

    # --- reading the simulator -----------------------------------------------------------

    def _guests(self, only: set[int] | None = None) -> dict[int, dict[str, Any]]:
        """The simulator's own view of every guest (of ``only`` those VMIDs), read behind the
        API so the ledger holds proxyhub's calls alone."""
        control = self.sim.engine.control
        vmids = sorted(self.sim.engine.cluster.guests)
        return {vmid: control.vm(vmid) for vmid in vmids if only is None or vmid in only}

    def _our_vms(self) -> dict[str, list[int]]:
        """Every VM marked by this installation, by the proxy UID its mark names."""
        ours: dict[str, list[int]] = defaultdict(list)
        for vmid, guest in self._guests().items():
            if guest["kind"] != "qemu" or guest["config"].get("template"):
                continue
            mark = parse_mark(guest["config"].get("description"))
            if mark.managed and mark.installation == installation_id():
                ours[canonical_uid(mark.uid)].append(vmid)
        return dict(ours)

    def _seeds(self) -> set[str]:
        """The nodes holding the proxy's seed ISO."""
        volid = self.seed
        return {
            node
            for node in NODES
            if any(
                v["volid"] == volid
                for v in self.sim.api.storage_content(node, SEEDS, content="iso")
            )
        }

    def _op(self) -> Operation:
        assert self.op is not None, "start a flow first"
        return self.op


@pytest.fixture
def crash(pump: Pump, sim: Sim, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Crash:
    settings.PROXYHUB_STEP_CLAIM_SECONDS = CLAIM_SECONDS
    settings.PROXYHUB_SWEEPER_GRACE_SECONDS = 0.05
    return Crash(pump, sim, monkeypatch)


def _ledger(sim: Sim, method: str, path: str) -> list[LedgerEntry]:
    return sim.engine.ledger.calls(method, path)


def _configured(sim: Sim) -> list[int]:
    """The statuses of the create's config writes (those that attach the seed; the seed's
    release writes the config too, to eject it)."""
    return [e.status for e in _ledger(sim, "PUT", CONFIG) if "seed.iso" in e.params.get("ide2", "")]


# --- the create flow ------------------------------------------------------------------------


def test_F1_operation_committed_message_never_sent(crash: Crash, sim: Sim) -> None:
    """F1: after Operation committed, before enqueue."""
    crash.create()
    death = crash.lose_the_first_message()
    assert death == Death("", claim_held=False, receipts=frozenset())
    assert len(sim.engine.ledger) == 0  # nothing reached Proxmox
    crash.recover()
    crash.assert_created()


def test_F2_vmid_chosen_worker_dies_before_the_clone_post(crash: Crash, sim: Sim) -> None:
    """F2: after VMID chosen, before clone POST."""
    crash.before_call("POST", CLONE)
    op = crash.create()
    death = crash.run_to_death()
    op.refresh_from_db()
    assert death.stage == "clone" and death.claim_held
    assert op.progress["create"]["vmid"]  # the VMID is journalled before the clone is sent
    assert _ledger(sim, "POST", CLONE) == []
    crash.recover()
    crash.assert_created()


@IN_FLIGHT
def test_F3_clone_sent_reply_lost_worker_dies(crash: Crash, sim: Sim, in_flight: bool) -> None:
    """F3: clone POST sent, reply not read."""
    if in_flight:
        crash.outlive_the_claim("POST", CLONE)
    sim.engine.control.drop_reply("POST", CLONE)
    crash.after_call("POST", CLONE)
    crash.create()
    death = crash.run_to_death()
    assert death.stage == "clone" and death.claim_held and not death.receipts
    (clone,) = _ledger(sim, "POST", CLONE)
    assert clone.mutation and clone.fault == "drop"  # applied; the reply never came back
    crash.recover()
    crash.assert_created()
    if in_flight:  # the nameless, locked clone at our VMID was waited on, never cloned again
        crash.assert_recovery_met_it_running(clone.upid)


@IN_FLIGHT
def test_F4_clone_upid_received_not_journalled(crash: Crash, sim: Sim, in_flight: bool) -> None:
    """F4: clone UPID received, not journalled."""
    if in_flight:
        crash.outlive_the_claim("POST", CLONE)
    crash.before_commit("clone", "wait")
    crash.create()
    death = crash.run_to_death()
    (clone,) = _ledger(sim, "POST", CLONE)
    assert clone.upid and clone.upid not in death.receipts
    assert death.stage == "clone" and death.claim_held
    crash.recover()
    crash.assert_created()
    if in_flight:
        crash.assert_recovery_met_it_running(clone.upid)


@IN_FLIGHT
def test_F5_clone_upid_journalled_message_lost_before_the_wait(
    crash: Crash, sim: Sim, in_flight: bool
) -> None:
    """F5: UPID journalled, before wait."""
    if in_flight:
        crash.outlive_the_claim("POST", CLONE)
    crash.after_commit("clone", "wait")
    crash.create()
    death = crash.run_to_death()
    (clone,) = _ledger(sim, "POST", CLONE)
    assert clone.upid in death.receipts
    assert death.stage == "clone_wait" and not death.claim_held
    crash.recover()
    crash.assert_created()
    if in_flight:  # the journalled UPID was polled until it ended
        crash.assert_recovery_met_it_running(clone.upid)


def test_F6_clone_task_ok_not_journalled_before_the_upload(crash: Crash, sim: Sim) -> None:
    """F6: clone task OK, before upload."""
    crash.before_commit("clone_wait", "continue")
    op = crash.create()
    death = crash.run_to_death()
    op.refresh_from_db()
    assert death.stage == "clone_wait" and death.claim_held
    guest = sim.engine.control.vm(op.progress["create"]["vmid"])
    assert not guest["midClone"] and guest["config"]["name"] == "proxy-alpha"  # cloned
    assert _ledger(sim, "POST", UPLOAD) == []
    crash.recover()
    crash.assert_created()


def test_F7_seed_uploaded_worker_dies_before_the_config_put(crash: Crash, sim: Sim) -> None:
    """F7: after upload, before config PUT."""
    crash.before_call("PUT", CONFIG)
    crash.create()
    death = crash.run_to_death()
    (upload,) = _ledger(sim, "POST", UPLOAD)
    assert upload.upid in death.receipts
    # The config write runs in the step that saw the upload end (CreateMachine.follows), so
    # the record still waits for the upload: recovery polls it again, then configures.
    assert death.stage == "upload_wait" and death.claim_held
    assert _ledger(sim, "PUT", CONFIG) == []
    crash.recover()
    crash.assert_created()


def test_F8_config_put_applied_not_journalled_before_the_resize(crash: Crash, sim: Sim) -> None:
    """F8: after config PUT, before resize (within the step that saw the upload end)."""
    crash.before_call("PUT", RESIZE)
    crash.create()
    death = crash.run_to_death()
    assert _configured(sim) == [200]
    assert death.stage == "upload_wait" and death.claim_held
    assert _ledger(sim, "PUT", RESIZE) == []
    crash.recover()
    crash.assert_created()
    # The config is compared again, and not written twice.
    assert _configured(sim) == [200]


def test_F9_disk_grown_worker_dies_before_the_start(crash: Crash, sim: Sim) -> None:
    """F9: after resize, before start."""
    crash.before_call("POST", START)
    crash.create()
    death = crash.run_to_death()
    (resize,) = _ledger(sim, "PUT", RESIZE)
    assert resize.upid in death.receipts
    # The start is submitted by the step that saw the resize end (CreateMachine.follows).
    assert death.stage == "resize_wait" and death.claim_held
    assert _ledger(sim, "POST", START) == []
    crash.recover()
    crash.assert_created()


@pytest.mark.parametrize(
    ("step", "method", "path", "polled"),
    [
        pytest.param("resize", "PUT", RESIZE, "upload_wait", id="F8b-config-and-resize"),
        pytest.param("start", "POST", START, "resize_wait", id="F9b-start"),
    ],
)
def test_F8b_F9b_a_step_that_went_on_dies_before_its_commit(
    crash: Crash, sim: Sim, step: str, method: str, path: str, polled: str
) -> None:
    """F8b: the step that saw the upload end wrote the config and submitted the resize; F9b:
    the step that saw the resize end submitted the start (CreateMachine.follows). Each dies
    before its commit: nothing of it is journalled, not even the submitted task's UPID, and the
    record still waits for the task before."""
    crash.before_commit(step, "wait")
    crash.create()
    death = crash.run_to_death()
    (submitted,) = _ledger(sim, method, path)
    assert submitted.upid not in death.receipts
    assert death.stage == polled and death.claim_held
    crash.recover()
    crash.assert_created()
    # Recovery read back what the dead step did (the disk grown or the VM started, or its task
    # still running; the config as wanted): nothing was sent again.
    assert len(_ledger(sim, method, path)) == 1
    assert _configured(sim) == [200]


@IN_FLIGHT
def test_F10_start_upid_journalled_message_lost(crash: Crash, sim: Sim, in_flight: bool) -> None:
    """F10: start UPID journalled."""
    if in_flight:
        crash.outlive_the_claim("POST", START)
    crash.after_commit("start", "wait")
    crash.create()
    death = crash.run_to_death()
    (start,) = _ledger(sim, "POST", START)
    assert start.upid in death.receipts
    assert death.stage == "start_wait" and not death.claim_held
    crash.recover()
    crash.assert_created()
    if in_flight:
        crash.assert_recovery_met_it_running(start.upid)


def test_F11_vm_running_worker_dies_before_the_address_is_found(crash: Crash, sim: Sim) -> None:
    """F11: running, before address found. The start's wait that sees the VM run is the
    running check too (create.py), so the record the death leaves is still at that wait."""
    crash.before_commit("running", "continue")
    op = crash.create()
    death = crash.run_to_death()
    op.refresh_from_db()
    assert death.stage == "start_wait" and death.claim_held
    assert sim.engine.control.vm(op.progress["create"]["vmid"])["status"] == "running"
    assert Proxy.objects.get().ip is None
    crash.recover()
    crash.assert_created()


def test_F12_address_found_worker_dies_before_running_is_committed(crash: Crash, sim: Sim) -> None:
    """F12: address found, before phase ``Running`` committed (the address stage ends
    ``done``; the operation goes on to the seed's release)."""
    crash.before_commit("address", "done")
    crash.create()
    death = crash.run_to_death()
    assert death.stage == "address" and death.claim_held
    proxy = Proxy.objects.get()
    assert proxy.phase != Phase.RUNNING and proxy.ip is None
    crash.recover()
    crash.assert_created()


def _after_the_address(crash: Crash, sim: Sim, arm: Any) -> None:
    """Arm ``arm`` once the guest agent is first asked, so it fires in the seed's release and
    not at the configure step's config write."""
    sim.before("GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", lambda _: arm())


def test_F13_eject_sent_reply_lost_worker_dies(crash: Crash, sim: Sim) -> None:
    """F13: the seed's eject applied, its reply lost with the worker."""
    sim.engine.control.drop_reply("PUT", CONFIG, nth=2)
    _after_the_address(crash, sim, lambda: crash.after_call("PUT", CONFIG))
    crash.create()
    death = crash.run_to_death()
    assert death.stage == "seed_release" and death.claim_held
    eject = _ledger(sim, "PUT", CONFIG)[-1]
    assert eject.mutation and eject.fault == "drop" and "ide2" in eject.params
    crash.recover()
    crash.assert_created()  # read back: the drive is empty, so the eject is not sent again
    assert len(_ledger(sim, "PUT", CONFIG)) == 2


def test_F14_seed_delete_sent_reply_lost_worker_dies(crash: Crash, sim: Sim) -> None:
    """F14: the seed's volume delete applied, its reply lost with the worker."""
    sim.engine.control.drop_reply("DELETE", VOLUME)
    crash.after_call("DELETE", VOLUME)
    crash.create()
    death = crash.run_to_death()
    assert death.stage == "seed_release" and death.claim_held
    (gone,) = _ledger(sim, "DELETE", VOLUME)
    assert gone.mutation and gone.fault == "drop"
    crash.recover()
    crash.assert_created()


def test_F15_seed_removed_worker_dies_before_it_is_committed(crash: Crash, sim: Sim) -> None:
    """F15: the seed is gone, the journal never said so."""
    crash.before_commit("seed_release", "done", finished=True)
    crash.create()
    death = crash.run_to_death()
    assert death.stage == "seed_release" and death.claim_held
    assert crash._seeds() == set()
    crash.recover()
    crash.assert_created()


def test_F16_vm_destroyed_before_its_start_then_the_new_clone_dies_unjournalled(
    crash: Crash, sim: Sim
) -> None:
    """F16: the create's configured VM is destroyed outside proxyhub before its start (seed
    000 entry 10: "does not exist" inside a create starts it over from the lookup); the create
    clones again and the worker dies before that clone is journalled; then the operator deletes
    the proxy. Found by the state machine on PostgreSQL: the proxy still recorded the destroyed
    VM's SMBIOS UUID (seed 001), so the delete took the new clone for a VM restored from a
    backup, refused it and latched the proxy Failed."""
    behind = sim.api

    def destroy_out_of_band(_: Any) -> None:
        proxy = Proxy.objects.get()
        task_ended(behind, proxy.node, behind.destroy(proxy.node, proxy.vmid), within=5)
        crash.before_commit("clone", "wait")  # the clone made again, never journalled

    sim.before(f"POST {START}", destroy_out_of_band)
    crash.create()
    death = crash.run_to_death()
    clones = [e for e in _ledger(sim, "POST", CLONE) if e.mutation]
    assert len(clones) == 2 and death.claim_held
    # The dead worker never waited for that clone: until its task ends the new VM is the
    # nameless "qmclone temporary file" with no mark (pvesim/handlers_clone.py), so the
    # ownership below is read once the task has stopped.
    again = clones[-1]
    task_ended(behind, again.path_params["node"], str(again.upid))
    made_again = Proxy.objects.get().vmid
    assert crash._our_vms() == {canonical_uid(Proxy.objects.get().uid): [made_again]}

    op = crash.delete()
    crash.recover(swept=False)
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert not Proxy.objects.exists()
    assert crash._our_vms() == {}
    assert not crash.armed


# --- the delete flow ------------------------------------------------------------------------


def test_D1_delete_intent_committed_worker_dies_at_its_first_step(crash: Crash, sim: Sim) -> None:
    """D1: after intent."""
    crash.running_proxy()
    before = len(sim.engine.ledger)
    crash.before_call("GET", RESOURCES)
    op = crash.delete()
    death = crash.run_to_death()
    assert death.stage == "" and death.claim_held
    assert Proxy.objects.get().lease_operation_id == op.pk  # held by the dead delivery's operation
    assert len(sim.engine.ledger) == before  # nothing reached Proxmox
    crash.recover()
    crash.assert_deleted()


@IN_FLIGHT
def test_D2_stop_submitted_reply_lost_worker_dies(crash: Crash, sim: Sim, in_flight: bool) -> None:
    """D2: after stop submitted."""
    crash.running_proxy()
    if in_flight:
        crash.outlive_the_claim("POST", STOP)
    sim.engine.control.drop_reply("POST", STOP)
    crash.after_call("POST", STOP)
    crash.delete()
    death = crash.run_to_death()
    assert death.stage == "stop" and death.claim_held
    (stop,) = _ledger(sim, "POST", STOP)
    assert stop.mutation and stop.fault == "drop" and stop.upid not in death.receipts
    crash.recover()
    crash.assert_deleted()
    if in_flight:  # the running stop task was found and waited on, not sent again
        crash.assert_recovery_met_it_running(stop.upid)


def test_D3_stop_ok_not_journalled(crash: Crash, sim: Sim) -> None:
    """D3: stop OK."""
    proxy = crash.running_proxy()
    crash.before_commit("stop_wait", "continue")
    crash.delete()
    death = crash.run_to_death()
    assert death.stage == "stop_wait" and death.claim_held
    assert sim.engine.control.vm(proxy.vmid)["status"] == "stopped"
    crash.recover()
    crash.assert_deleted()


@IN_FLIGHT
def test_D4_destroy_submitted_reply_lost_worker_dies(
    crash: Crash, sim: Sim, in_flight: bool
) -> None:
    """D4: destroy submitted."""
    crash.running_proxy()
    if in_flight:
        crash.outlive_the_claim("DELETE", DESTROY)
    sim.engine.control.drop_reply("DELETE", DESTROY)
    crash.after_call("DELETE", DESTROY)
    crash.delete()
    death = crash.run_to_death()
    assert death.stage == "destroy" and death.claim_held
    (destroy,) = _ledger(sim, "DELETE", DESTROY)
    assert destroy.mutation and destroy.fault == "drop" and destroy.upid not in death.receipts
    crash.recover()
    crash.assert_deleted()
    if in_flight:
        crash.assert_recovery_met_it_running(destroy.upid)


def test_D5_destroy_ok_worker_dies_before_the_seed_delete(crash: Crash, sim: Sim) -> None:
    """D5: destroy OK before seed delete."""
    proxy = crash.running_proxy()
    crash.before_commit("destroy_wait", "continue")
    crash.delete()
    death = crash.run_to_death()
    assert death.stage == "destroy_wait" and death.claim_held
    assert proxy.vmid not in sim.engine.cluster.guests  # destroyed
    assert _ledger(sim, "DELETE", VOLUME) == []
    crash.recover()
    crash.assert_deleted()


def test_D6_seed_deleted_before_the_database_row(crash: Crash, sim: Sim) -> None:
    """D6: seed delete OK before DB."""
    crash.running_proxy()
    crash.before_commit("seed", "done", finished=True)
    crash.delete()
    death = crash.run_to_death()
    assert death.stage == "seed" and death.claim_held
    assert Proxy.objects.exists()  # the row outlived the seed
    assert [e.status for e in _ledger(sim, "DELETE", VOLUME)] == [200]
    crash.recover()
    crash.assert_deleted()
