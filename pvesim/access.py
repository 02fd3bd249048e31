"""Users, API tokens, roles, ACLs and resource pools: Proxmox's ``user.cfg`` (issue 14).

Plain data and pve-access-control's rules over it, for identities created through the API
(``POST /access/users``, ``POST /access/users/{userid}/token/{tokenid}``). The engine's own
token (the one in its token file) is not one of them: it keeps the full rights
``permissions.Permissions`` gives it, so nothing built before this module changes.

Rules (pve-access-control ``src/PVE/AccessControl.pm`` ``roles``/``permission``,
``src/PVE/RPCEnvironment.pm`` ``permissions``, pve-reference §2.1 "Privilege separation"):

* an ACL entry grants a role on a path to a user or a token; entries at the path itself always
  apply, entries on a parent apply only when they propagate, and entries at a deeper level
  replace what the identity inherited from above (``NoAccess`` takes everything away);
* a guest in a pool inherits the pool's ACLs (``/pool/<pool>`` stands as its parent);
* a privilege-separated token holds what both its user and the token's own ACLs grant; a token
  without privilege separation holds what its user does;
* a token's secret is a UUID, shown only once, in the answer to its creation.
"""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass, field

# pve-reference schema all-endpoints.json, ``GET /access/roles/{roleid}``: the privileges of
# Proxmox VE 9.1.
ALL_PRIVILEGES: tuple[str, ...] = (
    "Datastore.Allocate",
    "Datastore.AllocateSpace",
    "Datastore.AllocateTemplate",
    "Datastore.Audit",
    "Group.Allocate",
    "Mapping.Audit",
    "Mapping.Modify",
    "Mapping.Use",
    "Permissions.Modify",
    "Pool.Allocate",
    "Pool.Audit",
    "Realm.Allocate",
    "Realm.AllocateUser",
    "SDN.Allocate",
    "SDN.Audit",
    "SDN.Use",
    "Sys.AccessNetwork",
    "Sys.Audit",
    "Sys.Console",
    "Sys.Incoming",
    "Sys.Modify",
    "Sys.PowerMgmt",
    "Sys.Syslog",
    "User.Modify",
    "VM.Allocate",
    "VM.Audit",
    "VM.Backup",
    "VM.Clone",
    "VM.Config.CDROM",
    "VM.Config.CPU",
    "VM.Config.Cloudinit",
    "VM.Config.Disk",
    "VM.Config.HWType",
    "VM.Config.Memory",
    "VM.Config.Network",
    "VM.Config.Options",
    "VM.Console",
    "VM.GuestAgent.Audit",
    "VM.GuestAgent.FileRead",
    "VM.GuestAgent.FileSystemMgmt",
    "VM.GuestAgent.FileWrite",
    "VM.GuestAgent.Unrestricted",
    "VM.Migrate",
    "VM.PowerMgmt",
    "VM.Replicate",
    "VM.Snapshot",
    "VM.Snapshot.Rollback",
)

# Built-in roles (pve-reference §2.4; pve-access-control ``AccessControl.pm``): ``special`` in
# ``GET /access/roles``; they cannot be changed.
BUILTIN_ROLES: dict[str, tuple[str, ...]] = {
    "Administrator": ALL_PRIVILEGES,
    "NoAccess": (),
    "PVEAuditor": tuple(p for p in ALL_PRIVILEGES if p.endswith(".Audit")),
    "PVEVMAdmin": tuple(p for p in ALL_PRIVILEGES if p.startswith("VM.")),
    "PVEDatastoreUser": ("Datastore.AllocateSpace", "Datastore.Audit"),
    "PVEDatastoreAdmin": (
        "Datastore.Allocate",
        "Datastore.AllocateSpace",
        "Datastore.AllocateTemplate",
        "Datastore.Audit",
    ),
    "PVETemplateUser": ("VM.Audit", "VM.Clone"),
    "PVESDNUser": ("SDN.Audit", "SDN.Use"),
}

# Realms every installation has (pam, pve); a user of another realm is refused.
REALMS = ("pam", "pve")

# Paths ``GET /access/permissions`` always looks at, beside every ACL path and pool
# (pve-access-control ``RPCEnvironment.pm`` ``get_effective_permissions``).
STANDARD_PATHS = ("/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms")


@dataclass
class Token:
    privsep: bool = True
    comment: str = ""
    expire: int = 0
    secret: str = field(default="", repr=False)


@dataclass
class User:
    userid: str
    comment: str = ""
    enable: bool = True
    expire: int = 0
    tokens: dict[str, Token] = field(default_factory=dict)


