"""The operation journal and its driver: one step per delivery, leases, retries, receipts."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from pump import Pump, Sim

from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationKind, OperationState, Phase, StepState
from provisioning.services import dispatch, operations
from provisioning.services.driver import operation_run_step
from provisioning.services.operations import IdempotencyConflict, ProxySpec
from provisioning.services.sweeper import operations_sweep

pytestmark = pytest.mark.django_db

CLONE = "POST /nodes/{node}/qemu/{vmid}/clone"
DESTROY = "DELETE /nodes/{node}/qemu/{vmid}"
CONFIG = "PUT /nodes/{node}/qemu/{vmid}/config"


def _spec(sim: Sim, name: str = "alpha", **kwargs: object) -> ProxySpec:
    fields: dict[str, object] = {
        "name": name,
        "cluster": sim.cluster,
        "machine_type": "small",
        "image": "debian-13",
        "zone": "pve1",
        "cloud_init": b"#cloud-config\nhostname: alpha\n",
    }
    fields.update(kwargs)
    return ProxySpec(**fields)  # type: ignore[arg-type]


def _create(pump: Pump, sim: Sim, name: str = "alpha", **kwargs: object) -> Operation:
    op = pump.call(operations.proxy_create, spec=_spec(sim, name, **kwargs))
    pump.run()
    op.refresh_from_db()
    return op


def test_create_runs_to_running_and_journals_every_step(pump: Pump, sim: Sim) -> None:
    op = _create(pump, sim)
    proxy = Proxy.objects.get(name="alpha")
    assert op.state == OperationState.SUCCEEDED
    assert proxy.phase == Phase.RUNNING and proxy.ip and proxy.provider_id
    assert proxy.vm_created_at is not None
    steps = list(op.steps.values_list("name", "state", "upid"))
    names = [s[0] for s in steps]
    assert names == [
        "lookup",
        "clone",
        "upload",
        "configure",
        "resize",
        "start",
        "running",
        "address",
        "seed_release",
    ]
    assert all(state == StepState.SUCCEEDED for _, state, _ in steps)
    upids = {name: upid for name, _, upid in steps}
    for name in ("clone", "upload", "resize", "start"):
        assert upids[name].startswith("UPID:pve1:"), name
    assert sim.ledger_mutations().count(CLONE) == 1


def test_the_seed_is_ejected_and_removed_once_the_guest_has_its_address(
    pump: Pump, sim: Sim
) -> None:
    """Issue 11: the seed holds the user-data; once the boot that read it is over it leaves the
    VM and the storage, and the proxy stays Running with its address."""
    _create(pump, sim)
    proxy = Proxy.objects.get()
    assert proxy.phase == Phase.RUNNING and proxy.ip
    config = sim.api.vm_config(proxy.node, int(proxy.vmid or 0))
    assert config["ide2"] == "none,media=cdrom"
    seeds = sim.api.storage_content(proxy.node, "proxy-seeds", content="iso")
    assert not [s for s in seeds if s["volid"].startswith("proxy-seeds:iso/proxy-alpha")]
    # Ejected strictly after the address was read: the seed's last use was that boot.
    calls = sim.engine.ledger.calls()
    agent = max(e.seq for e in calls if "agent/network-get-interfaces" in str(e.key))
    ejects = [e for e in calls if e.key == CONFIG and "ide2" in e.params]
    assert [e.params["ide2"] for e in ejects][-1] == "none,media=cdrom"
    assert ejects[-1].seq > agent


def test_a_proxy_without_its_seed_is_neither_drifted_nor_broken_and_survives_a_reboot(
    pump: Pump, sim: Sim
) -> None:
    """After the release, reconcile sees a healthy proxy (no replace, no write), and a reboot
    brings it back with its address: the guest keeps the agent its first boot installed."""
    from provisioning.services.reconcile import reconcile_round

    _create(pump, sim)
    proxy = Proxy.objects.get()
    address = proxy.ip
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    pump.run()
    assert sim.engine.ledger.mutations() == []
    assert Operation.objects.count() == 1
    reboot = pump.call(operations.proxy_power, proxy=proxy, action="reboot")
    pump.run()
    reboot.refresh_from_db()
    proxy.refresh_from_db()
    assert reboot.state == OperationState.SUCCEEDED
    assert (proxy.phase, proxy.ip) == (Phase.RUNNING, address)
    assert sim.api.vm_config(proxy.node, int(proxy.vmid or 0))["ide2"] == "none,media=cdrom"
    pump.call(reconcile_round)
    pump.run()
    assert not Operation.objects.filter(kind=OperationKind.REPLACE).exists()


def test_keep_seed_iso_leaves_it_attached_and_on_storage(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    settings.PROXYHUB_KEEP_SEED_ISO = True
    op = _create(pump, sim)
    proxy = Proxy.objects.get()
    assert op.state == OperationState.SUCCEEDED and proxy.phase == Phase.RUNNING
    assert "seed_release" not in op.steps.values_list("name", flat=True)
    volid = sim.api.vm_config(proxy.node, int(proxy.vmid or 0))["ide2"].split(",")[0]
    assert volid.startswith("proxy-seeds:iso/proxy-alpha_")
    assert sim.engine.control.volume_data(proxy.node, volid) is not None


def test_create_sends_its_first_step_only_after_commit(
    sim: Sim, django_capture_on_commit_callbacks: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str, str, int]] = []
    monkeypatch.setattr(
        "provisioning.services.dispatch.send_step",
        lambda op, token, countdown=0.0, trace_parent="", priority=0: sent.append(
            (op, token, trace_parent, priority)
        ),
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:  # type: ignore[operator]
        op = operations.proxy_create(spec=_spec(sim))
    assert sent == [] and len(callbacks) == 1
    callbacks[0]()
    # The message carries the operation's trace context (services.tracing), and goes as new
    # work, after steps of work under way (dispatch.PRIORITY_CAN_WAIT).
    assert sent == [(str(op.pk), op.dispatch_token, op.trace_parent, dispatch.PRIORITY_CAN_WAIT)]


def test_bad_placement_is_refused_and_nothing_written(sim: Sim) -> None:
    with pytest.raises(ValidationError) as caught:
        operations.proxy_create(spec=_spec(sim, image="arch", machine_type="huge"))
    assert "image" in caught.value.message_dict and "machine_type" in caught.value.message_dict
    assert "arch" in str(caught.value)
    assert not Proxy.objects.exists() and not Operation.objects.exists()


def test_a_blank_zone_is_placed_or_refused_as_the_zone_setting_says(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """Seed 000 entry 3 requires a zone on a cluster of several nodes; proxyhub places a blank
    zone itself (docs/operator-guide.md). ``PROXYHUB_ZONE_REQUIRED`` gives the seed's rule:
    the create is refused naming the field and the nodes allowed, and nothing is written."""
    settings.PROXYHUB_ZONE_REQUIRED = True
    with pytest.raises(ValidationError) as caught:
        operations.proxy_create(spec=_spec(sim, zone=""))
    assert list(caught.value.message_dict) == ["zone"]
    assert "placement.zone is required" in str(caught.value) and "pve1, pve2, pve3" in str(
        caught.value
    )
    assert not Proxy.objects.exists() and not Operation.objects.exists()
    settings.PROXYHUB_ZONE_REQUIRED = False
    op = pump.call(operations.proxy_create, spec=_spec(sim, zone=""))
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert Proxy.objects.get().node in ("pve1", "pve2", "pve3")


def test_idempotency_key_returns_the_same_operation_or_refuses(pump: Pump, sim: Sim) -> None:
    first = pump.call(operations.proxy_create, spec=_spec(sim), idempotency_key="k-1")
    again = pump.call(operations.proxy_create, spec=_spec(sim), idempotency_key="k-1")
    assert again.pk == first.pk
    with pytest.raises(IdempotencyConflict, match="k-1"):
        operations.proxy_create(spec=_spec(sim, zone="pve2"), idempotency_key="k-1")
    assert Proxy.objects.count() == 1


def test_duplicate_and_stale_deliveries_do_nothing(pump: Pump, sim: Sim) -> None:
    pump.call(operations.proxy_create, spec=_spec(sim))
    # Every message is delivered three times, as a broker redelivering would.
    original_send = pump.send

    def triple(op: str, token: str, countdown: float = 0.0) -> None:
        for _ in range(3):
            original_send(op, token, countdown)

    pump.send = triple  # type: ignore[method-assign]
    first = pump.queue[0]
    for _ in range(2):
        pump.send(first.operation_id, first.token, 0)
    pump.send = original_send  # type: ignore[method-assign]
    pump.run()
    assert Proxy.objects.get().phase == Phase.RUNNING
    counts = {k: sim.ledger_mutations().count(k) for k in set(sim.ledger_mutations())}
    # Two config writes by design (configure, then the seed's eject); everything else once.
    assert counts.pop(CONFIG) == 2
    assert all(n == 1 for n in counts.values()), counts


def test_lost_messages_are_re_sent_by_the_sweeper(pump: Pump, sim: Sim) -> None:
    pump.call(operations.proxy_create, spec=_spec(sim))
    for _ in range(4):  # a few steps, then the broker loses the next message
        message = pump.queue.pop(0)
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    assert pump.drop_all() == 1
    op = Operation.objects.get()
    assert op.state in (OperationState.RUNNING, OperationState.WAITING)
    time.sleep(0.1)  # the lost step falls due
    assert pump.call(operations_sweep, grace=timedelta(0)) == 1
    pump.run()
    assert Proxy.objects.get().phase == Phase.RUNNING
    assert sim.ledger_mutations().count(CLONE) == 1


def test_permanent_error_latches_failed_and_retry_clears_it(pump: Pump, sim: Sim) -> None:
    sim.engine.control.deny("/vms", "VM.PowerMgmt")
    op = _create(pump, sim)
    proxy = Proxy.objects.get()
    assert op.state == OperationState.FAILED and op.error_class == "permanent"
    assert proxy.phase == Phase.FAILED and "VM.PowerMgmt" in proxy.last_error
    assert proxy.last_error_class == "permanent"
    failed_step = op.steps.get(state=StepState.FAILED)
    assert "VM.PowerMgmt" in failed_step.message
    sim.engine.control.allow()
    retry = pump.call(operations.proxy_retry, proxy=proxy)
    pump.run()
    retry.refresh_from_db()
    proxy.refresh_from_db()
    assert retry.state == OperationState.SUCCEEDED and proxy.phase == Phase.RUNNING
    assert proxy.last_error == ""


def test_transient_error_is_retried_and_visible_in_the_journal(pump: Pump, sim: Sim) -> None:
    sim.engine.control.fail_call("POST", "/nodes/{node}/qemu/{vmid}/clone", kind="595", times=2)
    op = _create(pump, sim)
    assert op.state == OperationState.SUCCEEDED
    lookup_or_clone = op.steps.get(name="clone")
    assert lookup_or_clone.state == StepState.SUCCEEDED
    # The two refusals were retried; the journal row kept the last word of each attempt.
    assert sim.engine.ledger.count("POST", CLONE) == 3
    assert sim.ledger_mutations().count(CLONE) == 1


def test_delete_removes_vm_seed_and_row_and_keeps_the_journal(pump: Pump, sim: Sim) -> None:
    _create(pump, sim)
    proxy = Proxy.objects.get()
    vmid = proxy.vmid
    op = pump.call(operations.proxy_request_delete, proxy=proxy)
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED and op.kind == OperationKind.DELETE
    assert not Proxy.objects.exists()
    assert op.proxy is None and op.proxy_name == "alpha"
    assert Operation.objects.filter(proxy_name="alpha").count() == 2
    assert not [e for e in sim.api.cluster_resources() if e.get("vmid") == vmid]
    seeds = sim.api.storage_content("pve1", "proxy-seeds", content="iso")
    assert not [s for s in seeds if "proxy-alpha-seed.iso" in s["volid"]]
    assert sim.ledger_mutations().count(DESTROY) == 1


def test_delete_supersedes_a_running_create(pump: Pump, sim: Sim) -> None:
    create = pump.call(operations.proxy_create, spec=_spec(sim))
    for _ in range(3):
        message = pump.queue.pop(0)
        pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    delete = pump.call(operations.proxy_request_delete, proxy=Proxy.objects.get())
    pump.run()
    create.refresh_from_db()
    delete.refresh_from_db()
    assert create.state == OperationState.FAILED and "superseded" in create.last_error
    assert delete.state == OperationState.SUCCEEDED
    assert not Proxy.objects.exists()


def test_one_chain_per_proxy(pump: Pump, sim: Sim) -> None:
    """A power action asked for while a replace runs is refused, so nothing runs between the
    replace's steps; once the replace is done, the power action goes through."""
    _create(pump, sim)
    proxy = Proxy.objects.get()
    replace = pump.call(operations.proxy_replace, proxy=proxy)
    message = pump.queue.pop(0)
    pump.call(operation_run_step, operation_id=message.operation_id, token=message.token)
    with pytest.raises(ValidationError, match="being replaced"):
        operations.proxy_power(proxy=Proxy.objects.get(), action="reboot")
    pump.run()
    replace.refresh_from_db()
    assert replace.state == OperationState.SUCCEEDED
    reboot = pump.call(operations.proxy_power, proxy=Proxy.objects.get(), action="reboot")
    pump.run()
    reboot.refresh_from_db()
    assert reboot.state == OperationState.SUCCEEDED
    # The reboot's first Proxmox call came after the replace's start.
    calls = sim.engine.ledger.calls()
    reboots = [e for e in calls if e.key == "POST /nodes/{node}/qemu/{vmid}/status/reboot"]
    starts = [e for e in calls if e.key == "POST /nodes/{node}/qemu/{vmid}/status/start"]
    assert reboots and max(e.seq for e in starts) < reboots[0].seq


