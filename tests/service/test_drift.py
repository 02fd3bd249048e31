"""Drift (issue 14): reconcile finds a proxy VM's cores, memory and net0 changed behind its back,
shows what differs, and under the cluster's ``repair`` policy sets them back, rebooting only
when Proxmox keeps the change pending. Every change "behind its back" is made through the
simulator's own API, as an operator in the Proxmox UI would; every count is the ledger's."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse
from pump import Pump, Sim, past_first_identity_reads, running_fleet

from provisioning.models import Operation, Proxy
from provisioning.models.choices import DriftPolicy, OperationKind, OperationState, Phase
from provisioning.proxmox.api import Call
from provisioning.proxmox.netcfg import net0_mac
from provisioning.services import operations
from provisioning.services.reconcile import reconcile_round

pytestmark = pytest.mark.django_db

LISTING = "GET /cluster/resources"
CONFIG = "/nodes/{node}/qemu/{vmid}/config"
PUT_CONFIG = "PUT /nodes/{node}/qemu/{vmid}/config"
REBOOT = "POST /nodes/{node}/qemu/{vmid}/status/reboot"
MAC = "BC:24:11:AA:BB:CC"


@pytest.fixture
def networked(sim: Sim) -> Sim:
    """The cluster sets bridge and VLAN tag, so net0's bridge and tag are part of the spec; the
    nodes have a second bridge an operator could move a VM to."""
    sim.cluster.bridge, sim.cluster.vlan_tag = "vmbr0", 20
    sim.cluster.save()
    for node in sim.engine.cluster.nodes.values():
        node.bridges = ("vmbr0", "vmbr1")
    return sim


def _one(pump: Pump, sim: Sim) -> Proxy:
    (proxy,) = running_fleet(pump, sim, 1, zone="pve1")
    return proxy


def _policy(sim: Sim, policy: str) -> None:
    sim.cluster.drift_policy = policy
    sim.cluster.save()


def _config(sim: Sim, proxy: Proxy) -> dict[str, str]:
    return sim.api.vm_config(proxy.node, int(proxy.vmid or 0))


def _net0_with(sim: Sim, proxy: Proxy, **options: str) -> str:
    """The VM's net0 with some options replaced, as an operator would edit it."""
    parts = _config(sim, proxy)["net0"].split(",")
    for i, part in enumerate(parts):
        key = part.split("=", 1)[0]
        if key in options:
            parts[i] = f"{key}={options.pop(key)}"
    return ",".join(parts + [f"{k}={v}" for k, v in options.items()])


def _behind_its_back(sim: Sim, proxy: Proxy, change: str) -> dict[str, str]:
    values = {
        "cores": {"cores": "2"},
        "memory": {"memory": "2048"},
        "net0.bridge": {"net0": _net0_with(sim, proxy, bridge="vmbr1")},
        "net0.tag": {"net0": _net0_with(sim, proxy, tag="30")},
        "net0.mac": {"net0": _net0_with(sim, proxy, virtio=MAC)},
    }[change]
    sim.api.set_vm_config(proxy.node, int(proxy.vmid or 0), values)
    return values


def _restored_net0(sim: Sim, proxy: Proxy) -> str:
    """net0 as it was built: the spec's bridge, tag and MAC in the VM's own option order."""
    mac = str(proxy.vm_spec["mac"]).upper()
    return _net0_with(sim, proxy, bridge="vmbr0", tag="20", virtio=mac)


def _due_every_round(settings: Any) -> None:
    """Every converged proxy's config is due for its rotation read each round."""
    settings.PROXYHUB_DRIFT_RECHECK_SECONDS = 0


def _drifted_under_repair(pump: Pump, sim: Sim, settings: Any, change: str) -> Proxy:
    """A Running proxy whose VM had ``change`` made behind its back, on a cluster whose policy
    is ``repair``, due for a comparison this round; the ledger starts empty."""
    proxy = _one(pump, sim)
    _behind_its_back(sim, proxy, change)
    _policy(sim, DriftPolicy.REPAIR)
    _due_every_round(settings)
    sim.engine.ledger.clear()
    return proxy


