"""The Proxmox privileges proxyhub needs, derived from the endpoints its seam calls (issue 14).

Each call of ``api.Api`` (by its ``Call.name``) is listed with what Proxmox checks for it and
where, as data, with the source of each fact: the endpoint's ``permissions`` in the official
schema (pve-reference ``schema/all-endpoints.json``) or the table of checks made inside the
handlers (pve-reference §2.4). ``tests/unit/test_privileges.py`` calls every method of the
seam and fails when one has no entry here, so a new endpoint cannot ship without its privilege.

ACL paths are given by kind, resolved against a cluster's catalogue by ``required_by_path``:

* ``pool``: ``/pool/<pool>``; proxy VMs join it at clone, so their ``/vms/<id>`` privileges come
  from the pool's ACL (pve-access-control: a VM in a pool inherits the pool's ACLs);
* ``template``: ``/vms/<template vmid>`` of every catalogue template;
* ``storage``: ``/storage/<id>`` of ``isoStorage`` and ``storage``;
* ``bridge``: ``/sdn/zones/localnetwork/<bridge>`` (plain bridges are SDN zone
  ``localnetwork``; pve-reference §2.4, netN);
* ``node``: ``/nodes/<node>``: only ``Sys.Audit``, for the node checker's status read.

The bootstrap's own calls (pools, roles, users, tokens, ACLs) run once with an administrator's
token and are listed in ``ADMIN_CALLS``: they need nothing of proxyhub's role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PathKind = str  # "pool" | "template" | "storage" | "bridge" | "node"
PATH_KINDS: tuple[PathKind, ...] = ("pool", "template", "storage", "bridge", "node")

SCHEMA = "schema all-endpoints.json permissions of"
HANDLER = "pve-reference §2.4"


@dataclass(frozen=True)
class Need:
    """Privileges one call needs on one kind of ACL path, and where that is written."""

    kind: PathKind
    privileges: tuple[str, ...]
    source: str


# Call name -> what Proxmox checks. An empty tuple: any authenticated identity may call it
# (``user: all``); list results are filtered, which the entries for the listed objects cover.
ENDPOINTS: dict[str, tuple[Need, ...]] = {
    "version": (),  # GET /version: user all
    "nodes": (),  # GET /nodes: user all (node stats filtered by Sys.Audit, see node_status)
    "node_status": (Need("node", ("Sys.Audit",), f"{SCHEMA} GET /nodes/{{node}}/status"),),
    "node_network": (),  # GET /nodes/{node}/network: user all
    # GET /cluster/resources: user all; guests listed only with VM.Audit on /vms/<id> (§2.4).
    "cluster_resources": (
        Need("pool", ("VM.Audit",), HANDLER + " (/cluster/resources filter)"),
        Need("template", ("VM.Audit",), HANDLER + " (/cluster/resources filter)"),
    ),
    "cluster_nextid": (),  # GET /cluster/nextid: user all
    "storage_status": (
        Need(
            "storage",
            ("Datastore.Audit",),
            f"{SCHEMA} GET /nodes/{{node}}/storage/{{storage}}/status"
            " (Datastore.Audit or Datastore.AllocateSpace)",
        ),
    ),
    "storage_content": (
        Need(
            "storage",
            ("Datastore.Audit",),
            f"{SCHEMA} GET /nodes/{{node}}/storage/{{storage}}/content"
            " (Datastore.Audit or Datastore.AllocateSpace)",
        ),
    ),
    "upload_iso": (
        Need(
            "storage",
            ("Datastore.AllocateTemplate",),
            f"{SCHEMA} POST /nodes/{{node}}/storage/{{storage}}/upload",
        ),
    ),
    # Template builds (issue 14). The node lists its storages for any identity (user all,
    # filtered by Datastore.Audit, which storage_status already needs).
    "node_storages": (),
    # download-url: AllocateTemplate on the storage and, instead of Sys.Audit+Sys.Modify on /,
    # the narrower Sys.AccessNetwork on the node (schema's "or").
    "download_url": (
        Need(
            "storage",
            ("Datastore.AllocateTemplate",),
            f"{SCHEMA} POST /nodes/{{node}}/storage/{{storage}}/download-url",
        ),
        Need(
            "node",
            ("Sys.AccessNetwork",),
            f"{SCHEMA} POST /nodes/{{node}}/storage/{{storage}}/download-url"
            " (Sys.Audit+Sys.Modify on / or Sys.AccessNetwork on the node)",
        ),
    ),
    # POST /nodes/{node}/qemu: VM.Allocate on /pool/<pool> (the build passes the pool), each
    # key's privilege (§2.4: disk, cores, memory, net0, agent/name/description, serial0/vga/
    # scsihw), AllocateSpace on the disk's storage, SDN.Use on the bridge.
    "create_vm": (
        Need(
            "pool",
            (
                "VM.Allocate",
                "VM.Config.Disk",
                "VM.Config.CPU",
                "VM.Config.Memory",
                "VM.Config.Network",
                "VM.Config.Options",
                "VM.Config.HWType",
            ),
            f"{SCHEMA} POST /nodes/{{node}}/qemu; {HANDLER} (per key)",
        ),
        Need("storage", ("Datastore.AllocateSpace",), HANDLER + " (disks)"),
        Need("bridge", ("SDN.Use",), HANDLER + " (netN)"),
    ),
    "template": (
        Need("pool", ("VM.Allocate",), f"{SCHEMA} POST /nodes/{{node}}/qemu/{{vmid}}/template"),
    ),
    "delete_volume": (
        Need(
            "storage",
            ("Datastore.Allocate",),
            f"{SCHEMA} DELETE /nodes/{{node}}/storage/{{storage}}/content/{{volume}}",
        ),
    ),
    "vm_config": (
        Need("pool", ("VM.Audit",), f"{SCHEMA} GET /nodes/{{node}}/qemu/{{vmid}}/config"),
        Need("template", ("VM.Audit",), f"{SCHEMA} GET /nodes/{{node}}/qemu/{{vmid}}/config"),
    ),
    # PUT .../config: one VM.Config.* at the door, then per key (§2.4): cores → CPU, memory →
    # Memory, net0 → Network + SDN.Use on the bridge, ide2 (the seed CD-ROM) → CDROM + read
    # access to the ISO storage, agent/tags/description → Options.
    "set_vm_config": (
        Need(
            "pool",
            (
                "VM.Config.CPU",
                "VM.Config.Memory",
                "VM.Config.Network",
                "VM.Config.CDROM",
                "VM.Config.Options",
            ),
            f"{SCHEMA} PUT /nodes/{{node}}/qemu/{{vmid}}/config; {HANDLER} (per key)",
        ),
        Need("bridge", ("SDN.Use",), HANDLER + " (netN)"),
        Need("storage", ("Datastore.Audit",), HANDLER + " (CD-ROM drives)"),
    ),
    "vm_pending": (
        Need("pool", ("VM.Audit",), f"{SCHEMA} GET /nodes/{{node}}/qemu/{{vmid}}/pending"),
    ),
    # POST .../clone: VM.Clone on the template and VM.Allocate on /pool/<pool> (the pool is
    # given), Datastore.AllocateSpace on the target storage, SDN.Use on the bridges.
    "clone": (
        Need("template", ("VM.Clone",), f"{SCHEMA} POST /nodes/{{node}}/qemu/{{vmid}}/clone"),
        Need("pool", ("VM.Allocate",), f"{SCHEMA} POST /nodes/{{node}}/qemu/{{vmid}}/clone"),
        Need("storage", ("Datastore.AllocateSpace",), HANDLER + " (clone)"),
        Need("bridge", ("SDN.Use",), HANDLER + " (clone)"),
    ),
    "resize": (
        Need("pool", ("VM.Config.Disk",), f"{SCHEMA} PUT /nodes/{{node}}/qemu/{{vmid}}/resize"),
        Need("storage", ("Datastore.AllocateSpace",), HANDLER + " (resize)"),
    ),
    "start": (Need("pool", ("VM.PowerMgmt",), f"{SCHEMA} POST .../status/start"),),
    "stop": (Need("pool", ("VM.PowerMgmt",), f"{SCHEMA} POST .../status/stop"),),
    "shutdown": (Need("pool", ("VM.PowerMgmt",), f"{SCHEMA} POST .../status/shutdown"),),
    "reboot": (Need("pool", ("VM.PowerMgmt",), f"{SCHEMA} POST .../status/reboot"),),
    "vm_status": (
        Need("pool", ("VM.Audit",), f"{SCHEMA} GET .../status/current"),
        Need("template", ("VM.Audit",), f"{SCHEMA} GET .../status/current"),
    ),
    "destroy": (Need("pool", ("VM.Allocate",), f"{SCHEMA} DELETE /nodes/{{node}}/qemu/{{vmid}}"),),
    "agent_network_interfaces": (
        Need(
            "pool",
            ("VM.GuestAgent.Audit",),
            f"{SCHEMA} GET .../agent/network-get-interfaces"
            " (VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted)",
        ),
    ),
    # Seed 003's readiness (issue 14): cloud-init's result file, for templates that wait for it.
    # Proxmox 8.x/9 split the guest agent's privileges; file-read needs FileRead (or Unrestricted).
    "agent_file_read": (
        Need(
            "pool",
            ("VM.GuestAgent.FileRead",),
            f"{SCHEMA} GET .../agent/file-read"
            " (VM.GuestAgent.FileRead or VM.GuestAgent.Unrestricted)",
        ),
    ),
    # Own tasks need nothing beyond authentication (schema: user all, Sys.Audit only for
    # other identities' tasks).
    "task_status": (),
    "task_log": (),
    "node_tasks": (),
    # GET /access/permissions: every identity may read its own (schema: user all).
    "permissions": (),
}

# Called only by ``bootstrap_cluster`` with the administrator's token, never with proxyhub's.
ADMIN_CALLS = frozenset(
    {
        "pools",
        "create_pool",
        "roles",
        "create_role",
        "update_role",
        "users",
        "create_user",
        "user_tokens",
        "user_token",
        "create_token",
        "delete_token",
        "acl",
        "set_acl",
    }
)


def role_privileges() -> tuple[str, ...]:
    """Every privilege proxyhub's role holds: the union over ``ENDPOINTS``, sorted."""
    return tuple(sorted({p for needs in ENDPOINTS.values() for n in needs for p in n.privileges}))


