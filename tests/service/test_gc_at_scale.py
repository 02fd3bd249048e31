"""GC's cost at a moderate scale, counted from the simulator's ledger (issue 12).

One sweep is one listing plus one config read per VM that could be garbage. A VM named for a
live proxy can never be garbage (DESIGN.md §5), so a healthy fleet costs its config no read:
the listing's name settles it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pump import Pump, Sim

from provisioning.models import Installation, Proxy
from provisioning.models.choices import Phase
from provisioning.proxmox.ids import format_provider_id
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.observe import is_candidate
from provisioning.services.gc import gc_run

pytestmark = pytest.mark.django_db

CONFIG = "GET /nodes/{node}/qemu/{vmid}/config"
LISTING = "GET /cluster/resources"
SEEDS = "GET /nodes/{node}/storage/{storage}/content"

LIVE, ORPHANS, THEIRS, OTHERS = 200, 40, 20, 40  # 300 VMs beside the templates
LIVE_UID = "0000aaaa-0000-4000-8000-{i:012d}"
ORPHAN_UID = "0000bbbb-0000-4000-8000-{i:012d}"


def _seed(
    sim: Sim, *, orphans: int = ORPHANS, theirs: int = THEIRS
) -> tuple[list[int], list[int], list[int]]:
    """``LIVE`` running proxies of ours (VM and row), ``orphans`` old VMs of ours no row owns,
    ``theirs`` old VMs of another installation and ``OTHERS`` unrelated workloads."""
    ours = Installation.current_id()
    old = datetime.now(UTC) - timedelta(hours=2)
    control = sim.engine.control
    live = control.create_vms(
        count=LIVE,
        start_vmid=100000,
        name_prefix="proxy-live-",
        running=True,
        description=render_mark(LIVE_UID, old, ours),
    )
    orphan_vmids = control.create_vms(
        count=orphans,
        start_vmid=200000,
        name_prefix="proxy-orphan-",
        description=render_mark(ORPHAN_UID, old, ours),
    )
    their_vmids = control.create_vms(
        count=theirs,
        start_vmid=300000,
        name_prefix="proxy-theirs-",
        description=render_mark(ORPHAN_UID, old, "another-installation"),
    )
    control.create_vms(count=OTHERS, start_vmid=400000, name_prefix="other-", tags=None)
    by_vmid = {int(v["vmid"]): v for v in sim.api.cluster_resources()}
    now = datetime.now(UTC)
    Proxy.objects.bulk_create(
        Proxy(
            name=str(by_vmid[vmid]["name"]).removeprefix("proxy-"),
            uid=uuid.UUID(LIVE_UID.format(i=i)),
            cluster=sim.cluster,
            machine_type="small",
            image="debian-13",
            phase=Phase.RUNNING,
            provider_id=format_provider_id(vmid, str(by_vmid[vmid]["name"])),
            vmid=vmid,
            node=str(by_vmid[vmid]["node"]),
            ip=f"10.0.{i >> 8}.{i & 255}",
            vm_created_at=now,
            observed_at=now,
        )
        for i, vmid in enumerate(live)
    )
    return live, orphan_vmids, their_vmids


def _candidates_before(sim: Sim) -> set[int]:
    """The default cluster's own ``proxy-*`` VMs (an unmarked one, another installation's)."""
    return {int(e["vmid"]) for e in sim.api.cluster_resources() if is_candidate(e)}


def test_a_sweep_reads_config_only_for_vms_that_could_be_garbage(pump: Pump, sim: Sim) -> None:
    default = _candidates_before(sim)
    live, orphans, theirs = _seed(sim)
    nodes = {str(e["node"]) for e in sim.api.cluster_resources()}
    sim.engine.ledger.clear()

    plan = pump.call(gc_run, dry_run=True)

    assert sorted(i.vmid for i in plan) == sorted(orphans)
    ledger = sim.engine.ledger
    assert ledger.count("GET", LISTING) == 1
    read = {int(e.path_params["vmid"]) for e in ledger.calls("GET", CONFIG)}
    assert read == set(orphans) | set(theirs) | default  # the candidates, each once
    assert ledger.count("GET", CONFIG) == ORPHANS + THEIRS + len(default)
    assert not read & set(live)  # the listing's name settles a live proxy's VM
    assert ledger.count("GET", SEEDS) == len(nodes)  # the seed listing, once per node
    assert len(ledger.calls()) == 1 + ORPHANS + THEIRS + len(default) + len(nodes)


def test_a_healthy_fleet_costs_one_listing_and_no_config_read(pump: Pump, sim: Sim) -> None:
    default = _candidates_before(sim)
    _seed(sim, orphans=0, theirs=0)
    sim.engine.ledger.clear()

    assert pump.call(gc_run, dry_run=True) == []

    assert sim.engine.ledger.count("GET", LISTING) == 1
    # The default cluster's two foreign proxy-* VMs are read; none of the 200 live proxies.
    assert sim.engine.ledger.count("GET", CONFIG) == len(default) == 2