@pytest.mark.parametrize(
    ("change", "want", "have"),
    [
        ("cores", "1", "2"),
        ("memory", "1024", "2048"),
        ("net0.bridge", "vmbr0", "vmbr1"),
        ("net0.tag", "20", "30"),
        ("net0.mac", None, MAC.lower()),
    ],
)
def test_each_drifted_field_is_shown_and_nothing_is_repaired_under_report(
    pump: Pump, networked: Sim, settings: Any, change: str, want: str | None, have: str
) -> None:
    sim = networked
    proxy = _one(pump, sim)
    built_mac = net0_mac(_config(sim, proxy)["net0"])
    _behind_its_back(sim, proxy, change)
    _due_every_round(settings)
    sim.engine.ledger.clear()

    counts = pump.call(reconcile_round)
    pump.run()

    proxy.refresh_from_db()
    assert counts["drift"] == 1
    assert proxy.drift == [{"field": change, "want": want or built_mac, "have": have}]
    assert proxy.phase == Phase.RUNNING
    # Under the default policy nothing is written to Proxmox and no operation starts.
    assert sim.engine.ledger.mutations() == []
    assert not Operation.objects.filter(proxy=proxy, kind=OperationKind.REPAIR).exists()


def test_drift_is_listed_by_the_command_and_the_admin(
    pump: Pump, networked: Sim, settings: Any, admin_client: Any
) -> None:
    sim = networked
    proxy = _one(pump, sim)
    _behind_its_back(sim, proxy, "net0.tag")
    _due_every_round(settings)
    pump.call(reconcile_round)

    out = StringIO()
    call_command("proxies", "list", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())
    assert row["drift"] == [{"field": "net0.tag", "want": "20", "have": "30"}]

    # The proxy's row is found by its link: its bare name ("p0") can turn up inside a random
    # token of the page (a CSRF token held "...Tp0px..." once and failed this test).
    row = reverse("admin:provisioning_proxy_change", args=[proxy.pk])
    listed = admin_client.get("/admin/provisioning/proxy/?drift=yes").content.decode()
    assert row in listed and "net0.tag 30 (want 20)" in listed
    assert row not in admin_client.get("/admin/provisioning/proxy/?drift=no").content.decode()
    page = admin_client.get(f"/admin/provisioning/proxy/{proxy.pk}/change/").content.decode()
    assert "<td>net0.tag</td><td>20</td><td>30</td>" in page


def test_a_converged_round_costs_one_listing_and_a_listing_change_one_read(
    pump: Pump, sim: Sim
) -> None:
    """Issue 12's budget: with nothing due, a converged fleet costs the listing alone. A change
    the listing shows (memory, hot-plugged) costs that VM one config read, and once explained
    it costs nothing again."""
    proxies = running_fleet(pump, sim, 4, zone="pve1")
    past_first_identity_reads(pump, sim)
    sim.engine.ledger.clear()
    assert pump.call(reconcile_round)["converged"] == 4
    assert len(sim.engine.ledger.calls()) == 1  # the listing

    target = proxies[0]
    vmid = int(target.vmid or 0)
    # A VM whose template enabled memory hot-plug: a memory change applies at once (§7.13), so
    # the listing's maxmem shows it.
    guest = sim.engine.cluster.guests[vmid]
    guest.config["hotplug"] = "network,disk,memory"
    guest.changed()
    sim.api.set_vm_config(target.node, vmid, {"memory": "1536"})
    assert sim.api.vm_config(target.node, vmid, current=True)["memory"] == "1536"
    sim.engine.ledger.clear()
    counts = pump.call(reconcile_round)
    assert counts["drift"] == 1 and counts["converged"] == 3
    assert sim.engine.ledger.count("GET", LISTING) == 1
    assert sim.engine.ledger.count("GET", CONFIG) == 1
    assert len(sim.engine.ledger.calls()) == 2
    target.refresh_from_db()
    assert target.drift == [{"field": "memory", "want": "1024", "have": "1536"}]

    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    assert len(sim.engine.ledger.calls()) == 1  # explained: not read again


def test_the_rotation_reads_a_bounded_share_of_the_fleet_per_round(
    pump: Pump, sim: Sim, settings: Any
) -> None:
    running_fleet(pump, sim, 4, zone="pve1")
    past_first_identity_reads(pump, sim)
    _due_every_round(settings)
    settings.PROXYHUB_DRIFT_ROTATION_SHARE = 0.25
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    assert sim.engine.ledger.count("GET", CONFIG) == 1  # ceil(0.25 x 4), oldest first
    read = {int(e.path_params["vmid"]) for e in sim.engine.ledger.calls("GET", CONFIG)}
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    again = {int(e.path_params["vmid"]) for e in sim.engine.ledger.calls("GET", CONFIG)}
    assert again and again != read  # the next round reads the next-oldest


def _repaired(pump: Pump, proxy: Proxy) -> Operation:
    """One reconcile round starts a repair of ``proxy``, and it runs to success."""
    assert pump.call(reconcile_round)["repair"] == 1
    pump.run()
    op = Operation.objects.get(proxy=proxy, kind=OperationKind.REPAIR)
    assert op.state == OperationState.SUCCEEDED, op.last_error
    return op


