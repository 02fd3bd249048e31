"""Service-test plumbing: the in-process simulator behind every cluster, and a message pump.

``Pump`` stands in for the broker and one worker: it collects the step messages the services
send (``services.dispatch.send_step``), waits out each countdown, and delivers them to the
driver in due order, running on-commit callbacks as a committed transaction would. It is not a
worker (the integration tier runs real ``celery`` workers over Redis); it makes service tests
exact and fast. A message's priority (``dispatch.PRIORITY_*``) is recorded, in ``sent`` too, but
not honoured: the broker's priority order is held to on real Redis (test_step_priority).
Use it by importing the fixtures: ``from pump import pump, sim  # noqa: F401``.
"""

from __future__ import annotations

import heapq
import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.test import TestCase

from provisioning.models import Cluster, MachineType, Node, Proxy, Template
from provisioning.proxmox.api import Api, Call
from provisioning.proxmox.budgets import Budgets
from provisioning.services import dispatch, driver
from provisioning.services.operations import ProxySpec
from provisioning.services.providers import use_transport_factory
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport

Hook = Callable[[Call], None]


class HookedTransport:
    """The in-process transport with test hooks: ``hooks[schema_key]`` run just before a call
    of that kind reaches the simulator, ``after[schema_key]`` just after the simulator answered
    it (or failed it), before the caller reads the answer (each hook runs once, first in, first
    out). A hook may do anything an operator or another worker could do meanwhile, which is how
    service tests put an event exactly inside a slow request (a shutdown finishing while
    reconcile lists), or kill the worker between a request and its reply."""

    def __init__(
        self,
        engine: Simulator,
        hooks: dict[str, list[Hook]],
        after: dict[str, list[Hook]] | None = None,
    ) -> None:
        self.inner = SimTransport(engine)
        self.hooks = hooks
        self.after_hooks = after if after is not None else {}

    def send(self, call: Call, *, deadline: Any) -> Any:
        pending = self.hooks.get(call.schema_key)
        if pending:
            pending.pop(0)(call)
        try:
            return self.inner.send(call, deadline=deadline)
        finally:
            answered = self.after_hooks.get(call.schema_key)
            if answered:
                answered.pop(0)(call)


@dataclass
class Sim:
    """The simulated Proxmox cluster and its catalogue row."""

    engine: Simulator
    cluster: Cluster
    hooks: dict[str, list[Hook]] = field(default_factory=dict)
    after_hooks: dict[str, list[Hook]] = field(default_factory=dict)

    def before(self, schema_key: str, hook: Hook) -> None:
        """Run ``hook`` once, just before the next ``schema_key`` call reaches the simulator."""
        self.hooks.setdefault(schema_key, []).append(hook)

    def after(self, schema_key: str, hook: Hook) -> None:
        """Run ``hook`` once, just after the simulator answered the next ``schema_key`` call
        (applied or failed, as its faults say) and before proxyhub reads that answer."""
        self.after_hooks.setdefault(schema_key, []).append(hook)

    @property
    def api(self) -> Api:
        """The seam straight onto the simulator, for looking behind proxyhub's back."""
        return Api(SimTransport(self.engine))

    def settle(self, seconds: float = 0.2) -> None:
        """Let the simulator's (scaled, real-time) tasks finish."""
        time.sleep(seconds)

    def ledger_mutations(self) -> list[str]:
        return [str(e.key) for e in self.engine.ledger.mutations()]


def task_ended(api: Api, node: str, upid: str, *, within: float = 10.0) -> None:
    """Wait until the simulator's task ``upid`` on ``node`` has stopped (its tasks run on a
    real, scaled clock); fails after ``within`` seconds."""
    give_up = time.monotonic() + within
    while api.task_status(node, upid).get("status") != "stopped":
        assert time.monotonic() < give_up, f"task {upid} did not end within {within:g} s"
        time.sleep(0.01)


# A token path inside the test settings' credentials directory (the system's temporary
# directory, issue 11) where no file ever is: the in-process transport needs no token.
ABSENT_TOKEN = str(Path(tempfile.gettempdir()) / "proxyhub-tests-absent" / "token")


def make_cluster(
    name: str = "pvesim", nodes: tuple[str, ...] = ("pve1", "pve2", "pve3")
) -> Cluster:
    cluster = Cluster.objects.create(
        name=name,
        url="https://127.0.0.1:8006",
        token_file=ABSENT_TOKEN,
        iso_storage="proxy-seeds",
    )
    for position, node in enumerate(nodes):
        Node.objects.create(cluster=cluster, name=node, position=position)
    Template.objects.create(cluster=cluster, key="debian-13", vmid=9000)
    Template.objects.create(cluster=cluster, key="debian-13-noagent", vmid=9001)
    Template.objects.create(cluster=cluster, key="debian-13-cloudinit", vmid=9002)
    MachineType.objects.create(cluster=cluster, key="small", cores=1, memory_mib=1024, disk_gib=10)
    cluster.save()  # moves updated_at after the children, like the import does
    return cluster


@pytest.fixture
def sim(settings: Any) -> Iterator[Sim]:
    """Every cluster's provider talks to one in-process simulator on a quick clock."""
    settings.PROXYHUB_ADDRESS_POLL_SECONDS = 0.02
    engine = Simulator(profile="fast", time_scale=0.05)
    hooks: dict[str, list[Hook]] = {}
    after: dict[str, list[Hook]] = {}
    with use_transport_factory(
        lambda config: HookedTransport(engine, hooks, after), budgets=Budgets(poll_interval=0.02)
    ):
        yield Sim(engine, make_cluster(), hooks, after)


