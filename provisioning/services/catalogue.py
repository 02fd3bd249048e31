"""The catalogue as YAML documents: their format, loading, and the checks that need no database.

A document is ``apiVersion: proxyhub/v1``, ``kind: ProxmoxCluster``, then seed 000 entry 15's
keys plus ``name``, all at the top level (DESIGN.md §7), and proxyhub's own optional ``quotas``
map (``services.quotas``). Validation is the provider's own
(``ProxmoxConfig.from_mapping``), so a value refused here is refused in the admin too, plus the
limits of the database columns the values land in. Every problem is collected under its path
(``FILE[INDEX].templates.debian-13.vmid``), so an operator fixes a catalogue in one pass.
Writing the clusters is ``catalogue_import.py``; writing them out as documents,
``catalogue_export.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from provisioning.models import Cluster
from provisioning.models import Node as ClusterNode
from provisioning.proxmox.config import ConfigError, FieldError, ProxmoxConfig
from provisioning.strict_yaml import read_text, yaml_load_strict

from .credentials import (
    ca_fingerprint_now,
    credentials_dir,
    credentials_file_missing,
    credentials_file_problem,
)
from .quotas import CATALOGUE_KEY, ClusterQuotas, cluster_quotas_parse

API_VERSION = "proxyhub/v1"
KIND = "ProxmoxCluster"
_ENVELOPE = ("apiVersion", "kind")
# The installation id is not part of a catalogue (it is this installation's, DESIGN.md §2);
# ``from_mapping`` wants one, so validation, import and export use a fixed, valid placeholder.
PLACEHOLDER_INSTALLATION = "catalogue"
# What an export writes for a cluster's vendor-data unless asked for secrets: vendor-data may
# carry them, as user-data does. Importing it back keeps the vendor-data the cluster has.
VENDOR_DATA_PLACEHOLDER = "<sealed: use --include-secrets>"


class CatalogueError(ValueError):
    """A catalogue that was refused; ``problems`` lists every problem with its path."""

    def __init__(self, problems: Sequence[FieldError], *, headline: str) -> None:
        self.problems = list(problems)
        self.headline = headline
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n  ".join([self.headline + ":", *(str(p) for p in self.problems)])


# --- loading --------------------------------------------------------------------------------


class CatalogueDocument(dict[str, Any]):
    """A document as loaded, remembering where it came from for the paths in errors."""

    def __init__(self, data: Mapping[str, Any], *, origin: str, index: int) -> None:
        super().__init__(data)
        self.origin = origin
        self.index = index


def catalogue_load(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Read every document of every file, refusing duplicate keys and non-map documents.

    Empty documents (a trailing ``---``) are skipped. Raises one ``CatalogueError`` listing
    every problem of every file.
    """
    documents: list[dict[str, Any]] = []
    problems: list[FieldError] = []
    for path in paths:
        text, problem = read_text(path)
        if problem is not None or text is None:
            problems.append(problem or FieldError(path, "cannot be read"))
            continue
        loaded, found = yaml_load_strict(text, path)
        problems.extend(found)
        for index, data in enumerate(loaded):
            where = f"{path}[{index}]"
            if data is None:
                continue
            if not isinstance(data, Mapping):
                kind = "a list" if isinstance(data, list) else type(data).__name__
                problems.append(FieldError(where, f"must be a map of settings, got {kind}"))
                continue
            documents.append(CatalogueDocument(data, origin=path, index=index))
        if not found and not any(d is not None for d in loaded):
            problems.append(FieldError(path, "holds no document"))
    if problems:
        raise CatalogueError(problems, headline="the catalogue was refused; nothing was written")
    return documents


# --- validating -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentPlan:
    """A document that passed validation: where it was found, and the cluster it describes."""

    where: str  # "FILE[INDEX]", the prefix of every path of this document
    config: ProxmoxConfig
    quotas: ClusterQuotas = field(default_factory=ClusterQuotas)  # proxyhub's own key
    # The CA in caFile as it is now (blank: none yet): importing is the operating-system user
    # trusting it for the url (issue 11, services.credentials).
    ca_fingerprint: str = ""


@dataclass
class Findings:
    """What ``catalogue_validate`` found: the valid documents, every problem, the warnings."""

    plans: list[DocumentPlan] = field(default_factory=list)
    problems: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _where(document: Mapping[str, Any], position: int) -> str:
    if isinstance(document, CatalogueDocument):
        return f"{document.origin}[{document.index}]"
    return f"documents[{position}]"


def catalogue_validate(documents: Sequence[Mapping[str, Any]]) -> Findings:
    """Every document's problems and warnings; needs no database."""
    found = Findings()
    named: dict[str, str] = {}
    for position, document in enumerate(documents):
        where = _where(document, position)
        if not isinstance(document, Mapping):
            found.problems.append(FieldError(where, "must be a map of settings"))
            continue
        found.problems.extend(_envelope_problems(document, where))
        body = {k: v for k, v in document.items() if k not in (*_ENVELOPE, CATALOGUE_KEY)}
        quotas, quota_problems = cluster_quotas_parse(
            document.get(CATALOGUE_KEY), path=f"{where}.{CATALOGUE_KEY}"
        )
        found.problems.extend(quota_problems)
        try:
            config = ProxmoxConfig.from_mapping(
                body, installation_id=PLACEHOLDER_INSTALLATION, prefix=f"{where}."
            )
        except ConfigError as err:
            found.problems.extend(_with_quotas_allowed(err.errors, where))
            continue
        found.problems.extend(_column_problems(config, where))
        found.problems.extend(_credentials_problems(config, where))
        if config.name in named:
            found.problems.append(
                FieldError(
                    f"{where}.name",
                    f'"{config.name}" is also the name of {named[config.name]}; '
                    "describe each cluster in one document",
                )
            )
            continue
        named[config.name] = where
        found.plans.append(
            DocumentPlan(where, config, quotas, ca_fingerprint_now(ca_file=config.ca_file or ""))
        )
        found.warnings.extend(_file_warnings(config, where))
    return found