def test_replace_on_cloud_init_change_builds_a_new_vm(pump: Pump, sim: Sim, settings: Any) -> None:
    settings.PROXYHUB_KEEP_SEED_ISO = True  # to read the new seed back
    _create(pump, sim)
    proxy = Proxy.objects.get()
    op = pump.call(operations.proxy_update, proxy=proxy, cloud_init=b"#cloud-config\nnew: 1\n")
    assert op is not None and op.kind == OperationKind.REPLACE
    pump.run()
    op.refresh_from_db()
    proxy.refresh_from_db()
    assert op.state == OperationState.SUCCEEDED
    assert proxy.phase == Phase.RUNNING
    assert sim.ledger_mutations().count(DESTROY) == 1
    assert sim.ledger_mutations().count(CLONE) == 2
    volid = sim.api.vm_config("pve1", int(proxy.vmid or 0))["ide2"].split(",")[0]
    seed = sim.engine.control.volume_data("pve1", volid)
    assert seed is not None and b"new: 1" in seed
    assert (
        pump.call(operations.proxy_update, proxy=proxy, cloud_init=b"#cloud-config\nnew: 1\n")
        is None
    )


def test_steps_are_rows_per_stage_with_durations(pump: Pump, sim: Sim) -> None:
    op = _create(pump, sim)
    for step in OperationStep.objects.filter(operation=op):
        assert step.finished_at is not None and step.duration is not None and step.duration >= 0