def proxy_spec(sim: Sim, name: str, **kwargs: Any) -> ProxySpec:
    """A proxy on the simulator's cluster, node pve1, its small machine type and debian-13;
    ``kwargs`` override any field (``cloud_init`` defaults to a bare ``#cloud-config``)."""
    fields: dict[str, Any] = {
        "name": name,
        "cluster": sim.cluster,
        "machine_type": "small",
        "image": "debian-13",
        "zone": "pve1",
        "cloud_init": b"#cloud-config\n",
    }
    fields.update(kwargs)
    return ProxySpec(**fields)


@dataclass(order=True)
class _Message:
    due: float
    seq: int
    operation_id: str = field(compare=False)
    token: str = field(compare=False)
    trace_parent: str = field(compare=False, default="")
    priority: int = field(compare=False, default=dispatch.PRIORITY_UNDER_WAY)


class Pump:
    """Collects step messages and delivers them in due order (see the module docstring)."""

    def __init__(self) -> None:
        self.queue: list[_Message] = []
        self.sent: list[_Message] = []  # every message, in the order sent
        self.delivered = 0
        self._seq = itertools.count()

    def send(
        self,
        operation_id: str,
        token: str,
        countdown: float = 0.0,
        trace_parent: str = "",
        priority: int = dispatch.PRIORITY_UNDER_WAY,
    ) -> None:
        due = time.monotonic() + max(0.0, countdown)
        message = _Message(due, next(self._seq), operation_id, token, trace_parent, priority)
        self.sent.append(message)
        heapq.heappush(self.queue, message)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` and its on-commit callbacks (the messages it sends land in the queue)."""
        with TestCase.captureOnCommitCallbacks(execute=True):
            return fn(*args, **kwargs)

    def run(self, *, max_deliveries: int = 20_000, timeout: float = 60.0) -> int:
        """Deliver until the queue is empty; returns the number of deliveries."""
        deadline = time.monotonic() + timeout
        count = 0
        while self.queue:
            if count >= max_deliveries or time.monotonic() > deadline:
                raise AssertionError(f"the pump did not drain: {len(self.queue)} messages left")
            self.deliver_one()
            count += 1
        return count

    def deliver_one(self) -> None:
        """Deliver the next message (waiting out its countdown), whatever else is queued."""
        self._deliver(heapq.heappop(self.queue))

    def run_due(self, horizon: float) -> int:
        """Deliver only the messages due within ``horizon`` seconds (and those they send that
        are), leaving later ones queued: a step told to look again much later (a maintenance
        pause's re-check) stays in the queue instead of being waited out."""
        count = 0
        while self.queue and self.queue[0].due <= time.monotonic() + horizon:
            self._deliver(heapq.heappop(self.queue))
            count += 1
        return count

    def _deliver(self, message: _Message) -> None:
        pause = message.due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        self.call(
            driver.operation_run_step,
            operation_id=message.operation_id,
            token=message.token,
            trace_parent=message.trace_parent,
        )
        self.delivered += 1

    def drop_all(self) -> int:
        """Lose every queued message (a broker that forgot them)."""
        lost = len(self.queue)
        self.queue.clear()
        return lost


@pytest.fixture
def pump(monkeypatch: pytest.MonkeyPatch) -> Pump:
    the_pump = Pump()
    monkeypatch.setattr("provisioning.services.dispatch.send_step", the_pump.send)
    return the_pump


def seed_volid_of(proxy: Proxy, installation_id: str | None = None) -> str:
    """The volume id of ``proxy``'s seed ISO, named for this (or the given) installation."""
    from provisioning.models import Installation
    from provisioning.proxmox.seed import seed_iso_name, seed_volid

    name = seed_iso_name(
        proxy.vm_name,
        installation_id=installation_id or Installation.current_id(),
        uid=str(proxy.uid),
    )
    return seed_volid(proxy.cluster.iso_storage, name)


def running_fleet(
    pump: Pump, sim: Sim, count: int, *, prefix: str = "p", zone: str = ""
) -> list[Proxy]:
    """``count`` proxies ``<prefix>0``.. created through the service and run to ``Running``."""
    from provisioning.models.choices import Phase
    from provisioning.services import operations
    from provisioning.services.operations import ProxySpec

    specs = [
        ProxySpec(
            name=f"{prefix}{i}",
            cluster=sim.cluster,
            machine_type="small",
            image="debian-13",
            zone=zone,
            cloud_init=b"#cloud-config\n",
        )
        for i in range(count)
    ]
    pump.call(operations.proxies_create, specs=specs)
    pump.run()
    proxies = list(Proxy.objects.filter(name__startswith=prefix).order_by("name"))
    assert all(p.phase == Phase.RUNNING for p in proxies), [(p.name, p.phase) for p in proxies]
    return proxies


def past_first_identity_reads(pump: Pump, sim: Sim) -> None:
    """Run the round that reads each new VM's identity once, so a test can count a steady one.

    A create reads the VM's identity before starting it, so the first round that lists the VM
    with an uptime sees a start after that read and reads its config once (seed 001, issue 14;
    ``reconcile._started_since_identity_read``). Whether a test's first round is that one
    depended on whether a second had passed since the boot (the listing's uptime is whole
    seconds): on a slower database it had, and a round expected to cost the listing alone read
    every config. Waiting out that second and running the round makes it certain."""
    from provisioning.services.reconcile import reconcile_round

    sim.settle(1.2)
    pump.call(reconcile_round)
    pump.run()