def privileges_by_kind() -> dict[PathKind, frozenset[str]]:
    """What proxyhub needs on each kind of path."""
    out: dict[PathKind, set[str]] = {kind: set() for kind in PATH_KINDS}
    for needs in ENDPOINTS.values():
        for need in needs:
            out[need.kind].update(need.privileges)
    return {kind: frozenset(privs) for kind, privs in out.items()}


def bridge_path(bridge: str) -> str:
    return f"/sdn/zones/localnetwork/{bridge}"


@dataclass(frozen=True)
class AclTargets:
    """The objects of one cluster that proxyhub's ACLs are granted on."""

    pool: str
    templates: tuple[int, ...]
    storages: tuple[str, ...]
    bridges: tuple[str, ...]
    nodes: tuple[str, ...]

    def paths(self) -> dict[str, PathKind]:
        """ACL path -> its kind, in a stable order (pool, templates, storages, bridges, nodes)."""
        out: dict[str, PathKind] = {f"/pool/{self.pool}": "pool"}
        out.update({f"/vms/{vmid}": "template" for vmid in sorted(set(self.templates))})
        out.update({f"/storage/{s}": "storage" for s in sorted(set(self.storages))})
        out.update({bridge_path(b): "bridge" for b in sorted(set(self.bridges))})
        out.update({f"/nodes/{n}": "node" for n in sorted(set(self.nodes))})
        return out


