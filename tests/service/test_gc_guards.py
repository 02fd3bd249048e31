"""GC that cannot run away (issue 10): a cap per round with what it held back on record, the
installation identity kept outside the database as well, names of any length, and rounds whose
deadline, task time limits and job lease agree."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from pump import Pump, Sim

from provisioning.models import GcRound, Installation, Operation, Proxy
from provisioning.models.choices import OperationKind, OperationState
from provisioning.proxmox.marks import render_mark
from provisioning.services import operations
from provisioning.services.clock import db_now
from provisioning.services.gc import GcRefused, gc_run
from provisioning.services.installation import installation_id
from provisioning.services.operations import ProxySpec
from provisioning.services.rounds import RoundTiming, round_timing, timing_problems

pytestmark = pytest.mark.django_db

LISTING = "GET /cluster/resources"


def _orphan(sim: Sim, vmid: int, name: str, *, uid: str | None = None, age_s: int = 3600) -> None:
    created = datetime.now(UTC) - timedelta(seconds=age_s)
    mark = render_mark(str(uuid.uuid4()), created, installation_id())
    if uid == "":
        # A mark whose uid line is empty (seed 000 adopts such a VM by its name).
        mark = "\n".join(
            "proxyhub-uid=" if line.startswith("proxyhub-uid=") else line
            for line in mark.splitlines()
        )
    sim.api.clone("pve1", 9000, newid=vmid, name=name, description=mark)


def _names(sim: Sim) -> set[str]:
    return {str(e.get("name")) for e in sim.api.cluster_resources()}


def test_a_round_removes_at_most_the_cap_and_records_what_it_held_back(
    pump: Pump, sim: Sim, settings: Any, admin_client: Client
) -> None:
    settings.PROXYHUB_GC_MAX_DELETES_PER_ROUND = 2
    for i in range(5):
        _orphan(sim, 150010 + i, f"proxy-orphan-{i}", age_s=3600 + 60 * i)
    sim.settle()
    first = pump.call(gc_run)
    pump.run()
    assert len(first) == 2
    assert {i.name for i in first} == {"proxy-orphan-4", "proxy-orphan-3"}  # oldest first
    record = GcRound.objects.get()
    assert len(record.removed) == 2 and len(record.held_back) == 3
    assert not {"proxy-orphan-4", "proxy-orphan-3"} & _names(sim)
    page = admin_client.get(f"/admin/provisioning/gcround/{record.pk}/change/").content.decode()
    assert "Held back for the next round" in page and "vm proxy-orphan-0 on pvesim/pve1" in page
    pump.call(gc_run)
    pump.run()
    pump.call(gc_run)
    pump.run()
    assert not any(n.startswith("proxy-orphan-") for n in _names(sim))
    assert GcRound.objects.count() == 3


def test_gc_refuses_when_the_identity_outside_the_database_disagrees(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    """A database restored or copied from another installation: its VMs look like orphans of
    ours. GC deletes nothing, says why, and the dry run still shows what it would do."""
    _orphan(sim, 150020, "proxy-orphan")
    sim.settle()
    settings.PROXYHUB_INSTALLATION_ID = "ph-staging00001"
    sim.engine.ledger.clear()
    with pytest.raises(GcRefused, match="restored or copied") as refused:
        pump.call(gc_run)
    assert installation_id() in str(refused.value) and "ph-staging00001" in str(refused.value)
    assert sim.engine.ledger.mutations() == []
    assert not Operation.objects.filter(kind=OperationKind.DELETE).exists()
    assert GcRound.objects.get().refused[0]["reason"] == str(refused.value)
    assert [i.name for i in pump.call(gc_run, dry_run=True)] == ["proxy-orphan"]
    with pytest.raises(CommandError, match="restored or copied"):
        call_command("gc", stdout=io.StringIO(), stderr=io.StringIO())


def test_creates_refuse_to_mark_vms_with_another_installations_identity(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    installation_id()  # the database has its identity already
    settings.PROXYHUB_INSTALLATION_ID = "ph-staging00002"
    spec = ProxySpec(
        name="copy", cluster=sim.cluster, machine_type="small", image="debian-13", zone="pve1"
    )
    op = pump.call(operations.proxy_create, spec=spec)
    pump.run()
    op.refresh_from_db()
    assert op.state == OperationState.FAILED and "restored or copied" in op.last_error
    assert sim.engine.ledger.mutations() == []


def test_gc_refuses_when_the_identity_is_only_in_the_database(
    pump: Pump, sim: Sim, settings: Any, tmp_path: Path
) -> None:
    ours = installation_id()
    Path(settings.PROXYHUB_INSTALLATION_ID_FILE).unlink()  # an older installation, say
    _orphan(sim, 150030, "proxy-orphan")
    sim.settle()
    with pytest.raises(GcRefused, match=f"set PROXYHUB_INSTALLATION_ID={ours}"):
        pump.call(gc_run)
    settings.PROXYHUB_INSTALLATION_ID = ours
    assert [i.name for i in pump.call(gc_run)] == ["proxy-orphan"]


def test_a_fresh_database_takes_the_configured_identity(sim: Sim, settings: Any) -> None:
    Installation.objects.all().delete()
    settings.PROXYHUB_INSTALLATION_ID = "ph-configured01"
    assert installation_id() == "ph-configured01"
    assert Installation.objects.get().installation_id == "ph-configured01"


def test_a_candidate_with_a_name_longer_than_the_journal_column_is_collected(
    pump: Pump, sim: Sim
) -> None:
    long_name = "proxy-" + "x" * 70
    _orphan(sim, 150040, long_name)
    _orphan(sim, 150041, "proxy-short-orphan")
    sim.settle()
    removed = pump.call(gc_run)
    pump.run()
    assert sorted(i.name for i in removed) == sorted([long_name, "proxy-short-orphan"])
    assert long_name not in _names(sim)
    op = Operation.objects.get(progress__target__vm_name=long_name)
    assert op.state == OperationState.SUCCEEDED and len(op.proxy_name) == 57


def test_gc_never_collects_a_vm_named_for_a_live_proxy(pump: Pump, sim: Sim) -> None:
    """Seed 000 adopts a VM whose mark has an empty uid; its name is what ties it to the
    proxy, and GC must not take it for an orphan."""
    proxy = Proxy(name="adopted", cluster=sim.cluster, machine_type="small", image="debian-13")
    proxy.set_cloud_init(b"")
    proxy.save()
    _orphan(sim, 150050, "proxy-adopted", uid="")
    sim.settle()
    assert pump.call(gc_run, dry_run=True) == []
    assert "proxy-adopted" in _names(sim)


def test_round_timings_agree_with_their_job_lease(settings: Any) -> None:
    timing = round_timing()
    assert timing.lease < timing.deadline < timing.soft_time_limit < timing.time_limit
    assert timing_problems() == []
    too_short = RoundTiming(deadline=240, soft_time_limit=270, time_limit=300, lease=2)
    (problem,) = timing_problems(too_short)
    assert "PROXYHUB_JOB_LEASE_SECONDS (2) must be at least 3 s" in problem
    too_long = RoundTiming(deadline=240, soft_time_limit=270, time_limit=300, lease=360)
    (problem,) = timing_problems(too_long)
    assert "must not exceed the round deadline" in problem


def test_the_system_check_refuses_inconsistent_round_settings(settings: Any) -> None:
    from provisioning.checks import round_timing_check

    assert round_timing_check() == []
    settings.PROXYHUB_JOB_LEASE_SECONDS = 600
    (error,) = round_timing_check()
    assert error.id == "proxyhub.E002" and "PROXYHUB_JOB_LEASE_SECONDS" in error.msg


@pytest.mark.django_db(transaction=True)
def test_a_job_lease_is_renewed_while_its_round_runs_and_lapses_when_it_dies(
    settings: Any,
) -> None:
    """A round's lease is short: renewed while the round runs, so a second round cannot start
    beside a long first one; not renewed once its holder is gone, so it frees within its length
    (a worker killed mid-round no longer stops reconcile for minutes)."""
    import time

    from provisioning.models import JobLease
    from provisioning.services.leases import LeaseHeld, job_lease

    with job_lease("reconcile", seconds=0.6):
        time.sleep(1.5)  # two and a half lease lengths
        with pytest.raises(LeaseHeld), job_lease("reconcile", seconds=0.6):
            pass
    # A holder that died without releasing: its row says held, nobody renews it.
    JobLease.objects.filter(name="reconcile").update(
        holder="dead", expires_at=db_now() + timedelta(seconds=0.6)
    )
    with pytest.raises(LeaseHeld), job_lease("reconcile", seconds=0.6):
        pass
    time.sleep(0.7)
    with job_lease("reconcile", seconds=0.6) as holder:
        assert holder != "dead"


def test_a_round_stops_starting_work_at_its_deadline(pump: Pump, sim: Sim, settings: Any) -> None:
    """Rounds started from a command have a limit too: past the deadline no proxy is looked at."""
    from provisioning.services.reconcile import reconcile_round

    settings.PROXYHUB_ROUND_DEADLINE_SECONDS = 0
    late = Proxy(name="late", cluster=sim.cluster, machine_type="small", image="debian-13")
    late.set_cloud_init(b"")
    late.save()
    counts = pump.call(reconcile_round)
    assert counts["past_deadline"] >= 1 and counts["create"] == 0
    assert not Operation.objects.exists()
