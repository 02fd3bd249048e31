"""Pools, roles, users, API tokens, ACLs and effective permissions (issue 14).

Shapes and parameters: the official schema (pve-reference ``schema/all-endpoints.json``,
vendored in ``data/extra-endpoints.json``). The error texts are pve-access-control's
(``src/PVE/API2/Pool.pm``, ``Role.pm``, ``User.pm``, ``ACL.pm``, ``AccessControl.pm``
``lock_user_config``, which prefixes the handler's ``die`` with what failed); pve-reference
does not carry them, so they are reproduced from those sources and marked as such in the note
of issue 14. All of them are synchronous 500s, as a plain ``die`` is.
"""

from __future__ import annotations

import re
from typing import Any

from .access import ALL_PRIVILEGES, BUILTIN_ROLES, REALMS, AclEntry, Pool, Token, User, normal_path
from .router import Ctx, handler
from .state import SimError

_USERID = re.compile(r"([^\s:/]+)@([A-Za-z][A-Za-z0-9.\-_]+)")


def _failed(what: str, why: str) -> SimError:
    """``lock_user_config``'s ``"$errmsg: $err"``."""
    return SimError(500, f"{what}: {why}")


def _user(ctx: Ctx, userid: str) -> User:
    user = ctx.cluster.access.users.get(userid)
    if user is None:
        raise SimError(500, f"no such user ('{userid}')")  # AccessControl.pm check_user_exist
    return user


def _split(value: str | None) -> list[str]:
    return [v for v in re.split(r"[,;\s]+", value or "") if v]


# --- pools (Pool.pm) -----------------------------------------------------------------------


@handler("GET /pools")
def pools_list(ctx: Ctx) -> list[dict[str, Any]]:
    """Only pools the caller may audit (schema: "List all pools where you have Pool.Audit")."""
    out = []
    for name, pool in sorted(ctx.cluster.access.pools.items()):
        if ctx.perms.has(f"/pool/{name}", "Pool.Audit"):
            out.append({"poolid": name, **({"comment": pool.comment} if pool.comment else {})})
    return out


@handler("POST /pools")
def pool_create(ctx: Ctx) -> None:
    poolid = ctx.params["poolid"]
    pools = ctx.cluster.access.pools
    if poolid in pools:
        raise _failed("create pool failed", f"pool '{poolid}' already exists")
    pools[poolid] = Pool(comment=ctx.text("comment") or "")


# --- roles (Role.pm) -----------------------------------------------------------------------


def _privs(value: str | None) -> tuple[str, ...]:
    privs = _split(value)
    for priv in privs:
        if priv not in ALL_PRIVILEGES:
            raise SimError(500, f"invalid privilege '{priv}'")  # AccessControl.pm verify_privname
    return tuple(sorted(set(privs)))


@handler("GET /access/roles")
def roles_list(ctx: Ctx) -> list[dict[str, Any]]:
    access = ctx.cluster.access
    out: list[dict[str, Any]] = [
        {"roleid": name, "privs": ",".join(privs), "special": 1}
        for name, privs in BUILTIN_ROLES.items()
    ]
    out += [{"roleid": name, "privs": ",".join(privs)} for name, privs in access.roles.items()]
    return sorted(out, key=lambda r: r["roleid"])


@handler("POST /access/roles")
def role_create(ctx: Ctx) -> None:
    roleid, access = ctx.params["roleid"], ctx.cluster.access
    if access.role(roleid) is not None:
        raise _failed("create role failed", f"role '{roleid}' already exists")
    access.roles[roleid] = _privs(ctx.text("privs"))


@handler("PUT /access/roles/{roleid}")
def role_update(ctx: Ctx) -> None:
    roleid, access = ctx.params["roleid"], ctx.cluster.access
    if roleid in BUILTIN_ROLES:
        raise _failed("update role failed", f"cannot modify special role '{roleid}'")
    if roleid not in access.roles:
        raise _failed("update role failed", f"role '{roleid}' does not exist")
    privs = _privs(ctx.text("privs"))
    if ctx.flag("append"):
        privs = tuple(sorted(set(access.roles[roleid]) | set(privs)))
    access.roles[roleid] = privs


# --- users and tokens (User.pm) ------------------------------------------------------------


def _token_info(tokenid: str | None, token: Token) -> dict[str, Any]:
    out: dict[str, Any] = {"privsep": int(token.privsep), "expire": token.expire}
    if token.comment:
        out["comment"] = token.comment
    if tokenid is not None:
        out["tokenid"] = tokenid
    return out


@handler("GET /access/users")
def users_list(ctx: Ctx) -> list[dict[str, Any]]:
    """Users the caller may see (User.Modify or Sys.Audit on /access/groups), and itself."""
    own = ctx.user.split("!")[0]
    see_all = ctx.perms.has("/access/groups", "User.Modify") or ctx.perms.has(
        "/access/groups", "Sys.Audit"
    )
    out = []
    for userid, user in sorted(ctx.cluster.access.users.items()):
        if not (see_all or userid == own):
            continue
        entry: dict[str, Any] = {"userid": userid, "enable": int(user.enable), "expire": 0}
        if user.comment:
            entry["comment"] = user.comment
        if ctx.flag("full"):
            entry["tokens"] = [_token_info(t, tok) for t, tok in sorted(user.tokens.items())]
        out.append(entry)
    return out


