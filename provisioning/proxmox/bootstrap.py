"""Least-privilege bootstrap of a cluster (issue 14; seed 004: pools, users, tokens, ACLs).

With an administrator's API (its token is the caller's business: read from its file by the
transport, never kept), make or verify, each step "ensure"-shaped so a second run changes
nothing:

1. the resource pool every proxy VM joins at clone;
2. a role holding exactly ``privileges.role_privileges()`` (replaced when it drifted);
3. the user, without a password (proxyhub only signs in with its token);
4. a privilege-separated API token. Proxmox shows a token's secret once, at creation: the
   secret goes straight to ``store_secret`` and nowhere else. A token that exists already is
   verified through ``token_usable`` (does the stored secret still sign in?); when it does
   not, the run is refused with what to do (``rotate``), never a second token made silently;
5. ACLs granting the role on the pool, the templates, the storages, the bridges and the nodes
   only (``privileges.AclTargets``), to the user and to the token (a privilege-separated
   token holds the intersection of both; pve-reference §2.1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .api import Api
from .config import ProxmoxConfig
from .deadline import Deadline
from .disks import is_cdrom, is_disk_key
from .errors import PermanentError
from .privileges import AclTargets, role_privileges

_NET_KEY = re.compile(r"net\d+")
_BRIDGE = re.compile(r"(?:^|,)bridge=([^,]+)")


@dataclass(frozen=True)
class Names:
    """What the bootstrap makes on Proxmox."""

    pool: str = "proxyhub"
    role: str = "ProxyHub"
    user: str = "proxyhub@pve"
    token: str = "proxyhub"  # noqa: S105 - the token's name, not its secret

    @property
    def token_id(self) -> str:
        return f"{self.user}!{self.token}"


@dataclass
class Outcome:
    """What one run did (``changes``) and what it found already right (``verified``)."""

    targets: AclTargets
    changes: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)

    @property
    def acl_paths(self) -> list[str]:
        return list(self.targets.paths())


class BootstrapRefused(PermanentError):
    """The bootstrap cannot go on without the operator (a token whose secret is lost)."""


def _template_objects(
    api: Api, config: ProxmoxConfig, deadline: Deadline | None
) -> tuple[set[str], set[str]]:
    """Storages and bridges the templates' clones use: their disks' storages (clones land
    there when ``storage`` is unset) and their NICs' bridges (a clone keeps them when
    ``bridge`` is unset); the clone needs rights on both (pve-reference §2.4, clone)."""
    wanted = {ref.vmid for ref in config.templates.values()}
    where = {
        int(e["vmid"]): str(e["node"])
        for e in api.cluster_resources(deadline=deadline)
        if e.get("type") == "qemu" and int(e.get("vmid", 0)) in wanted and e.get("node")
    }
    storages: set[str] = set()
    bridges: set[str] = set()
    for vmid, node in sorted(where.items()):
        for key, value in api.vm_config(node, vmid, deadline=deadline).items():
            if is_disk_key(key) and not is_cdrom(value) and ":" in value.split(",")[0]:
                storages.add(value.split(",")[0].split(":", 1)[0])
            elif _NET_KEY.fullmatch(key) and (found := _BRIDGE.search(value)):
                bridges.add(found.group(1))
    return storages, bridges


def acl_targets(
    api: Api, config: ProxmoxConfig, names: Names, deadline: Deadline | None = None
) -> AclTargets:
    """The objects of ``config`` proxyhub's ACLs are granted on."""
    template_storages, template_bridges = _template_objects(api, config, deadline)
    storages = {config.iso_storage} | ({config.storage} if config.storage else template_storages)
    bridges = {config.bridge} if config.bridge else template_bridges
    return AclTargets(
        pool=names.pool,
        templates=tuple(sorted({ref.vmid for ref in config.templates.values()})),
        storages=tuple(sorted(storages)),
        bridges=tuple(sorted(bridges)),
        nodes=tuple(config.nodes),
    )


