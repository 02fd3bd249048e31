"""Where a cluster's token and CA files may be, and which CA is trusted for its url (issue 11).

The rules themselves are the Django-free client's (``provisioning.proxmox.credentials``): one
directory, ``PROXYHUB_CREDENTIALS_DIR``; a regular file inside it, symlinks resolved; at most
``MAX_TOKEN_FILE_BYTES`` or ``MAX_CA_FILE_BYTES``. This module applies them where a person
names the files (the admin form, ``import_catalogue``, the preflight), so a violation is refused
there with a message naming the field, before anything is written or sent; the transport
applies them again on every read.

The CA fingerprint is trust, not configuration: it is written only by those allowed to change
the endpoint (the admin with ``provisioning.change_cluster_endpoint``, ``import_catalogue`` run
by the operating-system user) and, when none is recorded yet, by the first preflight.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from provisioning.models import Cluster
from provisioning.proxmox.credentials import (
    CA_FILE,
    TOKEN_FILE,
    FileRule,
    ca_fingerprint,
    inspect_confined,
    load_ca,
)
from provisioning.proxmox.errors import CAFileInvalid, CAFileMissing, TransportError

# Model field → the rule of its catalogue key.
_RULES: dict[str, FileRule] = {"token_file": TOKEN_FILE, "ca_file": CA_FILE}


def credentials_dir() -> str:
    """The one directory tokenFile and caFile may name files in."""
    return str(settings.PROXYHUB_CREDENTIALS_DIR)


def credentials_file_problem(*, field: str, path: str) -> str | None:
    """Why ``path`` may not be ``field`` (``token_file`` or ``ca_file``), or None.

    A file that does not exist yet is no problem (it may land later; the import warns about
    it); one outside the directory, not a regular file, or too large is.
    """
    if not path:
        return None
    try:
        inspect_confined(path, _RULES[field], credentials_dir())
    except TransportError as err:
        return str(err)
    return None


def credentials_file_missing(*, field: str, path: str) -> bool:
    """Whether an allowed ``path`` names no file yet (False for a refused one: see above)."""
    if not path:
        return False
    try:
        return not inspect_confined(path, _RULES[field], credentials_dir())
    except TransportError:
        return False


def ca_fingerprint_now(*, ca_file: str) -> str:
    """The fingerprint of the CA in ``ca_file`` as it is now; blank when there is no CA file,
    it does not exist yet, or it holds no certificate (there is nothing to trust)."""
    if not ca_file:
        return ""
    try:
        return ca_fingerprint(load_ca(ca_file, root=credentials_dir()))
    except (CAFileMissing, CAFileInvalid):
        return ""


def cluster_trust_ca(*, cluster: Cluster) -> str:
    """Record the CA now in ``cluster.ca_file`` as the one trusted for its url, and save.

    For people allowed to change the endpoint (the admin action checks the permission). Returns
    the fingerprint, blank when there is nothing to trust yet.
    """
    found = ca_fingerprint_now(ca_file=cluster.ca_file)
    if found != cluster.ca_fingerprint:
        cluster.trust_ca(found)
        cluster.save(update_fields=["ca_fingerprint", "updated_at"])
    return found


def cluster_trust_ca_if_unrecorded(*, cluster: Cluster) -> None:
    """Trust on first use: the preflight records the CA it is about to load when no trust was
    recorded yet (a catalogue imported before its CA landed). Later it never overwrites one."""
    if cluster.ca_fingerprint or not cluster.ca_file or cluster.pk is None:
        return
    found = ca_fingerprint_now(ca_file=cluster.ca_file)
    if found:
        # Conditional, so a url changed meanwhile is not given this CA; updated_at moves so the
        # cached provider is rebuilt with the fingerprint (services.providers).
        updated = Cluster.objects.filter(pk=cluster.pk, ca_fingerprint="", url=cluster.url).update(
            ca_fingerprint=found, updated_at=timezone.now()
        )
        if updated:
            cluster.refresh_from_db(fields=["ca_fingerprint", "updated_at"])


def cluster_credentials_validate(*, cluster: Cluster) -> None:
    """Raise ``ValidationError`` naming each of tokenFile and caFile that breaks the rules."""
    problems = [
        problem
        for field in ("token_file", "ca_file")
        if (problem := credentials_file_problem(field=field, path=getattr(cluster, field)))
    ]
    if problems:
        raise ValidationError(problems)