def test_shutdown_stays_stopped_and_start_follows_the_boot(pump: Pump, sim: Sim) -> None:
    from provisioning.services.reconcile import reconcile_round

    _create(pump, sim)
    proxy = Proxy.objects.get()
    shutdown = pump.call(operations.proxy_power, proxy=proxy, action="shutdown")
    pump.run()
    shutdown.refresh_from_db()
    proxy.refresh_from_db()
    assert shutdown.state == OperationState.SUCCEEDED
    assert (proxy.phase, proxy.desired_power, proxy.ip) == (Phase.STOPPED, "off", None)
    assert sim.api.vm_status(proxy.node, proxy.vmid)["status"] == "stopped"
    # A deliberately stopped proxy stays stopped: reconcile starts nothing.
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    pump.run()
    assert sim.engine.ledger.mutations() == []

    start = pump.call(operations.proxy_power, proxy=proxy, action="start")
    pump.run()
    start.refresh_from_db()
    proxy.refresh_from_db()
    assert start.state == OperationState.SUCCEEDED
    assert proxy.phase == Phase.RUNNING and proxy.ip
    assert [s.name for s in start.steps.all()][-1] == "address"


def test_who_asked_is_kept_as_text_when_the_user_is_deleted(pump: Pump, sim: Sim) -> None:
    """Issue 11, audit: the journal says who asked even after that user is deleted, and a
    command's operation names the operating-system user who ran it."""
    import getpass

    from django.contrib.auth.models import User

    from provisioning.admin.display import requested_by

    olivia = User.objects.create_user("olivia", password="x" * 12, is_staff=True)
    op = pump.call(operations.proxy_create, spec=_spec(sim, "asked"), user=olivia, via="admin")
    olivia.delete()
    op.refresh_from_db()
    assert op.requested_by is None and op.requested_by_name == "olivia"
    assert requested_by(op) == "olivia (console)"
    by_command = pump.call(operations.proxy_create, spec=_spec(sim, "scripted"))
    assert by_command.requested_by_name == getpass.getuser()
    assert requested_by(by_command) == f"{getpass.getuser()} (command)"