def _has_acl(
    entries: Iterable[Mapping[str, Any]], path: str, kind: str, ugid: str, role: str
) -> bool:
    return any(
        e.get("path") == path
        and e.get("type") == kind
        and e.get("ugid") == ugid
        and e.get("roleid") == role
        and str(e.get("propagate", 1)) == "1"
        for e in entries
    )


def bootstrap(
    api: Api,
    config: ProxmoxConfig,
    *,
    names: Names,
    store_secret: Callable[[str, str], None],
    token_usable: Callable[[], bool],
    rotate: bool = False,
    deadline: Deadline | None = None,
) -> Outcome:
    """Make or verify pool, role, user, token and ACLs; see the module docstring."""
    outcome = Outcome(targets=acl_targets(api, config, names, deadline))

    if any(p.get("poolid") == names.pool for p in api.pools(deadline=deadline)):
        outcome.verified.append(f"pool {names.pool}")
    else:
        api.create_pool(names.pool, comment="proxyhub proxy VMs", deadline=deadline)
        outcome.changes.append(f"created pool {names.pool}")

    wanted = list(role_privileges())
    role = next((r for r in api.roles(deadline=deadline) if r.get("roleid") == names.role), None)
    if role is None:
        api.create_role(names.role, privs=wanted, deadline=deadline)
        outcome.changes.append(f"created role {names.role}")
    elif sorted(p for p in str(role.get("privs", "")).split(",") if p) != wanted:
        api.update_role(names.role, privs=wanted, deadline=deadline)
        outcome.changes.append(f"set the privileges of role {names.role}")
    else:
        outcome.verified.append(f"role {names.role}")

    if any(u.get("userid") == names.user for u in api.users(deadline=deadline)):
        outcome.verified.append(f"user {names.user}")
    else:
        api.create_user(names.user, comment="proxyhub service account", deadline=deadline)
        outcome.changes.append(f"created user {names.user}")

    tokens = {t.get("tokenid"): t for t in api.user_tokens(names.user, deadline=deadline)}
    existing = tokens.get(names.token)
    if existing is not None and not rotate:
        if str(existing.get("privsep", 1)) != "1":
            raise BootstrapRefused(
                f"token {names.token_id} exists without privilege separation; "
                "run again with --rotate-token to replace it by a privilege-separated one",
                op="bootstrap",
            )
        if not token_usable():
            raise BootstrapRefused(
                f"token {names.token_id} exists on Proxmox, but the secret stored for it does "
                "not sign in, and Proxmox never shows a secret again; run again with "
                "--rotate-token to delete it and make a new one (proxyhub's token file is "
                "replaced; nothing else changes)",
                op="bootstrap",
            )
        outcome.verified.append(f"token {names.token_id}")
    else:
        if existing is not None:
            # Deleting a token drops its ACLs too (pve-access-control delete_token); they are
            # granted again below.
            api.delete_token(names.user, names.token, deadline=deadline)
            outcome.changes.append(f"deleted token {names.token_id}")
        made = api.create_token(
            names.user, names.token, privsep=True, comment="proxyhub", deadline=deadline
        )
        secret = str(made.get("value") or "")
        if not secret:
            raise PermanentError("Proxmox returned no token value", op="bootstrap")
        store_secret(str(made.get("full-tokenid") or names.token_id), secret)
        del secret
        outcome.changes.append(f"created token {names.token_id}")

    entries = api.acl(deadline=deadline)
    for path in outcome.acl_paths:
        users = [] if _has_acl(entries, path, "user", names.user, names.role) else [names.user]
        tokens_missing = (
            [] if _has_acl(entries, path, "token", names.token_id, names.role) else [names.token_id]
        )
        if users or tokens_missing:
            api.set_acl(
                path, roles=[names.role], users=users, tokens=tokens_missing, deadline=deadline
            )
            outcome.changes.append(f"granted {names.role} on {path}")
        else:
            outcome.verified.append(f"ACL {path}")
    return outcome
