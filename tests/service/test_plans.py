"""Plan preview and preflight for proxies (seed 003; DESIGN.md §5): the Django doors.

The preview asks Proxmox nothing and the preflight only reads; neither writes a proxy, an
operation or a step. Counts of what reached Proxmox come from the simulator's ledger.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from pump import Pump, Sim

from provisioning import sealing
from provisioning.models import Operation, OperationStep, Proxy
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.ids import vmid_for
from provisioning.proxmox.plan import hash_input
from provisioning.proxmox.preflight import CHECK_CODES
from provisioning.services import operations
from provisioning.services.operations import ProxySpec
from provisioning.services.placement import choose_node
from provisioning.services.plans import plan_for_spec, plan_preview, preflight_proxy

pytestmark = pytest.mark.django_db

SECRET_CLOUD_INIT = b"#cloud-config\nchpasswd: {list: 'root:PLAN-SECRET-42'}\n"


def _proxy(sim: Sim, name: str = "alpha", **fields: object) -> Proxy:
    values: dict[str, object] = {
        "name": name,
        "cluster": sim.cluster,
        "zone": "pve1",
        "machine_type": "small",
        "image": "debian-13",
    }
    values.update(fields)
    proxy = Proxy(**values)
    proxy.set_cloud_init(SECRET_CLOUD_INIT)
    proxy.save()
    return proxy


def _written() -> tuple[int, int, int]:
    return Proxy.objects.count(), Operation.objects.count(), OperationStep.objects.count()


def test_preview_asks_proxmox_nothing_and_hides_the_cloud_init(sim: Sim) -> None:
    proxy = _proxy(sim)
    before = _written()
    plan = plan_preview(proxy)
    assert sim.engine.ledger.calls() == []
    assert _written() == before
    assert plan.uid == str(proxy.uid)
    assert plan.vmid_candidate == vmid_for(proxy.uid, 0, 100000, 199999)
    # Keyed (HMAC), so the shown digest confirms no guessed cloud-init.
    assert plan.cloud_init_sha256 == sealing.digest(SECRET_CLOUD_INIT)
    assert plan.cloud_init_sha256 != hashlib.sha256(SECRET_CLOUD_INIT).hexdigest()
    for text in (json.dumps(plan.as_dict()), hash_input(plan)):
        assert "PLAN-SECRET-42" not in text
    assert plan_preview(proxy).plan_hash == plan.plan_hash


def test_preview_of_a_blank_zone_names_the_node_placement_picks(sim: Sim) -> None:
    _proxy(sim, "busy-1", node="pve1")
    _proxy(sim, "busy-2", node="pve2")
    proxy = _proxy(sim, "blank", zone="")
    config = sim.cluster.proxmox_config("any")
    plan = plan_preview(proxy)
    assert plan.node == choose_node(sim.cluster, config)
    assert plan.node_source == "placement"
    # Once its VM exists, the plan stays on the node the VM was observed on.
    Proxy.objects.filter(pk=proxy.pk).update(node="pve1")
    proxy.refresh_from_db()
    assert plan_preview(proxy).node == "pve1"


def test_preview_of_an_unknown_image_is_the_creates_error(sim: Sim) -> None:
    proxy = _proxy(sim, image="arch")
    with pytest.raises(PermanentError) as raised:
        plan_preview(proxy)
    assert 'placement.image "arch" is not in proxmox.templates' in str(raised.value)


def test_plan_for_spec_writes_nothing_and_has_no_uid_yet(sim: Sim) -> None:
    spec = ProxySpec(
        name="future",
        cluster=sim.cluster,
        machine_type="small",
        image="debian-13",
        cloud_init=SECRET_CLOUD_INIT,
    )
    before = _written()
    plan = plan_for_spec(spec)
    assert _written() == before
    assert sim.engine.ledger.calls() == []
    assert (plan.uid, plan.vmid_candidate) == (None, None)
    assert plan.vm_name == "proxy-future"
    assert plan.node_source == "placement"
    # Keyed (HMAC), so the shown digest confirms no guessed cloud-init.
    assert plan.cloud_init_sha256 == sealing.digest(SECRET_CLOUD_INIT)
    assert plan.cloud_init_sha256 != hashlib.sha256(SECRET_CLOUD_INIT).hexdigest()
    assert plan_for_spec(spec).plan_hash == plan.plan_hash
    with pytest.raises(PermanentError):
        plan_for_spec(ProxySpec("Not_A_Label", sim.cluster, "small", "debian-13"))


def test_preflight_passes_with_gets_only_and_writes_nothing(sim: Sim) -> None:
    proxy = _proxy(sim)
    before = _written()
    report = preflight_proxy(proxy)
    assert report.all_passed, report.checks
    # "privileges" runs only for a cluster with a pool (issue 14); this one has none.
    assert [c.code for c in report.checks] == [c for c in CHECK_CODES if c != "privileges"]
    assert report.plan_hash == plan_preview(proxy).plan_hash
    assert {c.method for c in sim.engine.ledger.calls()} == {"GET"}
    assert sim.engine.ledger.mutations() == []
    assert _written() == before
    assert report.as_dict()["vmidReserved"] is False


def test_preflight_reports_a_cloud_init_template(sim: Sim) -> None:
    report = preflight_proxy(_proxy(sim, image="debian-13-cloudinit"))
    checks = {c.code: c.status for c in report.checks}
    assert checks["template_no_cloudinit_drive"] == "failed"
    assert not report.all_passed
    assert report.counts()["failed"] == 1


def test_preflight_out_of_time_is_all_unknown(sim: Sim) -> None:
    report = preflight_proxy(_proxy(sim), deadline_seconds=0)
    assert {c.status for c in report.checks} == {"unknown"}
    assert sim.engine.ledger.calls() == []


def test_the_plan_is_what_the_journal_of_a_real_create_shows(pump: Pump, sim: Sim) -> None:
    spec = ProxySpec(
        name="real",
        cluster=sim.cluster,
        machine_type="small",
        image="debian-13",
        zone="pve2",
        cloud_init=SECRET_CLOUD_INIT,
    )
    op = pump.call(operations.proxy_create, spec=spec)
    proxy = Proxy.objects.get(name="real")
    plan = plan_preview(proxy)
    pump.run()
    op.refresh_from_db()
    proxy.refresh_from_db()
    assert list(op.steps.order_by("seq").values_list("name", flat=True)) == [
        s.name for s in plan.steps
    ]
    assert (proxy.vmid, proxy.node) == (plan.vmid_candidate, plan.node)
    # The spec's plan differs only by what the saved proxy adds: its UID and VMID candidate.
    from_spec = plan_for_spec(spec)
    assert from_spec.plan_hash != plan.plan_hash
    # ... and the seed's name, which carries the uid's tag once there is a uid.
    assert from_spec.seed_iso_name.endswith("_<uid>-seed.iso")
    without_seed = {k: v for k, v in plan.configure.items() if k != "ide2"}
    assert from_spec.node == plan.node
    assert {k: v for k, v in from_spec.configure.items() if k != "ide2"} == without_seed
    assert [s.name for s in from_spec.steps] == [s.name for s in plan.steps]
