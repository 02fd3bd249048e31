"""Issue 14: proxyhub's role is derived from the endpoints its seam calls, and covers them all.

Every public method of ``Api`` is invoked (``test_api_schema.INVOCATIONS``, which itself fails
when a method has no invocation); each call it builds must be listed in
``privileges.ENDPOINTS`` (what Proxmox checks for it) or be one of the bootstrap's own admin
calls. So an endpoint added to the seam without its privileges fails here.
"""

from __future__ import annotations

import pytest

from provisioning.proxmox import privileges
from provisioning.proxmox.privileges import AclTargets, compare, required_by_path
from tests.unit.test_api_schema import INVOCATIONS, record


def test_every_call_the_seam_makes_has_its_privileges_listed() -> None:
    names = {call.name for invokes in INVOCATIONS.values() for i in invokes for call in record(i)}
    unlisted = names - set(privileges.ENDPOINTS) - privileges.ADMIN_CALLS
    assert unlisted == set(), f"calls without privileges in privileges.ENDPOINTS: {unlisted}"
    # Nothing listed that the seam no longer calls: the role would grant a privilege for nothing.
    assert set(privileges.ENDPOINTS) | privileges.ADMIN_CALLS <= names


def test_a_new_endpoint_without_an_entry_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(privileges.ENDPOINTS, "upload_iso")
    names = {call.name for invoke in INVOCATIONS["upload_iso"] for call in record(invoke)}
    assert names - set(privileges.ENDPOINTS) - privileges.ADMIN_CALLS == {"upload_iso"}


def test_every_need_cites_its_source_and_names_real_privileges() -> None:
    from pvesim.access import ALL_PRIVILEGES  # the PVE 9.1 list from the official schema

    for name, needs in privileges.ENDPOINTS.items():
        for need in needs:
            assert need.kind in privileges.PATH_KINDS, name
            assert need.source, name
            assert set(need.privileges) <= set(ALL_PRIVILEGES), name


def test_the_role_is_what_the_endpoints_need_and_nothing_administrative() -> None:
    role = set(privileges.role_privileges())
    assert {"VM.Clone", "VM.Allocate", "Datastore.AllocateTemplate", "SDN.Use"} <= role
    assert {"VM.GuestAgent.Audit", "VM.PowerMgmt", "Sys.Audit", "Datastore.Allocate"} <= role
    # Cloud-init's result file (seed 003's readiness) takes the narrow FileRead, never the
    # agent's Unrestricted (which runs any command in the guest).
    assert "VM.GuestAgent.FileRead" in role
    # What proxyhub never asks for stays out: no Sys.Modify, no Permissions.Modify, no
    # cloud-init keys (proxyhub brings its own seed), no console, no migration.
    assert not role & {
        "Sys.Modify",
        "Permissions.Modify",
        "User.Modify",
        "VM.Config.Cloudinit",
        "VM.GuestAgent.Unrestricted",
        "VM.GuestAgent.FileWrite",
        "VM.Console",
        "VM.Migrate",
        "Pool.Allocate",
    }


TARGETS = AclTargets(
    pool="proxyhub",
    templates=(9000,),
    storages=("local-lvm", "proxy-seeds"),
    bridges=("vmbr0",),
    nodes=("pve1",),
)


def test_acl_paths_are_the_pool_templates_storages_bridges_and_nodes_only() -> None:
    assert list(TARGETS.paths()) == [
        "/pool/proxyhub",
        "/vms/9000",
        "/storage/local-lvm",
        "/storage/proxy-seeds",
        "/sdn/zones/localnetwork/vmbr0",
        "/nodes/pve1",
    ]


def test_compare_names_each_missing_privilege_with_its_path_and_warns_of_extras() -> None:
    required = required_by_path(TARGETS)
    granted = {path: {p: 1 for p in privs} for path, privs in required.items()}
    assert compare(required, granted).ok
    del granted["/storage/proxy-seeds"]["Datastore.AllocateTemplate"]
    granted["/"] = {"Sys.Modify": 1}
    report = compare(required, granted)
    assert not report.ok
    assert report.missing == {"/storage/proxy-seeds": ("Datastore.AllocateTemplate",)}
    assert report.extra == {"/": ("Sys.Modify",)}


def test_the_operator_guide_lists_every_privilege_of_the_role_with_its_source() -> None:
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md").read_text()
    section = guide.split("### 4a.", 1)[1].split("### 4b.", 1)[0]
    for priv in privileges.role_privileges():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{priv}` |")), "")
        assert row, f"{priv} is not in the operator guide's table"
        assert "schema" in row or "§2.4" in row, f"{priv} has no source in the guide"
