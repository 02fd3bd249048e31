"""Privileges of the simulator's token and Proxmox's permission checks (pve-reference §2.3-2.4).

By default the engine's token may do everything. ``Control.deny`` removes a privilege on an ACL path
and everything below it (``/vms`` covers ``/vms/123``; ``/`` covers all), which is enough to
exercise every 403 proxyhub can meet. The endpoint-level check is the ``permissions.check``
expression of the official schema, evaluated like pve-access-control's
``exec_api2_perm_check``; checks Proxmox makes inside handlers (config keys, storages, the
volume delete) are made by the handlers through ``Permissions.require``.

Identities created through the API (``access.Access``: a user, a privilege-separated token)
hold only what their ACLs grant, on top of the denials: ``for_identity`` gives the view a
request is checked with, so a token lacking a privilege meets Proxmox's own 403.

Texts: a single check names its path and privilege, ``any`` checks join the alternatives with
``|``, and a failed ``and``/``or`` combination says only ``Permission check failed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .access import ALL_PRIVILEGES, Access
from .state import SimError

_PLAIN = "Permission check failed"


def perm_error(path: str, privs: Sequence[str]) -> SimError:
    return SimError(403, f"{_PLAIN} ({path}, {'|'.join(privs)})")


class Permissions:
    """Denied ``(path prefix, privilege)`` pairs; everything else is granted, except to an
    identity ``access`` governs, which holds only what its ACLs grant."""

    def __init__(
        self,
        access: Access | None = None,
        *,
        identity: str | None = None,
        denied: list[tuple[str, str]] | None = None,
    ) -> None:
        # Shared by every per-request view, so a denial reaches them all.
        self._denied: list[tuple[str, str]] = denied if denied is not None else []
        self._access = access
        self._identity = identity

    def for_identity(self, identity: str) -> Permissions:
        """The rights of ``identity`` (the authenticated token of a request)."""
        return Permissions(self._access, identity=identity, denied=self._denied)

    @property
    def governed(self) -> bool:
        """Whether this view's rights come from ACLs rather than being all granted."""
        return bool(
            self._access is not None
            and self._identity is not None
            and self._access.governs(self._identity)
        )

    def effective(self, path: str) -> dict[str, int]:
        """Privilege -> propagate (1/0) on ``path``, as ``GET /access/permissions`` shows it."""
        if self.governed:
            assert self._access is not None and self._identity is not None
            held = self._access.privileges(self._identity, path)
            return {p: int(v) for p, v in sorted(held.items()) if self.has(path, p)}
        return {p: 1 for p in ALL_PRIVILEGES if self.has(path, p)}

    def deny(self, path: str, privilege: str) -> None:
        entry = (_normal(path), privilege)
        if entry not in self._denied:
            self._denied.append(entry)

    def allow(self, path: str | None = None, privilege: str | None = None) -> None:
        """Lift denials matching ``path`` and/or ``privilege`` (both ``None``: all of them)."""
        self._denied[:] = [
            (p, v)
            for p, v in self._denied
            if not ((path is None or p == _normal(path)) and (privilege is None or v == privilege))
        ]

    def denied(self) -> list[tuple[str, str]]:
        return list(self._denied)

    def has(self, path: str, privilege: str) -> bool:
        path = _normal(path)
        for prefix, priv in self._denied:
            if priv in (privilege, "*") and (
                prefix == "/" or path == prefix or path.startswith(prefix + "/")
            ):
                return False
        if self.governed:
            assert self._access is not None and self._identity is not None
            return privilege in self._access.privileges(self._identity, path)
        return True

    def require(self, path: str, *privs: str, any_of: bool = False) -> None:
        """Raise Proxmox's 403 unless the token holds ``privs`` (all, or one with ``any_of``)."""
        if any_of:
            if not any(self.has(path, p) for p in privs):
                raise perm_error(path, privs)
            return
        for priv in privs:
            if not self.has(path, priv):
                raise perm_error(path, [priv])

    # --- schema expressions -------------------------------------------------------------

    def check_endpoint(self, permissions: Mapping[str, Any], params: Mapping[str, str]) -> None:
        """The schema's ``permissions`` of an endpoint; ``user: all`` needs only a login."""
        check = permissions.get("check")
        if not check:
            return
        if check[0] == "perm":
            self._perm(check, params, raise_error=True)
        elif not self._eval(check, params):
            raise SimError(403, _PLAIN)

    def _eval(self, check: Sequence[Any], params: Mapping[str, str]) -> bool:
        op = check[0]
        if op == "and":
            return all(self._eval(sub, params) for sub in check[1:])
        if op == "or":
            return any(self._eval(sub, params) for sub in check[1:])
        if op == "perm":
            return self._perm(check, params, raise_error=False)
        if not self.governed:
            return True  # the engine's own token holds every right
        return self._identity_check(check, params)

    def _identity_check(self, check: Sequence[Any], params: Mapping[str, str]) -> bool:
        """pve-access-control ``RPCEnvironment.pm`` ``check_api2_permissions`` for the checks
        that name users rather than paths (the access endpoints)."""
        op, userid = check[0], params.get("userid", "")
        identity = self._identity or ""
        if op == "userid-param" and check[1] == "self":
            return bool(identity) and identity.split("!")[0] == userid
        if op == "userid-param":
            realm = userid.rpartition("@")[2]
            return self.has(f"/access/realm/{realm}", str(check[1]))
        if op == "userid-group":
            return any(self.has("/access/groups", p) for p in check[1])
        if op == "perm-modify":
            return self.has(_expand(str(check[1]), params), "Permissions.Modify")
        return False

    def _perm(self, check: Sequence[Any], params: Mapping[str, str], *, raise_error: bool) -> bool:
        path_template, privs = check[1], list(check[2])
        options = dict(zip(check[3::2], check[4::2], strict=False))
        required_param = options.get("require_param")
        if required_param and required_param not in params:
            return False
        path = _expand(path_template, params)
        if options.get("any"):
            ok = any(self.has(path, p) for p in privs)
            if not ok and raise_error:
                raise perm_error(path, privs)
            return ok
        for priv in privs:
            if not self.has(path, priv):
                if raise_error:
                    raise perm_error(path, [priv])
                return False
        return True


def _expand(template: str, params: Mapping[str, str]) -> str:
    out = template
    for key, value in params.items():
        out = out.replace("{" + key + "}", str(value))
    return out


def _normal(path: str) -> str:
    path = "/" + path.strip("/")
    return path