@dataclass(frozen=True)
class AclEntry:
    path: str
    type: str  # user, token
    ugid: str
    roleid: str
    propagate: bool = True


@dataclass
class Pool:
    comment: str = ""
    vms: set[int] = field(default_factory=set)


def normal_path(path: str) -> str:
    """pve-access-control ``normalize_path``: one leading slash, no trailing or double ones."""
    parts = [p for p in path.split("/") if p]
    return "/" + "/".join(parts)


@dataclass
class Access:
    """``user.cfg`` of the simulated cluster."""

    users: dict[str, User] = field(default_factory=dict)
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)  # custom roles only
    acl: list[AclEntry] = field(default_factory=list)
    pools: dict[str, Pool] = field(default_factory=dict)

    # --- lookups ------------------------------------------------------------------------

    def role(self, roleid: str) -> tuple[str, ...] | None:
        if roleid in BUILTIN_ROLES:
            return BUILTIN_ROLES[roleid]
        return self.roles.get(roleid)

    def token(self, token_id: str) -> tuple[User, Token] | None:
        """The user and token of ``user@realm!name``, or None."""
        userid, sep, name = token_id.partition("!")
        user = self.users.get(userid)
        if not sep or user is None or name not in user.tokens:
            return None
        return user, user.tokens[name]

    def governs(self, identity: str) -> bool:
        """Whether ``identity`` is one of this ``user.cfg``'s users or tokens."""
        return self.token(identity) is not None if "!" in identity else identity in self.users

    def authenticate(self, token_id: str, secret: str) -> bool:
        found = self.token(token_id)
        if found is None:
            return False
        user, token = found
        return user.enable and hmac.compare_digest(token.secret.encode(), secret.encode())

    def new_secret(self) -> str:
        return str(uuid.uuid4())

    def pool_of(self, vmid: int) -> str | None:
        return next((name for name, pool in self.pools.items() if vmid in pool.vms), None)

    def forget_vm(self, vmid: int) -> None:
        """A destroyed guest leaves its pool (qemu-server destroy: ``remove_vm_access``)."""
        for pool in self.pools.values():
            pool.vms.discard(vmid)

    def remove_token(self, userid: str, tokenid: str) -> None:
        """Delete the token and its ACL entries (pve-access-control ``delete_token``)."""
        self.users[userid].tokens.pop(tokenid, None)
        full = f"{userid}!{tokenid}"
        self.acl = [e for e in self.acl if not (e.type == "token" and e.ugid == full)]

    # --- privileges ---------------------------------------------------------------------

    def _chain(self, path: str) -> list[str]:
        """The paths whose entries reach ``path``, root first; a pooled guest's pool counts
        as one of its parents."""
        path = normal_path(path)
        parts = [p for p in path.split("/") if p]
        chain = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        if len(parts) == 2 and parts[0] == "vms" and parts[1].isdigit():
            pool = self.pool_of(int(parts[1]))
            if pool is not None:
                chain = ["/", "/pool", f"/pool/{pool}", "/vms", path]
        return chain

    def _grants(self, ugid: str, kind: str, path: str) -> dict[str, bool]:
        """Privilege -> propagate, from the entries of one user or token alone."""
        chain = self._chain(path)
        target = chain[-1]
        current: dict[str, bool] = {}
        for level in chain:
            entries = [
                e
                for e in self.acl
                if e.type == kind
                and e.ugid == ugid
                and e.path == level
                and (level == target or e.propagate)
            ]
            if not entries:
                continue
            current = {}  # a deeper level replaces what came from above
            for entry in entries:
                for priv in self.role(entry.roleid) or ():
                    current[priv] = current.get(priv, False) or entry.propagate
        return current

    def privileges(self, identity: str, path: str) -> dict[str, bool]:
        """Privilege -> propagate that ``identity`` (a user or a token) holds on ``path``."""
        if "!" not in identity:
            user = self.users.get(identity)
            return self._grants(identity, "user", path) if user and user.enable else {}
        found = self.token(identity)
        if found is None:
            return {}
        user, token = found
        mine = self.privileges(user.userid, path)
        if not token.privsep:
            return mine
        own = self._grants(identity, "token", path)
        return {p: mine[p] and own[p] for p in mine if p in own}

    def paths(self) -> list[str]:
        """What ``GET /access/permissions`` reports on: standard paths, pools, ACL paths."""
        found = set(STANDARD_PATHS)
        found.update(f"/pool/{name}" for name in self.pools)
        found.update(e.path for e in self.acl)
        return sorted(found)
