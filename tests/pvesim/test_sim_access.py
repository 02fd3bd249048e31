"""Issue 14: the simulator's pools, roles, users, tokens, ACLs and effective permissions.

Shapes from the official schema (``GET /access/roles`` ``privs`` as a comma list, the token's
``full-tokenid``/``info``/``value``); texts from pve-access-control (``lock_user_config``'s
"<what> failed: <why>", pve-reference §2.3 for the 403s).
"""

from __future__ import annotations

import pytest

from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport


def fails(call: object, status: int, message: str) -> None:
    with pytest.raises(ApiError) as err:
        call()  # type: ignore[operator]
    assert (err.value.status, err.value.message) == (status, message)


@pytest.fixture
def made(api: Api, engine: Simulator) -> Api:
    """A user with a privilege-separated token holding PVEAuditor on /vms/9000 only."""
    api.create_user("svc@pve")
    value = api.create_token("svc@pve", "tk")["value"]
    api.set_acl("/vms/9000", roles=["PVEAuditor"], users=["svc@pve"], tokens=["svc@pve!tk"])
    return Api(SimTransport(engine, token=f"svc@pve!tk={value}"))


def test_creating_twice_is_refused_with_proxmox_texts(api: Api) -> None:
    api.create_pool("p1")
    fails(lambda: api.create_pool("p1"), 500, "create pool failed: pool 'p1' already exists")
    api.create_role("R", privs=["VM.Audit"])
    fails(
        lambda: api.create_role("R", privs=["VM.Audit"]),
        500,
        "create role failed: role 'R' already exists",
    )
    fails(lambda: api.create_role("S", privs=["VM.Nope"]), 500, "invalid privilege 'VM.Nope'")
    api.create_user("u@pve")
    fails(lambda: api.create_user("u@pve"), 500, "create user failed: user 'u@pve' already exists")
    api.create_token("u@pve", "tk")
    fails(
        lambda: api.create_token("u@pve", "tk"),
        500,
        "generating token failed: Token already exists.",
    )
    fails(lambda: api.user_token("u@pve", "xy"), 500, "no such token 'xy' for user 'u@pve'")
    fails(lambda: api.user_tokens("x@pve"), 500, "no such user ('x@pve')")
    fails(
        lambda: api.set_acl("/", roles=["Nope"], users=["u@pve"]),
        500,
        "ACL update failed: role 'Nope' does not exist",
    )


def test_the_secret_is_returned_once_and_only_at_creation(api: Api) -> None:
    api.create_user("u@pve")
    made = api.create_token("u@pve", "tk", comment="c")
    assert made["full-tokenid"] == "u@pve!tk"
    assert made["info"]["privsep"] == 1
    secret = made["value"]
    assert secret not in str(api.user_tokens("u@pve"))
    assert secret not in str(api.user_token("u@pve", "tk"))
    assert secret not in str(api.users())
    assert api.user_tokens("u@pve") == [
        {"tokenid": "tk", "privsep": 1, "expire": 0, "comment": "c"}
    ]


def test_roles_list_builtins_as_special_and_custom_ones_as_comma_lists(api: Api) -> None:
    api.create_role("R", privs=["VM.Clone", "VM.Audit"])
    roles = {r["roleid"]: r for r in api.roles()}
    assert roles["R"] == {"roleid": "R", "privs": "VM.Audit,VM.Clone"}
    assert roles["Administrator"]["special"] == 1
    api.update_role("R", privs=["VM.Audit"])
    assert {r["roleid"]: r for r in api.roles()}["R"]["privs"] == "VM.Audit"


def test_a_token_holds_only_what_its_acls_grant(made: Api) -> None:
    assert made.vm_config("pve1", 9000)  # VM.Audit on /vms/9000
    fails(lambda: made.node_status("pve1"), 403, "Permission check failed (/nodes/pve1, Sys.Audit)")
    fails(
        lambda: made.start("pve1", 9000),
        403,
        "Permission check failed (/vms/9000, VM.PowerMgmt)",
    )
    assert made.permissions() == {
        "/vms/9000": {
            p: 1
            for p in (
                "Datastore.Audit",
                "Mapping.Audit",
                "Pool.Audit",
                "SDN.Audit",
                "Sys.Audit",
                "VM.Audit",
                "VM.GuestAgent.Audit",
            )
        }
    }


def test_a_privsep_token_holds_the_intersection_with_its_user(api: Api, made: Api) -> None:
    api.set_acl("/vms/9000", roles=["PVEAuditor"], users=["svc@pve"], delete=True)
    fails(
        lambda: made.vm_config("pve1", 9000), 403, "Permission check failed (/vms/9000, VM.Audit)"
    )


def test_the_default_token_keeps_every_right(api: Api) -> None:
    perms = api.permissions(path="/")
    assert perms["/"]["Sys.Modify"] == 1 and perms["/"]["VM.Allocate"] == 1


def test_a_clone_into_a_pool_joins_it_and_a_destroy_leaves_it(api: Api, engine: Simulator) -> None:
    fails(
        lambda: api.clone("pve1", 9000, newid=4242, name="x", pool="nope"),
        403,
        "Permission check failed (pool 'nope' does not exist)",
    )
    api.create_pool("p")
    upid = api.clone("pve1", 9000, newid=4242, name="x", pool="p")
    engine.control.advance(600)
    assert api.task_status("pve1", upid)["status"] == "stopped"
    assert engine.cluster.access.pools["p"].vms == {4242}
    api.destroy("pve1", 4242)
    engine.control.advance(600)
    assert engine.cluster.access.pools["p"].vms == set()


def test_deleting_a_token_drops_its_acls(api: Api, engine: Simulator, made: Api) -> None:
    api.delete_token("svc@pve", "tk")
    assert {e["type"] for e in api.acl()} == {"user"}
    fails(lambda: made.version(), 401, "Authentication failed!")
