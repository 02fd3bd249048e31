"""Issue 14: the least-privilege bootstrap against the in-process simulator.

The simulator's default token is the administrator here (it holds every right); the token the
bootstrap makes holds only its ACLs (pvesim/access.py), so every create step below meets
Proxmox's own permission checks. Counts come from the simulator's ledger.
"""

from __future__ import annotations

import dataclasses

import pytest
from provider_world import World, make_world
from test_plan import plan_of

from provisioning.proxmox.api import Api
from provisioning.proxmox.bootstrap import BootstrapRefused, Names, Outcome, bootstrap
from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.errors import ApiError
from provisioning.proxmox.preflight import preflight
from provisioning.proxmox.preflight_privileges import privileges_check
from provisioning.proxmox.privileges import role_privileges
from provisioning.proxmox.provider import Provider
from tests.support.simtransport import SimTransport

NAMES = Names()


class Vault:
    """Where the new secret lands (the service writes a file; here, memory)."""

    def __init__(self) -> None:
        self.token: str | None = None

    def store(self, token_id: str, secret: str) -> None:
        self.token = f"{token_id}={secret}"


def own_api(world: World, vault: Vault) -> Api:
    assert vault.token is not None
    return Api(SimTransport(world.engine, token=vault.token))


def run(world: World, vault: Vault, *, rotate: bool = False) -> Outcome:
    def usable() -> bool:
        if vault.token is None:
            return False
        try:
            own_api(world, vault).version()
        except ApiError:
            return False
        return True

    return bootstrap(
        world.api,
        world.config,
        names=NAMES,
        store_secret=vault.store,
        token_usable=usable,
        rotate=rotate,
    )


@pytest.fixture
def boot() -> tuple[World, Vault]:
    world = make_world(bridge="vmbr0")
    vault = Vault()
    run(world, vault)
    return world, vault


def test_bootstrap_makes_pool_role_user_token_and_acls(boot: tuple[World, Vault]) -> None:
    world, vault = boot
    access = world.engine.cluster.access
    assert "proxyhub" in access.pools
    assert access.roles["ProxyHub"] == role_privileges()
    token = access.users["proxyhub@pve"].tokens["proxyhub"]
    assert token.privsep
    assert vault.token == f"proxyhub@pve!proxyhub={token.secret}"
    paths = {e.path for e in access.acl}
    assert paths == {
        "/pool/proxyhub",
        "/vms/9000",
        "/vms/9001",
        "/vms/9002",
        "/storage/proxy-seeds",
        "/storage/vmstore",  # the templates' disks: clones land there (no storage set)
        "/sdn/zones/localnetwork/vmbr0",
        "/nodes/pve1",
        "/nodes/pve2",
        "/nodes/pve3",
    }
    # Granted to both the user and the token (a privsep token holds the intersection).
    assert {e.type for e in access.acl} == {"user", "token"}
    assert {e.roleid for e in access.acl} == {"ProxyHub"}
    assert "/" not in paths


def test_a_second_run_changes_nothing(boot: tuple[World, Vault]) -> None:
    world, vault = boot
    world.engine.ledger.clear()
    outcome = run(world, vault)
    assert world.engine.ledger.mutations() == []
    assert outcome.changes == []
    assert "token proxyhub@pve!proxyhub" in outcome.verified


def test_the_new_token_creates_a_proxy_that_joins_the_pool(boot: tuple[World, Vault]) -> None:
    world, vault = boot
    config = dataclasses.replace(world.config, pool="proxyhub")
    provider = Provider(
        own_api(world, vault), config, budgets=Budgets(poll_interval=0.05), clock=world.clock
    )
    req = world.request("least")
    result = world.create(req, provider)
    assert result.status == "done", result.message
    vmid = int(result.progress["vmid"])
    assert vmid in world.engine.cluster.access.pools["proxyhub"].vms
    clones = world.engine.ledger.mutations("POST", "/nodes/{node}/qemu/{vmid}/clone")
    assert clones[-1].params.get("pool") == "proxyhub"


def test_without_the_pool_the_new_token_may_not_clone(boot: tuple[World, Vault]) -> None:
    world, vault = boot
    provider = Provider(
        own_api(world, vault), world.config, budgets=Budgets(poll_interval=0.05), clock=world.clock
    )
    result = world.create(world.request("nopool"), provider)
    assert result.status == "error"
    # VM.Allocate on /vms/<newid> or on the pool: the "or" fails with the bare text (§2.3).
    assert "Permission check failed" in str(result.error)


def test_preflight_passes_then_names_a_missing_privilege_and_its_path(
    boot: tuple[World, Vault],
) -> None:
    world, vault = boot
    targets = run(world, vault).targets
    check = privileges_check(own_api(world, vault), targets)
    assert (check.status, check.failures, check.warnings) == ("passed", (), ())

    privs = [p for p in role_privileges() if p != "Datastore.AllocateTemplate"]
    world.api.update_role("ProxyHub", privs=privs)
    check = privileges_check(own_api(world, vault), targets)
    assert check.status == "failed"
    assert "missing Datastore.AllocateTemplate on /storage/proxy-seeds" in check.failures
    # And Proxmox itself refuses the upload with its 403 text.
    with pytest.raises(ApiError) as err:
        own_api(world, vault).upload_iso("pve1", "proxy-seeds", filename="x.iso", content=b"x")
    assert err.value.status == 403
    assert err.value.message == (
        "Permission check failed (/storage/proxy-seeds, Datastore.AllocateTemplate)"
    )


def test_the_plan_preflight_checks_the_token_of_a_cluster_with_a_pool(
    boot: tuple[World, Vault],
) -> None:
    world, vault = boot
    config = dataclasses.replace(world.config, pool="proxyhub")
    plan = plan_of(config, world.request("pre"))
    checks = {c.code: c for c in preflight(own_api(world, vault), config, plan)}
    assert checks["privileges"].status == "passed", checks["privileges"]
    world.engine.control.deny("/vms/9000", "VM.Clone")
    checks = {c.code: c for c in preflight(own_api(world, vault), config, plan)}
    assert checks["privileges"].status == "failed"
    assert checks["privileges"].message == "missing VM.Clone on /vms/9000"


def test_a_privilege_beyond_the_role_is_a_warning(boot: tuple[World, Vault]) -> None:
    world, vault = boot
    targets = run(world, vault).targets
    world.api.set_acl(
        "/", roles=["Administrator"], users=["proxyhub@pve"], tokens=["proxyhub@pve!proxyhub"]
    )
    check = privileges_check(own_api(world, vault), targets)
    assert check.status == "passed"
    assert "Sys.Modify on / is beyond proxyhub's role" in check.warnings


def test_a_token_whose_secret_is_lost_is_refused_until_rotated(
    boot: tuple[World, Vault],
) -> None:
    world, vault = boot
    vault.token = None  # the token file was lost
    world.engine.ledger.clear()
    with pytest.raises(BootstrapRefused, match="--rotate-token"):
        run(world, vault)
    assert world.engine.ledger.mutations() == []
    assert len(world.engine.cluster.access.users["proxyhub@pve"].tokens) == 1

    run(world, vault, rotate=True)
    assert vault.token is not None
    own_api(world, vault).version()
    assert len(world.engine.cluster.access.users["proxyhub@pve"].tokens) == 1
    # Deleting the old token dropped its ACLs; the rotation granted them again.
    check = privileges_check(own_api(world, vault), run(world, vault).targets)
    assert check.status == "passed"