def _with_quotas_allowed(problems: Sequence[FieldError], where: str) -> list[FieldError]:
    """The provider lists its own keys when it refuses an unknown top-level key; ``quotas`` is
    read here, beside it, so it is added to that list."""
    unknown = "is not a known key; allowed: "
    return [
        FieldError(p.path, f"{p.message}, {CATALOGUE_KEY}")
        if p.message.startswith(unknown) and "." not in p.path.removeprefix(f"{where}.")
        else p
        for p in problems
    ]


def _envelope_problems(document: Mapping[str, Any], where: str) -> list[FieldError]:
    problems = []
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        value = document.get(key)
        if value is None:
            problems.append(FieldError(f"{where}.{key}", f"is required; use {expected}"))
        elif value != expected:
            shown = f'"{value}"' if isinstance(value, str) and len(value) <= 80 else "another value"
            problems.append(FieldError(f"{where}.{key}", f"must be {expected}, got {shown}"))
    return problems


def _max_length(model: type[models.Model], name: str) -> int:
    found = model._meta.get_field(name).max_length  # type: ignore[union-attr]
    assert isinstance(found, int)
    return found


# The widest value every supported database stores in these columns; the portable limits of
# Django's PositiveSmallIntegerField and PositiveIntegerField (SQLite would store more, and
# PostgreSQL would then refuse the same catalogue).
_SMALLINT_MAX = 32767
_INT_MAX = 2147483647


def _column_problems(config: ProxmoxConfig, where: str) -> list[FieldError]:
    """Values entry 15 allows but a database column cannot hold."""
    problems: list[FieldError] = []
    for key, attr in (
        ("url", "url"),
        ("tokenFile", "token_file"),
        ("caFile", "ca_file"),
        ("isoStorage", "iso_storage"),
        ("storage", "storage"),
        ("bridge", "bridge"),
        ("pool", "pool"),
    ):
        value = getattr(config, attr)
        limit = _max_length(Cluster, attr)
        if isinstance(value, str) and len(value) > limit:
            problems.append(
                FieldError(
                    f"{where}.{key}", f"must be at most {limit} characters, got {len(value)}"
                )
            )
    node_limit = _max_length(ClusterNode, "name")
    for index, node in enumerate(config.nodes):
        if len(node) > node_limit:
            problems.append(
                FieldError(
                    f"{where}.nodes[{index}]",
                    f"must be at most {node_limit} characters, got {len(node)}",
                )
            )
    for key, mt in config.machine_types.items():
        for name, value, limit in (
            ("cores", mt.cores, _SMALLINT_MAX),
            ("memoryMiB", mt.memory_mib, _INT_MAX),
            ("diskGiB", mt.disk_gib, _INT_MAX),
        ):
            if value is not None and value > limit:
                problems.append(
                    FieldError(
                        f"{where}.machineTypes.{key}.{name}",
                        f"must be at most {limit}, got {value}",
                    )
                )
    return problems


def _credentials_problems(config: ProxmoxConfig, where: str) -> list[FieldError]:
    """tokenFile and caFile outside PROXYHUB_CREDENTIALS_DIR, not regular files, or too large
    (issue 11). A path outside is refused before anything looks at it."""
    problems: list[FieldError] = []
    for key, field_name, path in (
        ("tokenFile", "token_file", config.token_file),
        ("caFile", "ca_file", config.ca_file),
    ):
        problem = credentials_file_problem(field=field_name, path=path or "")
        if problem:
            problems.append(FieldError(f"{where}.{key}", problem))
    return problems


def _file_warnings(config: ProxmoxConfig, where: str) -> list[str]:
    """Files that are not there yet import with a warning, not a refusal: the token is read on
    every request and the secret may land after the catalogue (seed 000 entry 14). Only paths
    the rules allow (``_credentials_problems``) get here; the files are never read."""
    warnings: list[str] = []
    for key, field_name, path, what in (
        ("tokenFile", "token_file", config.token_file, "the API token"),
        ("caFile", "ca_file", config.ca_file, "the CA bundle"),
    ):
        if not path:
            continue
        label = f"{where}.{key}"
        if credentials_file_missing(field=field_name, path=path):
            warnings.append(
                f"{label}: {path} does not exist yet; requests to cluster {config.name} fail "
                f"until {what} is written there (inside {credentials_dir()})"
            )
        elif not os.access(path, os.R_OK):
            warnings.append(f"{label}: {path} is not readable by this user")
    if config.insecure_skip_tls_verify:
        warnings.append(
            f"{where}.insecureSkipTLSVerify: TLS verification is off for cluster "
            f"{config.name}; anyone on the path can read the API token"
        )
    return warnings