def _restarted_in_proxmox(sim: Sim, proxy: Proxy) -> None:
    """The operator restarts the VM in Proxmox: what was pending now runs."""
    sim.api.reboot(proxy.node, int(proxy.vmid or 0))
    sim.settle(0.5)


def test_repair_reboots_when_the_change_stays_pending(pump: Pump, networked: Sim) -> None:
    """The VM runs with 2 cores (changed in Proxmox, then restarted there). Cores on a running VM
    are never hot-plugged (pve-reference §7.13): the repair's write stays pending, so it reboots
    once, and the VM runs with the spec afterwards. The restart makes reconcile read the VM
    anyway, so the drift is found from that read, with no rotation due."""
    sim = networked
    proxy = _one(pump, sim)
    _behind_its_back(sim, proxy, "cores")
    _restarted_in_proxmox(sim, proxy)
    assert str(sim.api.vm_config(proxy.node, int(proxy.vmid or 0), current=True)["cores"]) == "2"
    _policy(sim, DriftPolicy.REPAIR)
    sim.engine.ledger.clear()

    _repaired(pump, proxy)
    assert sim.engine.ledger.count("PUT", PUT_CONFIG) == 1
    assert sim.engine.ledger.count("POST", REBOOT) == 1
    pending = sim.api.vm_pending(proxy.node, int(proxy.vmid or 0))
    assert not [i for i in pending if "pending" in i or "delete" in i]
    assert str(_config(sim, proxy)["cores"]) == "1"
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING and proxy.ip
    assert proxy.drift == []
    # The operator's intent is untouched: the repair changed the VM, never the proxy's asks.
    assert (proxy.desired_state, proxy.desired_power) == ("present", "on")


def test_repair_of_a_change_still_pending_reverts_it_without_a_reboot(
    pump: Pump, networked: Sim, settings: Any
) -> None:
    """Cores changed in Proxmox on the running VM wait for a restart; the VM still runs with its
    spec, so the repair only reverts the pending change (``revert``, §7.13) and never reboots."""
    sim = networked
    proxy = _drifted_under_repair(pump, sim, settings, "cores")

    _repaired(pump, proxy)
    (write,) = sim.engine.ledger.calls("PUT", PUT_CONFIG)
    assert write.params.get("revert") == "cores" and "cores" not in write.params
    assert sim.engine.ledger.count("POST", REBOOT) == 0
    pending = sim.api.vm_pending(proxy.node, int(proxy.vmid or 0))
    assert not [i for i in pending if "pending" in i or "delete" in i]
    proxy.refresh_from_db()
    assert proxy.drift == [] and proxy.phase == Phase.RUNNING


@pytest.mark.parametrize("change", ["net0.bridge", "net0.tag", "net0.mac"])
def test_repair_of_a_hot_plugged_change_does_not_reboot(
    pump: Pump, networked: Sim, settings: Any, change: str
) -> None:
    sim = networked
    proxy = _drifted_under_repair(pump, sim, settings, change)
    built = _restored_net0(sim, proxy)

    _repaired(pump, proxy)
    assert sim.engine.ledger.count("PUT", PUT_CONFIG) == 1
    assert sim.engine.ledger.count("POST", REBOOT) == 0
    assert _config(sim, proxy)["net0"].upper() == built.upper()
    proxy.refresh_from_db()
    assert proxy.drift == [] and proxy.phase == Phase.RUNNING


def test_a_config_change_between_the_read_and_the_write_is_not_overwritten(
    pump: Pump, networked: Sim, settings: Any
) -> None:
    """The repair writes with the digest it read: someone's edit landing in between makes
    Proxmox refuse the write (pve-reference §3.4), and the repair ends saying so."""
    sim = networked
    proxy = _drifted_under_repair(pump, sim, settings, "cores")

    def meanwhile(call: Call) -> None:
        sim.api.set_vm_config(proxy.node, int(proxy.vmid or 0), {"cores": "4"})

    sim.before(PUT_CONFIG, meanwhile)
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    pump.run()

    op = Operation.objects.get(proxy=proxy, kind=OperationKind.REPAIR)
    assert op.state == OperationState.FAILED
    assert "checksum mismatch (file change by other user?)" in op.last_error
    writes = sim.engine.ledger.calls("PUT", PUT_CONFIG)
    assert [e.status for e in writes] == [200, 500]  # the other edit, then ours, refused
    assert str(_config(sim, proxy)["cores"]) == "4"  # the other edit stands
    assert sim.engine.ledger.count("POST", REBOOT) == 0
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING  # a refused repair leaves the proxy as it was
    assert "checksum mismatch" in proxy.last_error

    # The failed repair is not repeated by the next round: the next try is the operator's.
    pump.call(reconcile_round)
    pump.run()
    assert Operation.objects.filter(proxy=proxy, kind=OperationKind.REPAIR).count() == 1


