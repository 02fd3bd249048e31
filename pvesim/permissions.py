"""Privileges of the simulator's token and Proxmox's permission checks (pve-reference §2.3-2.4).

By default the token may do everything. ``Control.deny`` removes a privilege on an ACL path
and everything below it (``/vms`` covers ``/vms/123``; ``/`` covers all), which is enough to
exercise every 403 proxyhub can meet. The endpoint-level check is the ``permissions.check``
expression of the official schema, evaluated like pve-access-control's
``exec_api2_perm_check``; checks Proxmox makes inside handlers (config keys, storages, the
volume delete) are made by the handlers through ``Permissions.require``.

Texts: a single check names its path and privilege, ``any`` checks join the alternatives with
``|``, and a failed ``and``/``or`` combination says only ``Permission check failed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .state import SimError

_PLAIN = "Permission check failed"


def perm_error(path: str, privs: Sequence[str]) -> SimError:
    return SimError(403, f"{_PLAIN} ({path}, {'|'.join(privs)})")


class Permissions:
    """Denied ``(path prefix, privilege)`` pairs; everything else is granted."""

    def __init__(self) -> None:
        self._denied: list[tuple[str, str]] = []

    def deny(self, path: str, privilege: str) -> None:
        entry = (_normal(path), privilege)
        if entry not in self._denied:
            self._denied.append(entry)

    def allow(self, path: str | None = None, privilege: str | None = None) -> None:
        """Lift denials matching ``path`` and/or ``privilege`` (both ``None``: all of them)."""
        self._denied = [
            (p, v)
            for p, v in self._denied
            if not ((path is None or p == _normal(path)) and (privilege is None or v == privilege))
        ]

    def denied(self) -> list[tuple[str, str]]:
        return list(self._denied)

    def has(self, path: str, privilege: str) -> bool:
        if not self._denied:
            return True
        path = _normal(path)
        for prefix, priv in self._denied:
            if priv in (privilege, "*") and (
                prefix == "/" or path == prefix or path.startswith(prefix + "/")
            ):
                return False
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
        return True  # userid-group, userid-param...: not used by the endpoints in scope

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
