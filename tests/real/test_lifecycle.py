"""The provider's whole lifecycle against one cluster (seed 000 entry 21; issue 13).

In ``make test`` the cluster is the HTTPS simulator; ``make test-real`` points the same tests at
a real Proxmox VE through the ``PROXMOX_TEST_*`` variables (tests/real/conftest.py). Each test
removes what it made, passed or failed (the ``cleanup`` fixture), and fails if anything of its
own is left on the cluster.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from provisioning.proxmox.create import CreateRequest
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import NotFoundError, TransientError
from provisioning.proxmox.ids import format_provider_id
from provisioning.proxmox.marks import render_mark
from provisioning.proxmox.observe import Instance
from provisioning.proxmox.power_checks import PowerRequest
from provisioning.proxmox.seed import build_seed_iso, seed_iso_name
from provisioning.proxmox.tasks import wait_task
from tests.real.leftovers import leftovers, remove_leftovers, settled_leftovers
from tests.real.target import Target

pytestmark = pytest.mark.usefixtures("cleanup")

# Canaries: none may come back in any reply or be left anywhere the tier can read.
CLOUD_INIT = b"#cloud-config\n# lifecycle-canary-7d1e\n"


def _request(target: Target, what: str) -> CreateRequest:
    return CreateRequest(
        uid=str(uuid.uuid4()),
        vm_name=target.request_name(what),
        machine_type="lifecycle",
        image="lifecycle",
        zone=target.node,
        cloud_init=CLOUD_INIT,
    )


def _until(target: Target, provider_id: str, wanted: str, seconds: float) -> Instance:
    """Get until the VM is in ``wanted`` state (transient reads are part of booting)."""
    end = time.monotonic() + seconds
    last: Instance | TransientError | None = None
    while time.monotonic() < end:
        try:
            last = target.provider.get(provider_id)
            if last.state == wanted:
                return last
        except NotFoundError:
            raise
        except TransientError as err:
            last = err
        time.sleep(0.5 if target.kind == "real" else 0.05)
    raise AssertionError(f"{provider_id} never became {wanted} in {seconds:.0f} s; last: {last}")


def test_node_check_finds_the_node_ready(target: Target) -> None:
    (check,) = [c for c in target.provider.check(deadline=Deadline(60)) if c.node == target.node]
    assert check.ready, f"{check.reason}: {check.message}"
    assert check.details.get("templates") == "1/1"  # the catalogue's one template is there


def test_create_get_power_and_delete_leave_nothing(target: Target) -> None:
    provider = target.provider
    req = _request(target, "life")
    provider_id = provider.create(req, deadline=Deadline(900))
    vmid = int(provider_id.split("/")[1])
    # Create returns once the VM runs (entry 10); the address comes from the agent (entry 7).
    running = _until(target, provider_id, "Running", target.address_seconds)
    assert running.ip and running.uid == req.uid and running.node == target.node
    # Create again adopts: the same id, no second VM (entry 2).
    assert provider.create(req, deadline=Deadline(300)) == provider_id
    assert [e["vmid"] for e in target.api.cluster_resources() if e.get("name") == req.vm_name] == [
        vmid
    ]

    provider.power(PowerRequest("shutdown", vmid, req.vm_name, req.uid), deadline=Deadline(600))
    _until(target, provider_id, "Stopped", 120)
    provider.power(PowerRequest("start", vmid, req.vm_name, req.uid), deadline=Deadline(600))
    _until(target, provider_id, "Running", target.address_seconds)

    provider.delete(provider_id, uid=req.uid, deadline=Deadline(900))
    with pytest.raises(NotFoundError):
        provider.get(provider_id)
    provider.delete(provider_id, uid=req.uid, deadline=Deadline(300))  # gone: still a success
    assert leftovers(target.api, target.config, target.prefix) == []


def test_gc_finds_a_planted_orphan_vm_and_seed_and_removes_them(target: Target) -> None:
    """What GC sees (entry 12): a VM marked by this installation for a uid no proxy has, older
    than any minimum age, and a seed ISO no VM is named for; both are removed through the
    provider, whose delete checks the mark once more."""
    api, config = target.api, target.config
    name = target.request_name("orphan")
    orphan_uid = str(uuid.uuid4())
    vmid = api.cluster_nextid()
    mark = render_mark(orphan_uid, datetime.now(UTC) - timedelta(days=2), config.installation_id)
    upid = api.clone(target.node, target.template_vmid, newid=vmid, name=name, description=mark)
    assert wait_task(api, upid, budget=600, poll_interval=0.2).state == "ok"
    seed = seed_iso_name(
        target.request_name("gone"), installation_id=config.installation_id, uid=str(uuid.uuid4())
    )
    iso = build_seed_iso(
        user_data=CLOUD_INIT,
        instance_id="gone",
        hostname="gone",
        vendor_data=None,
        install_guest_agent=False,
    )
    upid = api.upload_iso(target.node, config.iso_storage, filename=seed, content=iso)
    assert wait_task(api, upid, budget=120, poll_interval=0.2).state == "ok"

    provider = target.provider
    deadline = time.monotonic() + 60  # the listing shows a new VM's name after pvestatd's lag
    while not [m for m in provider.list_managed() if m.vmid == vmid]:
        assert time.monotonic() < deadline, "GC's listing never showed the planted VM"
        time.sleep(0.5)
    (found,) = [m for m in provider.list_managed() if m.vmid == vmid]
    assert (found.name, found.uid) == (name, orphan_uid)
    assert found.created_at is not None and found.created_at < datetime.now(UTC) - timedelta(days=1)
    seeds = [s for s in provider.list_orphan_seeds() if s.vm_name == target.request_name("gone")]
    assert [s.node for s in seeds] == [target.node]

    provider.delete(format_provider_id(vmid, name), uid=orphan_uid, deadline=Deadline(900))
    for s in seeds:
        api.delete_volume(s.node, config.iso_storage, s.volid)
    assert settled_leftovers(api, config, target.prefix) == []


def test_cleanup_removes_what_a_run_that_failed_halfway_left(target: Target) -> None:
    """The cleanup every test ends with, on what a failing test would leave: a VM that was
    created and never deleted, and its seed."""
    req = _request(target, "halfway")
    target.provider.create(req, deadline=Deadline(900))
    assert leftovers(target.api, target.config, target.prefix)
    remove_leftovers(target.api, target.config, target.prefix)
    assert leftovers(target.api, target.config, target.prefix) == []
