"""``bootstrap_cluster``: give a cluster a least-privilege token, once, with an admin's token.

The administrator's token is used for this one run and never stored: its file must lie inside
``PROXYHUB_CREDENTIALS_DIR`` like every credential file (``credentials``), the transport reads
it per request, and nothing here keeps, logs or echoes it. What the run makes on Proxmox is
``provisioning.proxmox.bootstrap``'s; this module adds what needs Django: the file the new
token's secret is written to (in the credentials directory, mode 0600, replaced atomically),
the cluster's catalogue entry (``tokenFile`` and ``pool``), and the check, with the new token
itself, that it holds every privilege proxyhub needs and nothing beyond its role.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from provisioning.models import Cluster
from provisioning.proxmox.bootstrap import Names, bootstrap
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.credentials import read_token
from provisioning.proxmox.errors import ApiError, PermanentError, ProxmoxError, TransportError
from provisioning.proxmox.preflight_privileges import PrivilegeCheck, privileges_check

from . import maintenance, providers
from .credentials import credentials_dir, credentials_file_problem
from .installation import installation_id

NAMES = Names()


class BootstrapInputError(ValueError):
    """Bad input: the message names the option and what is allowed; nothing was done."""


@dataclass
class BootstrapResult:
    pool: str
    role: str
    user: str
    token_id: str
    token_file: str
    acl_paths: list[str]
    changes: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    privileges: PrivilegeCheck | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "pool": self.pool,
            "role": self.role,
            "user": self.user,
            "tokenId": self.token_id,
            "tokenFile": self.token_file,
            "aclPaths": self.acl_paths,
            "changes": self.changes,
            "verified": self.verified,
            "privileges": self.privileges.as_dict() if self.privileges else None,
        }


def bootstrap_token_file(*, cluster: Cluster) -> str:
    """Where the cluster's own token is written: beside the other credentials."""
    return str(Path(credentials_dir()) / f"{cluster.name}-proxyhub.token")


def _write_secret(path: str, token_id: str, secret: str) -> None:
    """``USER@REALM!TOKENID=SECRET`` into ``path``: a fresh 0600 file renamed over the old one,
    so a reader sees the old token or the new one, never half of one."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".token-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(f"{token_id}={secret}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _signs_in(config: ProxmoxConfig, token_file: str, token_id: str) -> bool:
    """Whether ``token_file`` holds ``token_id`` and Proxmox accepts it (a lost or stale secret
    answers 401)."""
    try:
        if read_token(token_file, root=credentials_dir()).token_id != token_id:
            return False
        providers.api_with_token_file(config, token_file).version()
    except ApiError as err:
        if err.status == 401:
            return False
        raise
    except TransportError:
        return False
    return True


def cluster_bootstrap(
    *, cluster: Cluster, admin_token_file: str, rotate_token: bool = False, names: Names = NAMES
) -> BootstrapResult:
    """Make or verify pool, role, user, token and ACLs on ``cluster``; record the token file
    and the pool in its catalogue entry; check the new token's privileges. Idempotent.

    Refused while the whole cluster is in maintenance (issue 14): users, roles, tokens and ACLs
    are the cluster's, not one node's, so a node's switch alone does not stop it."""
    paused = maintenance.refusal(cluster)
    if paused:
        raise BootstrapInputError(paused)
    problem = credentials_file_problem(field="token_file", path=admin_token_file)
    if problem:
        raise BootstrapInputError(f"--admin-token-file: {problem}")
    if not os.path.isabs(admin_token_file) or not os.path.isfile(admin_token_file):
        raise BootstrapInputError(
            f"--admin-token-file: no file at {admin_token_file}; give the absolute path of a "
            f"file inside {credentials_dir()} holding USER@REALM!TOKENID=SECRET"
        )
    token_file = bootstrap_token_file(cluster=cluster)
    if os.path.realpath(token_file) == os.path.realpath(admin_token_file):
        raise BootstrapInputError(
            f"--admin-token-file: {admin_token_file} is where proxyhub's own token is written; "
            "put the administrator's token in another file"
        )
    config = cluster.proxmox_config(installation_id())
    admin = providers.api_with_token_file(config, admin_token_file)
    try:
        outcome = bootstrap(
            admin,
            config,
            names=names,
            store_secret=lambda token_id, secret: _write_secret(token_file, token_id, secret),
            token_usable=lambda: _signs_in(config, token_file, names.token_id),
            rotate=rotate_token,
        )
    finally:
        close = getattr(admin.transport, "close", None)
        if close is not None:
            close()

    # The catalogue entry: from now on the cluster works with its own token and its pool.
    if cluster.token_file != token_file or cluster.pool != names.pool:
        cluster.token_file = token_file
        cluster.pool = names.pool
        cluster.save(update_fields=["token_file", "pool", "updated_at"])
        outcome.changes.append(f"catalogue: tokenFile {token_file}, pool {names.pool}")

    own = providers.api_with_token_file(config, token_file)
    try:
        check = privileges_check(own, outcome.targets)
    except ProxmoxError as err:
        raise PermanentError(
            f"the new token could not read its own permissions: {err}", op="bootstrap"
        ) from err
    return BootstrapResult(
        pool=names.pool,
        role=names.role,
        user=names.user,
        token_id=names.token_id,
        token_file=token_file,
        acl_paths=outcome.acl_paths,
        changes=outcome.changes,
        verified=outcome.verified,
        privileges=check,
    )