def test_repair_never_runs_on_a_busy_proxy(pump: Pump, networked: Sim, settings: Any) -> None:
    sim = networked
    proxy = _drifted_under_repair(pump, sim, settings, "cores")
    pump.call(operations.proxy_power, proxy=proxy, action="reboot")  # queued, not yet run
    counts = pump.call(reconcile_round)
    assert counts["busy"] == 1
    assert not Operation.objects.filter(proxy=proxy, kind=OperationKind.REPAIR).exists()


def test_repair_is_void_when_the_operator_acted_since_the_snapshot(
    pump: Pump, networked: Sim, settings: Any
) -> None:
    """The operator shuts the proxy down while reconcile lists: the decision to repair was taken
    on a snapshot that no longer holds, so nothing starts (issue 10's rule)."""
    sim = networked
    proxy = _drifted_under_repair(pump, sim, settings, "cores")

    def operator_shuts_down(call: Call) -> None:
        pump.call(operations.proxy_power, proxy=proxy, action="shutdown")
        pump.run()

    sim.after(LISTING, operator_shuts_down)
    counts = pump.call(reconcile_round)
    assert counts["changed"] == 1
    assert not Operation.objects.filter(proxy=proxy, kind=OperationKind.REPAIR).exists()
    proxy.refresh_from_db()
    assert proxy.desired_power == "off"


def test_repair_is_refused_for_an_ha_managed_vm_with_the_reason_shown(
    pump: Pump, networked: Sim, settings: Any
) -> None:
    sim = networked
    proxy = _one(pump, sim)
    _behind_its_back(sim, proxy, "cores")
    sim.engine.control.set_ha(int(proxy.vmid or 0))
    _policy(sim, DriftPolicy.REPAIR)
    _due_every_round(settings)
    sim.engine.ledger.clear()
    pump.call(reconcile_round)
    pump.run()

    op = Operation.objects.get(proxy=proxy, kind=OperationKind.REPAIR)
    assert op.state == OperationState.FAILED
    assert "managed by Proxmox HA" in op.last_error
    assert sim.engine.ledger.mutations() == []
    proxy.refresh_from_db()
    assert "managed by Proxmox HA" in proxy.last_error and proxy.phase == Phase.RUNNING


def test_a_catalogue_edit_is_not_drift(pump: Pump, sim: Sim, settings: Any) -> None:
    """DESIGN.md §4: catalogue edits affect only VMs created afterwards. A VM built with one core
    is not drifted when the machine type later says two."""
    proxy = _one(pump, sim)
    small = sim.cluster.machine_types.get(key="small")
    small.cores = 2
    small.save()
    sim.cluster.save()
    _due_every_round(settings)
    counts = pump.call(reconcile_round)
    assert counts["drift_checked"] == 1
    proxy.refresh_from_db()
    assert proxy.drift == []


@pytest.mark.parametrize("lost", ["write", "reboot"])
def test_a_repair_whose_reply_is_lost_is_never_sent_twice(
    pump: Pump, networked: Sim, lost: str
) -> None:
    """Seed 001's receipts: the PUT or the reboot is applied and its reply lost. The retry reads
    back (the write's own digest change is recognised as ours; the reboot is found in the node's
    tasks) and the repair ends with one write and one reboot."""
    sim = networked
    proxy = _one(pump, sim)
    _behind_its_back(sim, proxy, "cores")
    _restarted_in_proxmox(sim, proxy)
    _policy(sim, DriftPolicy.REPAIR)
    sim.engine.ledger.clear()
    if lost == "write":
        sim.engine.control.drop_reply("PUT", CONFIG)
    else:
        sim.engine.control.drop_reply("POST", REBOOT.split(" ", 1)[1])

    pump.call(reconcile_round)
    pump.run()

    assert [e.fault for e in sim.engine.ledger.calls() if e.fault] == ["drop"]
    op = Operation.objects.get(proxy=proxy, kind=OperationKind.REPAIR)
    assert op.state == OperationState.SUCCEEDED, op.last_error
    applied = [e for e in sim.engine.ledger.calls("PUT", PUT_CONFIG) if e.mutation]
    assert len(applied) == 1
    assert len([e for e in sim.engine.ledger.calls("POST", REBOOT) if e.mutation]) == 1
    assert str(_config(sim, proxy)["cores"]) == "1"
    proxy.refresh_from_db()
    assert proxy.phase == Phase.RUNNING and proxy.drift == []
