"""The simulator's working directory: its CA, server certificate, token and catalogue.

``python -m pvesim --workdir DIR`` (DESIGN.md §7) leaves in ``DIR`` everything a client needs
to talk to it the way it would talk to a real cluster:

``ca.pem`` / ``ca-key.pem``
    A private CA made with trustme. It is kept across restarts, so a client that saved
    ``ca.pem`` keeps trusting the simulator (seed 000 entry 14: the CA is loaded once and
    cached by the client).
``server.pem`` / ``server-key.pem``
    The server certificate, issued afresh on every start for ``127.0.0.1``, ``localhost`` and
    ``--host``, so a changed ``--host`` is always covered.
``token``
    One line ``USER@REALM!TOKENID=SECRET`` (seed 000 entry 14), reused across restarts; the
    engine is built to accept exactly this token.
``catalogue.yaml``
    A ``ProxmoxCluster`` document ready for ``import_catalogue`` (DESIGN.md §7): cluster
    ``pvesim``, every node, image ``debian-13`` on a good template, machine type ``small``.

Secrets (the CA key, the server key, the token) are written owner-only and never logged.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trustme
import yaml

# The identity the simulator's token belongs to; any grammar-conforming token id works.
DEFAULT_TOKEN_ID = "proxyhub@pve!sim"  # noqa: S105 - an identity, not a secret
CLUSTER_NAME = "pvesim"
ISO_STORAGE = "proxy-seeds"
IMAGE_KEY = "debian-13"
MACHINE_TYPES = {"small": {"cores": 1, "memoryMiB": 1024, "diskGiB": 10}}

# pve-reference §2.1: user = no whitespace, ':' or '/'; realm and token name
# [A-Za-z][A-Za-z0-9.\-_]+.
_TOKEN_ID_RE = re.compile(r"[^\s:/@!=]+@[A-Za-z][A-Za-z0-9.\-_]+![A-Za-z][A-Za-z0-9.\-_]+")


@dataclass(frozen=True)
class Workdir:
    """The files of one simulator working directory, all absolute paths."""

    root: Path
    token_id: str
    token_secret: str = field(repr=False)

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.root / "ca-key.pem"

    @property
    def cert_file(self) -> Path:
        return self.root / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.root / "server-key.pem"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def catalogue_file(self) -> Path:
        return self.root / "catalogue.yaml"


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    """Write ``data`` atomically; secret files are created owner-only from the start."""
    tmp = path.with_name(f".{path.name}.tmp")
    mode = 0o600 if secret else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def parse_token(line: str) -> tuple[str, str] | None:
    """``USER@REALM!TOKENID=SECRET`` → (token id, secret), or None when malformed.

    Split at the last ``=``, as Proxmox's ``verify_token`` does (pve-reference §2.1).
    """
    token_id, sep, secret = line.strip().rpartition("=")
    if not sep or not secret or not _TOKEN_ID_RE.fullmatch(token_id):
        return None
    return token_id, secret


def _load_ca(workdir: Workdir) -> trustme.CA | None:
    try:
        return trustme.CA.from_pem(workdir.ca_file.read_bytes(), workdir.ca_key_file.read_bytes())
    except (OSError, ValueError):
        return None


def _ensure_ca(workdir: Workdir) -> trustme.CA:
    """The workdir's CA: the saved one if it loads, else a new one written in its place."""
    ca = _load_ca(workdir)
    if ca is None:
        ca = trustme.CA(organization_name="proxyhub pvesim")
        _write(workdir.ca_key_file, ca.private_key_pem.bytes(), secret=True)
        _write(workdir.ca_file, ca.cert_pem.bytes())
    return ca


def _ensure_token(root: Path) -> tuple[str, str]:
    path = root / "token"
    try:
        parsed = parse_token(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        parsed = None
    if parsed is None:
        parsed = (DEFAULT_TOKEN_ID, str(uuid.uuid4()))
        _write(path, f"{parsed[0]}={parsed[1]}\n".encode(), secret=True)
    return parsed


def prepare_workdir(root: Path | str, host: str = "127.0.0.1") -> Workdir:
    """Create ``root`` if needed and fill it: CA (reused), server certificate, token (reused)."""
    path = Path(root).resolve()
    path.mkdir(parents=True, exist_ok=True)
    token_id, secret = _ensure_token(path)
    workdir = Workdir(path, token_id, secret)
    ca = _ensure_ca(workdir)
    identities = list(dict.fromkeys(["127.0.0.1", "localhost", host]))
    leaf = ca.issue_cert(*identities, common_name="pvesim")
    _write(workdir.key_file, leaf.private_key_pem.bytes(), secret=True)
    _write(workdir.cert_file, b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return workdir


def write_catalogue(
    workdir: Workdir, *, url: str, nodes: Sequence[str], template_vmid: int
) -> Path:
    """Write ``catalogue.yaml``: one ``ProxmoxCluster`` document for ``import_catalogue``."""
    document = {
        "apiVersion": "proxyhub/v1",
        "kind": "ProxmoxCluster",
        "name": CLUSTER_NAME,
        "url": url,
        "tokenFile": str(workdir.token_file),
        "caFile": str(workdir.ca_file),
        "nodes": list(nodes),
        "isoStorage": ISO_STORAGE,
        "templates": {IMAGE_KEY: {"vmid": int(template_vmid)}},
        "machineTypes": MACHINE_TYPES,
    }
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None)
    _write(workdir.catalogue_file, text.encode())
    return workdir.catalogue_file


def ready_line(workdir: Workdir, url: str) -> str:
    """The one JSON line printed when the simulator is ready (DESIGN.md §7)."""
    return json.dumps(
        {
            "url": url,
            "tokenFile": str(workdir.token_file),
            "caFile": str(workdir.ca_file),
            "catalogue": str(workdir.catalogue_file),
        }
    )
