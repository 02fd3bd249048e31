"""Preflight of a token's privileges (issue 14): what proxyhub needs against what it holds.

One GET, ``/access/permissions`` (every identity may read its own; schema: ``user: all``),
compared with ``privileges.required_by_path``: a privilege missing on a path proxyhub uses is a
failed check naming the path and the privilege; a privilege beyond proxyhub's role is a warning
(the token can do more than proxyhub ever asks, which least privilege wants avoided).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .api import Api
from .deadline import Deadline
from .preflight_reads import read_only
from .privileges import AclTargets, PrivilegeReport, compare, required_by_path

log = logging.getLogger("proxyhub.proxmox.preflight")


@dataclass(frozen=True)
class PrivilegeCheck:
    """``failed`` when a privilege is missing, else ``passed``; ``warnings`` list extras."""

    status: str
    failures: tuple[str, ...]
    warnings: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "code": "privileges",
            "status": self.status,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
        }


def privileges_report(
    api: Api, targets: AclTargets, *, deadline: Deadline | None = None
) -> PrivilegeReport:
    granted = read_only(api).permissions(deadline=deadline)
    return compare(required_by_path(targets), granted)


def privileges_check(
    api: Api, targets: AclTargets, *, deadline: Deadline | None = None
) -> PrivilegeCheck:
    report = privileges_report(api, targets, deadline=deadline)
    failures = tuple(
        f"missing {priv} on {path}" for path, privs in report.missing.items() for priv in privs
    )
    warnings = tuple(
        f"{priv} on {path} is beyond proxyhub's role"
        for path, privs in report.extra.items()
        for priv in privs
    )
    check = PrivilegeCheck("failed" if failures else "passed", failures, warnings)
    log.info(
        "proxmox privileges preflight",
        extra={"status": check.status, "missing": len(failures), "extra": len(warnings)},
    )
    return check
