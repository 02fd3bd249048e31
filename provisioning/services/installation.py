"""This installation's identity, held in the database *and* outside it.

Every VM proxyhub creates carries the installation id in its mark (DESIGN.md §2), and GC
collects only VMs of this installation whose proxy is gone. If the identity lived only in the
database, a database restored or copied elsewhere (staging, a second deployment) would believe
every VM of the original installation to be its own orphan and collect them. So the identity is
also kept outside the database, in the setting ``PROXYHUB_INSTALLATION_ID`` or else in the file
``PROXYHUB_INSTALLATION_ID_FILE`` (``var/installation-id``), and GC deletes only when both are
there and agree; creates refuse to mark VMs with an identity the deployment does not own.

A brand-new database takes the configured identity when there is one; when there is none it
draws a new id and writes it to the file, so a first ``make run`` needs no step of its own. A
database that already has an identity is never given one from outside: that is the decision
an operator must make (the error says which value to set).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from provisioning.models import Installation

log = logging.getLogger("proxyhub.installation")

_MAX_ID = 64


@dataclass(frozen=True)
class ExternalIdentity:
    """The identity outside the database: its value (None when absent) and where it is kept."""

    value: str | None
    source: str


def external_identity() -> ExternalIdentity:
    configured = str(getattr(settings, "PROXYHUB_INSTALLATION_ID", "") or "").strip()
    if configured:
        return ExternalIdentity(configured, "the setting PROXYHUB_INSTALLATION_ID")
    path = _id_file()
    if path is None:
        return ExternalIdentity(None, "PROXYHUB_INSTALLATION_ID")
    try:
        with open(path, encoding="utf-8") as handle:
            value = handle.read(_MAX_ID + 1).strip()
    except FileNotFoundError:
        value = ""
    except OSError as err:
        log.warning("installation id file unreadable", extra={"error": type(err).__name__})
        value = ""
    return ExternalIdentity(value or None, f"the file {path}")


def installation_id() -> str:
    """The database's installation id, created on first use (from the external identity when
    one is configured; otherwise a new one, also written to the file)."""
    row = Installation.objects.first()
    if row is not None:
        return row.installation_id
    external = external_identity()
    created = Installation.create_once(external.value)
    if external.value is None:
        _write_file(created)
    return created


def identity_problem() -> str | None:
    """Why the database's identity cannot be trusted to collect VMs, or None when it can."""
    database = installation_id()
    external = external_identity()
    if external.value is None:
        return (
            f"this installation's identity ({database}) is only in the database; GC deletes "
            f"VMs only when the identity kept outside it agrees. If this database belongs to "
            f"this deployment, set PROXYHUB_INSTALLATION_ID={database} (or write it to "
            f"{_id_file() or 'PROXYHUB_INSTALLATION_ID_FILE'})"
        )
    if external.value != database:
        return (
            f"the database belongs to installation {database} but this deployment is "
            f"{external.value} ({external.source}): the database was restored or copied from "
            "another installation. Nothing is collected or created until they agree: point "
            "this deployment at its own database, or set its identity to the database's if "
            "the database is truly its own"
        )
    return None


def identity_conflict() -> str | None:
    """Why this deployment must not create VMs with the database's identity: the identity kept
    outside the database names another installation (a database restored or copied from it).
    Creates check this; an identity kept only in the database (an older installation that has
    not written its file yet) does not stop them, only GC."""
    problem = identity_problem()
    if problem is None or external_identity().value is None:
        return None
    return problem


def _id_file() -> Path | None:
    configured = getattr(settings, "PROXYHUB_INSTALLATION_ID_FILE", None)
    if configured == "":
        return None
    if configured is None:
        return Path(getattr(settings, "VAR_DIR", "var")) / "installation-id"
    return Path(configured)


def _write_file(value: str) -> None:
    path = _id_file()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(value + "\n")
    except FileExistsError:
        pass  # another process wrote it first; identity_problem compares what is there
    except OSError as err:
        log.warning("installation id file not written", extra={"error": type(err).__name__})