def required_by_path(targets: AclTargets) -> dict[str, frozenset[str]]:
    """ACL path -> the privileges proxyhub needs there."""
    by_kind = privileges_by_kind()
    return {path: by_kind[kind] for path, kind in targets.paths().items()}


@dataclass(frozen=True)
class PrivilegeReport:
    """What a token holds against what proxyhub needs: missing ones fail, extra ones warn."""

    missing: Mapping[str, tuple[str, ...]]
    extra: Mapping[str, tuple[str, ...]]

    @property
    def ok(self) -> bool:
        return not self.missing


def compare(
    required: Mapping[str, Iterable[str]], granted: Mapping[str, Mapping[str, object]]
) -> PrivilegeReport:
    """Compare ``GET /access/permissions`` (path -> {privilege: propagate}) with ``required``.

    A privilege missing on a path proxyhub needs is a failure. A privilege beyond the role on
    any path the token holds rights on is a warning: it is more than proxyhub ever uses.
    """
    role = set(role_privileges())
    missing = {
        path: tuple(sorted(set(privs) - set(granted.get(path, {}))))
        for path, privs in required.items()
    }
    extra = {path: tuple(sorted(set(privs) - role)) for path, privs in granted.items()}
    return PrivilegeReport(
        missing={p: v for p, v in missing.items() if v},
        extra={p: v for p, v in sorted(extra.items()) if v},
    )