@handler("POST /access/users")
def user_create(ctx: Ctx) -> None:
    userid, access = ctx.params["userid"], ctx.cluster.access
    match = _USERID.fullmatch(userid)
    if match is None:
        raise SimError.params({"userid": f"value '{userid}' does not look like a valid user name"})
    if match.group(2) not in REALMS:
        raise _failed("create user failed", f"domain '{match.group(2)}' does not exist")
    if userid in access.users:
        raise _failed("create user failed", f"user '{userid}' already exists")
    access.users[userid] = User(
        userid=userid, comment=ctx.text("comment") or "", enable=ctx.flag("enable", True)
    )


@handler("GET /access/users/{userid}/token")
def tokens_list(ctx: Ctx) -> list[dict[str, Any]]:
    user = _user(ctx, ctx.params["userid"])
    return [_token_info(t, tok) for t, tok in sorted(user.tokens.items())]


def _token(ctx: Ctx) -> tuple[User, str, Token]:
    user, tokenid = _user(ctx, ctx.params["userid"]), ctx.params["tokenid"]
    token = user.tokens.get(tokenid)
    if token is None:
        raise SimError(500, f"no such token '{tokenid}' for user '{user.userid}'")
    return user, tokenid, token


@handler("GET /access/users/{userid}/token/{tokenid}")
def token_read(ctx: Ctx) -> dict[str, Any]:
    token = _token(ctx)[2]
    return _token_info(None, token)


@handler("POST /access/users/{userid}/token/{tokenid}")
def token_create(ctx: Ctx) -> dict[str, Any]:
    """The secret is in this answer and nowhere else, ever (User.pm ``generate_token``)."""
    user, tokenid = _user(ctx, ctx.params["userid"]), ctx.params["tokenid"]
    if tokenid in user.tokens:
        raise _failed("generating token failed", "Token already exists.")
    token = Token(
        privsep=ctx.flag("privsep", True),
        comment=ctx.text("comment") or "",
        expire=ctx.integer("expire", 0) or 0,
        secret=ctx.cluster.access.new_secret(),
    )
    user.tokens[tokenid] = token
    return {
        "full-tokenid": f"{user.userid}!{tokenid}",
        "info": _token_info(None, token),
        "value": token.secret,
    }


@handler("DELETE /access/users/{userid}/token/{tokenid}")
def token_delete(ctx: Ctx) -> None:
    user, tokenid, _ = _token(ctx)
    ctx.cluster.access.remove_token(user.userid, tokenid)


# --- ACLs (ACL.pm) and effective permissions (AccessControl.pm) -----------------------------


@handler("GET /access/acl")
def acl_list(ctx: Ctx) -> list[dict[str, Any]]:
    """Entries on paths where the caller may modify permissions."""
    return [
        {
            "path": e.path,
            "type": e.type,
            "ugid": e.ugid,
            "roleid": e.roleid,
            "propagate": int(e.propagate),
        }
        for e in ctx.cluster.access.acl
        if ctx.perms.has(e.path, "Permissions.Modify")
    ]


@handler("PUT /access/acl")
def acl_update(ctx: Ctx) -> None:
    access = ctx.cluster.access
    path = normal_path(ctx.params["path"])
    if not re.fullmatch(r"/|(/[^/\s]+)+", path):
        raise _failed("ACL update failed", f"invalid ACL path '{ctx.params['path']}'")
    roles = _split(ctx.text("roles"))
    for role in roles:
        if access.role(role) is None:
            raise _failed("ACL update failed", f"role '{role}' does not exist")
    targets: list[tuple[str, str]] = []
    for userid in _split(ctx.text("users")):
        if userid not in access.users:
            raise _failed("ACL update failed", f"user '{userid}' does not exist")
        targets.append(("user", userid))
    for token_id in _split(ctx.text("tokens")):
        if access.token(token_id) is None:
            userid, _sep, name = token_id.partition("!")
            raise _failed("ACL update failed", f"no such token '{name}' for user '{userid}'")
        targets.append(("token", token_id))
    if _split(ctx.text("groups")):
        raise SimError(501, "groups are not simulated")
    propagate = ctx.flag("propagate", True)
    delete = ctx.flag("delete")
    for kind, ugid in targets:
        for role in roles:
            access.acl = [
                e
                for e in access.acl
                if not (e.path == path and e.type == kind and e.ugid == ugid and e.roleid == role)
            ]
            if not delete:
                access.acl.append(AclEntry(path, kind, ugid, role, propagate))


@handler("GET /access/permissions")
def permissions_read(ctx: Ctx) -> dict[str, dict[str, int]]:
    """Path -> {privilege: propagate}, for the caller (a ``userid`` of another identity needs
    Sys.Audit on /access, except for the caller's own tokens)."""
    identity = ctx.text("userid") or ctx.user
    own = ctx.user.split("!")[0]
    if identity != ctx.user and identity.split("!")[0] != own:
        ctx.perms.require("/access", "Sys.Audit")
    perms = ctx.sim.permissions.for_identity(identity)
    wanted = ctx.text("path")
    paths = [normal_path(wanted)] if wanted else ctx.cluster.access.paths()
    out = {}
    for path in paths:
        held = perms.effective(path)
        if held or wanted:
            out[path] = held
    return out
