"""The inventory snapshot against the in-process simulator (issue 14; pve-reference §7.9).

The simulator's default cluster holds three templates (9000-9002), ``web-1`` (100, tagged
``web``), ``proxy-legacy`` (101, named like a proxy, no mark), ``proxy-other`` (102, marked by
another installation) and the container ``ct-dns`` (200). Counts come from its ledger.
"""

from __future__ import annotations

from datetime import UTC, datetime

from provider_world import World

from provisioning.proxmox.inventory import (
    InventoryGuest,
    Remembered,
    owner_of_mark,
    read_inventory,
)
from provisioning.proxmox.marks import render_mark

LISTING = "GET /cluster/resources"
CONFIG = "GET /nodes/{node}/qemu/{vmid}/config"


def _by_vmid(world: World, **kwargs: object) -> dict[int, InventoryGuest]:
    inventory = world.provider.inventory(**kwargs)  # type: ignore[arg-type]
    return {g.vmid: g for g in inventory.guests}


def test_every_guest_with_its_fields_and_owner(world: World) -> None:
    done = world.create(world.request("ours"))
    ours = int(str(done.provider_id).split("/")[1])
    control = world.engine.control
    control.set_lock(100, "backup")
    control.set_ha(100, state="started")
    control.set_pool(100, "prod")
    world.engine.ledger.clear()

    guests = _by_vmid(world)

    web = guests[100]
    assert (web.name, web.node, web.type, web.status) == ("web-1", "pve1", "qemu", "running")
    assert (web.lock, web.hastate, web.pool, web.tags) == ("backup", "started", "prod", ("web",))
    assert web.template is False and web.owner == "foreign" and not web.mark_read
    template = guests[9000]
    assert template.template is True and template.tags == ("debian", "template")
    assert template.owner == "foreign" and template.status == "stopped"
    ct = guests[200]
    assert (ct.type, ct.name, ct.tags, ct.owner) == ("lxc", "ct-dns", ("infra",), "foreign")
    assert guests[101].owner == "foreign" and guests[101].mark_read  # proxy-like, no mark
    assert guests[102].owner == "other" and guests[102].tags == ("proxyhub",)
    mine = guests[ours]
    assert (mine.name, mine.owner, mine.tags) == ("proxy-ours", "this", ("proxyhub",))
    assert sorted(guests) == sorted([100, 101, 102, 200, ours, 9000, 9001, 9002])
    # One listing; config reads only for the three proxy-like VMs.
    assert world.engine.ledger.count("GET", LISTING) == 1
    assert sorted(int(e.path_params["vmid"]) for e in world.engine.ledger.calls("GET", CONFIG)) == [
        101,
        102,
        ours,
    ]
    assert world.engine.ledger.mutations() == []


def _remembered(guests: tuple[InventoryGuest, ...], seconds_ago: float) -> dict:
    return {
        (g.vmid, g.name): Remembered(g.owner, g.status, seconds_ago) for g in guests if g.mark_read
    }


def test_known_owners_spare_the_reads(world: World) -> None:
    first = world.provider.inventory()
    known = _remembered(first.guests, seconds_ago=300)  # 102 has run for a day, 101 is stopped
    world.engine.ledger.clear()
    again = world.provider.inventory(known=known)
    assert again.guests == first.guests and again.mark_reads == 0
    assert world.engine.ledger.count("GET", LISTING) == 1
    assert world.engine.ledger.count("GET", CONFIG) == 0


def test_a_renamed_vm_is_read_again(world: World) -> None:
    # Stale: the VM at 102 is named otherwise now.
    known = {(102, "proxy-old-name"): Remembered("this", "running", 300)}
    guests = _by_vmid(world, known=known)
    assert guests[102].owner == "other"


def test_a_vm_that_restarted_since_the_snapshot_is_read_again(world: World) -> None:
    """A VM destroyed and re-created at the same VMID and name has run only since: its uptime is
    shorter than the time since the snapshot that read the old one's mark."""
    known = {(102, "proxy-other"): Remembered("this", "running", 300)}  # as if it were ours
    world.api.stop("pve3", 102)
    world.settle()
    world.api.start("pve3", 102)
    world.settle(5)  # it has run for 5 s since, the snapshot was 300 s ago
    world.engine.ledger.clear()
    guests = _by_vmid(world, known=known)
    assert guests[102].owner == "other"
    assert world.engine.ledger.count("GET", CONFIG) == 2  # 102, and 101 that nothing remembers


def test_a_vm_whose_status_changed_since_the_snapshot_is_read_again(world: World) -> None:
    known = {
        (101, "proxy-legacy"): Remembered("this", "running", 300),  # it is stopped now
        (102, "proxy-other"): Remembered("this", "stopped", 300),  # it runs now
    }
    guests = _by_vmid(world, known=known)
    assert guests[101].owner == "foreign" and guests[102].owner == "other"


def test_a_mark_that_cannot_be_read_is_not_claimed(world: World) -> None:
    world.engine.control.node_offline("pve3")  # proxy-other (102) lives there
    inventory = world.provider.inventory()
    other = next(g for g in inventory.guests if g.vmid == 102)
    assert other.status == "unknown" and other.owner == "foreign" and not other.mark_read
    assert inventory.unread == 1


def test_the_limit_keeps_the_lowest_vmids_and_says_so(world: World) -> None:
    world.engine.control.create_vms(10, start_vmid=5000, tags=None, name_prefix="bulk-")
    inventory = read_inventory(world.api, installation_id="inst-test", limit=6)
    assert [g.vmid for g in inventory.guests] == [100, 101, 102, 200, 5000, 5001]
    assert inventory.listed == 17 and inventory.truncated
    whole = read_inventory(world.api, installation_id="inst-test")
    assert whole.listed == len(whole.guests) == 17 and not whole.truncated


def test_a_clone_in_progress_is_listed_nameless_and_foreign(world: World) -> None:
    world.api.clone("pve1", 9000, newid=4242, name="proxy-slow")
    guests = _by_vmid(world)
    assert guests[4242].lock == "clone" and guests[4242].name == ""
    assert guests[4242].owner == "foreign" and guests[4242].status == "unknown"


def test_owner_of_mark() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    uid = "11111111-1111-4111-8111-111111111111"
    assert owner_of_mark(render_mark(uid, when, "me"), "me") == "this"
    assert owner_of_mark(render_mark(uid, when, "you"), "me") == "other"
    # A mark older than the installation line cannot be shown to be this installation's.
    assert owner_of_mark("proxyhub-managed=true\nproxyhub-uid=" + uid, "me") == "other"
    assert owner_of_mark("proxyhub-managed=false", "me") == "foreign"
    assert owner_of_mark(None, "me") == "foreign"
