"""The maintenance switch (issue 14, services/maintenance.py): while it is on for a cluster or a
node, proxyhub writes nothing there; its operations wait (not failed, not aged) and resume when
it is turned off. What was written is read from the simulator's ledger. Run on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import heapq
import json
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from pump import Pump, Sim, proxy_spec, running_fleet
from test_admin_support import People, people_fixture, posting  # noqa: F401

from provisioning.models import GcRound, MaintenanceWindow, Operation, Proxy
from provisioning.models.choices import DriftPolicy, OperationKind, OperationState, Phase
from provisioning.services import operations
from provisioning.services.clock import db_now
from provisioning.services.cluster_bootstrap import BootstrapInputError, cluster_bootstrap
from provisioning.services.gc import gc_run
from provisioning.services.maintenance import (
    MaintenanceInputError,
    maintenance_end,
    maintenance_start,
)
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db

REASON = "kernel update"


@pytest.fixture(autouse=True)
def _slow_recheck(settings: Any) -> None:
    """A paused step looks again only after an hour: within a test, only the switch turned off
    moves it, which is what the tests prove (no test waits out a re-check)."""
    settings.PROXYHUB_MAINTENANCE_RECHECK_SECONDS = 3600


def _run_due(pump: Pump, horizon: float = 5.0) -> int:
    return pump.run_due(horizon)


def _drop_stale(pump: Pump) -> None:
    """Forget queued messages whose token is no longer the operation's (they would exit
    without doing anything, after the pump waited an hour for them)."""
    current = dict(Operation.objects.values_list("pk", "dispatch_token"))
    pump.queue = [m for m in pump.queue if current.get(_uuid(m.operation_id)) == m.token]
    heapq.heapify(pump.queue)


def _uuid(text: str) -> Any:
    import uuid

    return uuid.UUID(str(text))


def _on(sim: Sim, node: str = "", user: Any = None) -> MaintenanceWindow:
    return maintenance_start(cluster=sim.cluster, node=node, reason=REASON, user=user)


def _off(pump: Pump, sim: Sim, node: str = "") -> None:
    assert pump.call(maintenance_end, cluster=sim.cluster, node=node)
    _drop_stale(pump)
    # Turning it off sent what waited at once: nothing is left to wait out its re-check.
    assert all(m.due <= time.monotonic() + 5 for m in pump.queue)


# --- operations wait, write nothing, and resume -------------------------------------------------


def test_a_create_on_a_node_in_maintenance_writes_nothing_waits_and_completes_after(
    pump: Pump, sim: Sim, django_user_model: Any
) -> None:
    alice = django_user_model.objects.create_user(username="alice", is_staff=True)
    _on(sim, "pve1", user=alice)
    sim.engine.ledger.clear()
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "m0", zone="pve1"))
    _run_due(pump)

    assert sim.engine.ledger.mutations() == []
    op = Operation.objects.get()
    assert op.state == OperationState.WAITING
    assert op.last_error.startswith("waiting for maintenance on pve1 of cluster pvesim")
    assert REASON in op.last_error and "turned on by alice" in op.last_error
    assert op.attempts == 0 and op.paused_since is not None
    assert len(pump.queue) == 1  # its re-check, an hour away

    _off(pump, sim, "pve1")
    pump.run()
    proxy = Proxy.objects.get()
    assert proxy.phase == Phase.RUNNING and proxy.node == "pve1"
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert op.paused_since is None and op.paused_seconds > 0
    assert sim.ledger_mutations()  # the create wrote once the switch was off


def test_cluster_maintenance_pauses_a_create_not_yet_placed(pump: Pump, sim: Sim) -> None:
    _on(sim)
    sim.engine.ledger.clear()
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "m0", zone=""))
    _run_due(pump)
    assert sim.engine.ledger.calls() == []
    assert Operation.objects.get().last_error.startswith(
        "waiting for maintenance on cluster pvesim"
    )
    _off(pump, sim)
    pump.run()
    assert Proxy.objects.get().phase == Phase.RUNNING


def test_node_maintenance_does_not_pause_another_node_and_placement_avoids_it(
    pump: Pump, sim: Sim
) -> None:
    _on(sim, "pve2")
    sim.engine.ledger.clear()
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "on1", zone="pve1"))
    pump.run()  # nothing is paused: the queue drains
    assert Proxy.objects.get(name="on1").phase == Phase.RUNNING
    # Creates with no zone go to the nodes outside maintenance while there are any.
    specs = [proxy_spec(sim, f"free{i}", zone="") for i in range(4)]
    pump.call(operations.proxies_create, specs=specs)
    _run_due(pump, horizon=60)  # a create that went to pve2 would wait, not fail: look at all
    fleet = Proxy.objects.filter(name__startswith="free")
    assert sorted(p.phase for p in fleet) == [Phase.RUNNING] * 4
    assert {p.node for p in fleet} == {"pve1", "pve3"}
    assert [
        e.key for e in sim.engine.ledger.mutations() if e.path_params.get("node") == "pve2"
    ] == []


def test_a_running_task_is_still_watched_and_only_the_next_write_waits(
    pump: Pump, sim: Sim
) -> None:
    """Maintenance turned on just after the clone was submitted: the clone's wait goes on
    reading it (observing is not writing), and the upload after it waits for the switch."""
    clone = "POST /nodes/{node}/qemu/{vmid}/clone"
    sim.after(clone, lambda call: _on(sim, "pve1"))
    sim.engine.ledger.clear()
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "m0", zone="pve1"))
    _run_due(pump, horizon=60)

    assert sim.ledger_mutations() == [clone]
    op = Operation.objects.get()
    assert op.state == OperationState.WAITING
    assert op.progress["create"]["stage"] == "upload"  # the clone's wait saw it end
    _off(pump, sim, "pve1")
    pump.run()
    assert Proxy.objects.get().phase == Phase.RUNNING


def test_paused_time_does_not_age_an_operation_out(pump: Pump, sim: Sim, settings: Any) -> None:
    """A create paused two hours under a one-hour ceiling completes once the switch is off:
    the pause is the operator's, not the operation's failure to progress."""
    settings.PROXYHUB_MAX_AGE_CREATE_SECONDS = 3600
    _on(sim, "pve1")
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "m0", zone="pve1"))
    _run_due(pump)
    two_hours_ago = db_now() - timedelta(hours=2)
    Operation.objects.update(created_at=two_hours_ago, paused_since=two_hours_ago)

    _off(pump, sim, "pve1")
    pump.run()
    op = Operation.objects.get()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert op.paused_seconds >= 7200
    assert Proxy.objects.get().phase == Phase.RUNNING


def test_an_operators_shutdown_waits_for_the_node(pump: Pump, sim: Sim) -> None:
    (proxy,) = running_fleet(pump, sim, 1, zone="pve1")
    _on(sim, "pve1")
    sim.engine.ledger.clear()
    pump.call(operations.proxy_power, proxy=proxy, action="shutdown")
    _run_due(pump)
    assert sim.engine.ledger.mutations() == []
    assert Operation.objects.get(kind=OperationKind.SHUTDOWN).state == OperationState.WAITING
    _off(pump, sim, "pve1")
    pump.run()
    proxy.refresh_from_db()
    assert proxy.phase == Phase.STOPPED
    assert sim.api.vm_status(proxy.node, int(proxy.vmid or 0))["status"] == "stopped"


# --- reconcile, repair and GC start nothing there -------------------------------------------


def test_reconcile_observes_but_does_not_start_a_stopped_vm_in_maintenance(
    pump: Pump, sim: Sim
) -> None:
    (proxy,) = running_fleet(pump, sim, 1, zone="pve1")
    sim.api.stop(proxy.node, int(proxy.vmid or 0))
    sim.settle()
    _on(sim, "pve1")
    sim.engine.ledger.clear()
    counts = pump.call(reconcile_round)
    assert counts["maintenance"] == 1
    assert sim.engine.ledger.mutations() == [] and pump.queue == []
    assert not Operation.objects.filter(kind=OperationKind.START).exists()
    proxy.refresh_from_db()
    assert proxy.phase == Phase.STOPPED  # observed all the same

    _off(pump, sim, "pve1")
    assert pump.call(reconcile_round)["start"] == 1
    pump.run()
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING


def test_reconcile_records_drift_but_repairs_nothing_in_maintenance(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    (proxy,) = running_fleet(pump, sim, 1, zone="pve1")
    sim.api.set_vm_config(proxy.node, int(proxy.vmid or 0), {"memory": "2048"})
    sim.cluster.drift_policy = DriftPolicy.REPAIR
    sim.cluster.save()
    settings.PROXYHUB_DRIFT_RECHECK_SECONDS = 0
    _on(sim)
    sim.engine.ledger.clear()
    assert pump.call(reconcile_round)["maintenance"] == 1
    assert sim.engine.ledger.mutations() == []
    proxy.refresh_from_db()
    assert proxy.drift  # shown to the operator
    assert not Operation.objects.filter(kind=OperationKind.REPAIR).exists()

    _off(pump, sim)
    assert pump.call(reconcile_round)["repair"] == 1
    pump.run()
    assert str(sim.api.vm_config(proxy.node, int(proxy.vmid or 0))["memory"]) == "1024"


def test_gc_deletes_nothing_on_a_node_in_maintenance(pump: Pump, sim: Sim) -> None:
    from datetime import UTC, datetime

    from provisioning.models import Installation
    from provisioning.proxmox.marks import render_mark

    running_fleet(pump, sim, 1, zone="pve3")  # the installation identity is drawn and kept
    created = datetime.now(UTC) - timedelta(hours=1)
    mark = render_mark("11111111-1111-4111-8111-111111111111", created, Installation.current_id())
    sim.api.clone("pve1", 9000, newid=150001, name="proxy-orphan", description=mark)
    sim.settle()
    _on(sim, "pve1")
    sim.engine.ledger.clear()
    assert pump.call(gc_run, min_age=0) == []
    assert sim.engine.ledger.mutations() == []
    assert not Operation.objects.filter(kind=OperationKind.DELETE).exists()
    refused = GcRound.objects.latest("started_at").refused
    assert refused == [
        {"cluster": "pvesim", "reason": "1 item(s) kept: node(s) pve1 in maintenance"}
    ]

    _off(pump, sim, "pve1")
    assert [i.name for i in pump.call(gc_run, min_age=0)] == ["proxy-orphan"]
    pump.run()
    assert "proxy-orphan" not in {e.get("name") for e in sim.api.cluster_resources()}


def test_bootstrap_refuses_a_cluster_in_maintenance_and_says_how_to_end_it(sim: Sim) -> None:
    _on(sim)
    sim.engine.ledger.clear()
    with pytest.raises(BootstrapInputError) as caught:
        cluster_bootstrap(cluster=sim.cluster, admin_token_file="/nonexistent")
    assert "cluster pvesim is in maintenance" in str(caught.value)
    assert "manage.py maintenance off --cluster pvesim" in str(caught.value)
    assert sim.engine.ledger.calls() == []


# --- the doors: command and banner ------------------------------------------------------------


def _command(*args: str) -> str:
    out = StringIO()
    call_command("maintenance", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["on", "--cluster", "nope", "--reason", "x"], "--cluster: no cluster named 'nope'"),
        (["on", "--cluster", "pvesim", "--node", "pve9", "--reason", "x"], '--node: node "pve9"'),
        (["on", "--cluster", "pvesim"], "--reason: reason is required"),
        (["on", "--cluster", "pvesim", "--reason", "x" * 201], "--reason: reason is 201"),
        (["off", "--cluster", "pvesim", "--node", "pve9"], '--node: node "pve9"'),
        (["on", "--reason", "x"], "--cluster is required"),
    ],
)
def test_the_command_names_the_bad_field_and_writes_nothing(
    sim: Sim, args: list[str], field: str
) -> None:
    with pytest.raises(CommandError) as caught:
        _command(*args)
    assert str(caught.value).startswith(field), str(caught.value)
    assert not MaintenanceWindow.objects.exists()


def test_the_command_turns_it_on_lists_it_and_turns_it_off(sim: Sim) -> None:
    _command("on", "--cluster", "pvesim", "--node", "pve1", "--reason", REASON)
    _command("on", "--cluster", "pvesim", "--reason", "rack move")
    listed = json.loads(_command("status", "--json"))
    assert [(w["cluster"], w["node"], w["reason"]) for w in listed] == [
        ("pvesim", "", "rack move"),
        ("pvesim", "pve1", REASON),
    ]
    assert set(listed[0]) == {"cluster", "node", "reason", "since", "by"}
    assert listed[0]["by"]  # the operating-system user who ran it
    assert "maintenance off on pvesim/pve1" in _command(
        "off", "--cluster", "pvesim", "--node", "pve1"
    )
    assert [w["node"] for w in json.loads(_command("status", "--json"))] == [""]
    assert "was not on" in _command("off", "--cluster", "pvesim", "--node", "pve1")


def test_the_service_refuses_an_empty_reason(sim: Sim) -> None:
    with pytest.raises(MaintenanceInputError, match="reason is required"):
        maintenance_start(cluster=sim.cluster, reason="  ", user=None)
    assert not MaintenanceWindow.objects.exists()


def test_every_admin_page_shows_the_banner_while_maintenance_is_on(
    pump: Pump, sim: Sim, people: People
) -> None:
    client = people.client("viewer")
    pages = ["/admin/", "/admin/provisioning/proxy/", "/admin/provisioning/cluster/"]
    for page in pages:
        assert b"Maintenance is on" not in client.get(page).content
    _on(sim, "pve1", user=people.operator)
    for page in pages:
        body = client.get(page).content.decode()
        assert "Maintenance is on for pvesim/pve1" in body, page
        assert REASON in body and "turned on by olivia" in body
    pump.call(maintenance_end, cluster=sim.cluster, node="pve1")
    for page in pages:
        assert b"Maintenance is on" not in client.get(page).content


def _cluster_action(action: str, sim: Sim, **extra: str) -> dict[str, str]:
    return {"action": action, "_selected_action": str(sim.cluster.pk), **extra}


def test_the_cluster_actions_need_the_permission_and_turn_it_on_and_off(
    pump: Pump, sim: Sim, people: People
) -> None:
    from django.contrib.auth.models import Permission

    url = "/admin/provisioning/cluster/"
    start = _cluster_action("start_maintenance", sim, post="yes", node="pve1", reason="disk swap")
    # An operator without the permission is not offered it, and a forged POST is refused.
    operator = people.client("operator")
    assert b"start_maintenance" not in operator.get(url).content
    assert operator.post(url, start).status_code == 403
    assert not MaintenanceWindow.objects.exists()

    people.operator.user_permissions.add(Permission.objects.get(codename="change_maintenance"))
    operator = people.client("operator")
    form = operator.post(url, _cluster_action("start_maintenance", sim))
    assert b'name="reason"' in form.content and b"pve2" in form.content
    bad = operator.post(url, {**start, "reason": ""})
    assert bad.status_code == 200 and not MaintenanceWindow.objects.exists()
    operator.post(url, start)
    window = MaintenanceWindow.objects.get()
    assert (window.node, window.reason, window.started_by) == ("pve1", "disk swap", "olivia")

    # An operation it holds says so in the journal's list.
    pump.call(operations.proxy_create, spec=proxy_spec(sim, "m0", zone="pve1"))
    _run_due(pump)
    journal = operator.get("/admin/provisioning/operation/").content.decode()
    assert '<span class="ph-badge ph-warn">waiting for maintenance</span>' in journal

    with posting():
        operator.post(url, _cluster_action("end_maintenance", sim))
    assert not MaintenanceWindow.objects.exists()
    _drop_stale(pump)
    pump.run()
    assert Proxy.objects.get().phase == Phase.RUNNING


def test_a_template_build_waits_for_its_node_like_an_operation(pump: Pump, sim: Sim) -> None:
    from provisioning.models import Template
    from provisioning.models.choices import RequestedVia
    from provisioning.services.template_builds import BuildSpec, template_build_start
    from tests.support.imageserver import image_server

    with image_server(b"cloud-image" * 200) as served:
        spec = BuildSpec(
            key="debian-13-built",
            node="pve1",
            image_url=served.url(),
            checksum=served.checksum,
            vmid=9100,
            storage="local-lvm",
            bridge="vmbr0",
            template_version="debian-13-genericcloud-20261016",
            guest_user="debian",
        )
        _on(sim, "pve1")
        sim.engine.ledger.clear()
        (op,) = pump.call(
            template_build_start,
            cluster=sim.cluster,
            spec=spec,
            user=None,
            via=RequestedVia.COMMAND,
        )
        _run_due(pump)
        assert sim.engine.ledger.mutations() == []
        op.refresh_from_db()
        assert op.state == OperationState.WAITING and op.last_error.startswith(
            "waiting for maintenance on pve1"
        )
        _off(pump, sim, "pve1")
        pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED, op.last_error
    assert Template.objects.filter(key="debian-13-built").exists()
