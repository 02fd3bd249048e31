"""The catalogue as YAML: load, import and export ``ProxmoxCluster`` documents (DESIGN.md §7).

A document is ``apiVersion: proxyhub/v1``, ``kind: ProxmoxCluster``, then seed 000 entry 15's
keys plus ``name``, all at the top level. Validation is the provider's own
(``ProxmoxConfig.from_mapping``), so a value refused here is refused in the admin too, plus the
limits of the database columns the values land in.

An import is all or nothing: every document is validated first, every problem is collected
under its path (``FILE[INDEX].templates.debian-13.vmid``), and only when none is found are the
clusters written, in one transaction. Importing a cluster that exists updates it to match the
document, children included, except that a template, machine type or node a live proxy still
names is never removed from under it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.db import IntegrityError, models, transaction
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from provisioning.models import Cluster, MachineType, Proxy, Template
from provisioning.models import Node as ClusterNode
from provisioning.models.choices import DesiredState
from provisioning.proxmox.config import (
    ConfigError,
    FieldError,
    ProxmoxConfig,
    TemplateRef,
)
from provisioning.proxmox.config import (
    MachineType as MachineTypeSpec,
)

API_VERSION = "proxyhub/v1"
KIND = "ProxmoxCluster"
_ENVELOPE = ("apiVersion", "kind")
# The installation id is not part of a catalogue (it is this installation's, DESIGN.md §2);
# ``from_mapping`` wants one, so validation and export use a fixed, valid placeholder.
_PLACEHOLDER_INSTALLATION = "catalogue"
# A refusal names the proxies in the way; a fleet can be thousands, so the list is cut short.
_NAMED_PROXIES = 20
_MERGE_TAG = "tag:yaml.org,2002:merge"


class CatalogueError(ValueError):
    """A catalogue that was refused; ``problems`` lists every problem with its path."""

    def __init__(self, problems: Sequence[FieldError], *, headline: str) -> None:
        self.problems = list(problems)
        self.headline = headline
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n  ".join([self.headline + ":", *(str(p) for p in self.problems)])


# --- the strict YAML loader -----------------------------------------------------------------


class DuplicateKeyError(ConstructorError):
    """A document gives one key twice. PyYAML would silently keep the last value, so a typo'd
    copy of a block would quietly win; the catalogue refuses it instead."""

    def __init__(self, duplicates: list[tuple[str, str]]) -> None:
        self.duplicates = duplicates
        super().__init__(problem="; ".join(f"{path}: {msg}" for path, msg in duplicates))


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses duplicate keys, naming each by its key path.

    ``construct_mapping`` only sees one mapping node, not where it sits, so
    ``construct_document`` first records every node's path; duplicates found while the
    document is built are raised together once it is complete, which leaves the loader ready
    for the next document of the stream.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._paths: dict[int, str] = {}
        self._duplicates: list[tuple[int, str, str]] = []

    def construct_document(self, node: Node) -> Any:
        self._paths = {}
        self._duplicates = []
        _record_paths(node, "", self._paths)
        data = super().construct_document(node)
        if self._duplicates:
            found, self._duplicates = sorted(self._duplicates), []
            raise DuplicateKeyError([(path, message) for _, path, message in found])
        return data

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # ``<<`` merges are overridden by explicit keys on purpose
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class refuses unhashable keys with its own error
            line = key_node.start_mark.line + 1
            if key in seen:
                path = _join(self._paths.get(id(node), ""), str(key))
                self._duplicates.append(
                    (
                        line,
                        path,
                        f"is given twice (lines {seen[key]} and {line}); give each key once",
                    )
                )
            else:
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _record_paths(node: Node, path: str, paths: dict[int, str]) -> None:
    if id(node) in paths:  # an alias: keep the path where the anchor was defined
        return
    paths[id(node)] = path
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, ScalarNode) else "?"
            _record_paths(value_node, _join(path, str(key)), paths)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _record_paths(item, f"{path}[{index}]", paths)


def yaml_load_strict(
    text: str, source: str, *, single: bool = False
) -> tuple[list[object], list[FieldError]]:
    """Every document of ``text`` (``None`` for one refused), and the problems found.

    Problems carry paths ``SOURCE[INDEX].key.path``, or ``SOURCE.key.path`` with ``single``
    (a file that must hold one document). A syntax error ends the stream and is reported with
    its line, never with the text around it (a vendor-data block may hold secrets).
    """
    loader = _StrictLoader(text)
    documents: list[object] = []
    problems: list[FieldError] = []
    try:
        while loader.check_data():
            where = source if single else f"{source}[{len(documents)}]"
            try:
                documents.append(loader.get_data())
            except DuplicateKeyError as err:
                documents.append(None)
                problems.extend(FieldError(_under(where, p), msg) for p, msg in err.duplicates)
    except yaml.MarkedYAMLError as err:
        problems.append(FieldError(source, _syntax_problem(err)))
    except yaml.YAMLError:
        problems.append(FieldError(source, "is not valid YAML"))
    finally:
        loader.dispose()
    if single and len(documents) > 1:
        problems.append(FieldError(source, "must hold one YAML document, not several"))
    return documents, problems


def _under(prefix: str, path: str) -> str:
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def _syntax_problem(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = " ".join(part for part in (err.context, err.problem) if part)
    return f"is not valid YAML: {where}{what or 'cannot be parsed'}"


def read_text(path: str) -> tuple[str | None, FieldError | None]:
    """A file's text, or the problem reading it (never its content)."""
    try:
        return Path(path).read_text(encoding="utf-8"), None
    except UnicodeDecodeError:
        return None, FieldError(path, "is not UTF-8 text")
    except OSError as err:
        return None, FieldError(path, f"cannot be read: {err.strerror or type(err).__name__}")


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


# --- importing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterChange:
    """What an import did (or, dry-run, would do) to one cluster."""

    name: str
    action: str  # "created", "updated" or "unchanged"
    changes: tuple[str, ...] = ()

    def summary(self, *, dry_run: bool = False) -> str:
        verb = {
            "created": "would create" if dry_run else "created",
            "updated": "would update" if dry_run else "updated",
            "unchanged": "unchanged",
        }[self.action]
        detail = f": {', '.join(self.changes)}" if self.changes else ""
        return f"{verb} cluster {self.name}{detail}"


@dataclass(frozen=True)
class ImportReport:
    """The outcome of ``catalogue_import``: one entry per document, and the warnings."""

    clusters: tuple[ClusterChange, ...]
    warnings: tuple[str, ...] = ()
    dry_run: bool = False

    def names(self, action: str) -> list[str]:
        return [c.name for c in self.clusters if c.action == action]

    @property
    def created(self) -> list[str]:
        return self.names("created")

    @property
    def updated(self) -> list[str]:
        return self.names("updated")

    @property
    def unchanged(self) -> list[str]:
        return self.names("unchanged")


@dataclass(frozen=True)
class _Plan:
    where: str  # "FILE[INDEX]", the prefix of every path of this document
    config: ProxmoxConfig


@dataclass
class _Findings:
    plans: list[_Plan] = field(default_factory=list)
    problems: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def catalogue_import(
    documents: Sequence[Mapping[str, Any]], *, dry_run: bool = False
) -> ImportReport:
    """Create or update one cluster per document; all documents or none (DESIGN.md §7).

    Raises ``CatalogueError`` listing every problem of every document, and then nothing is
    written. ``dry_run`` validates everything, database checks included, and writes nothing.
    """
    found = _validate(documents)
    if found.problems:
        raise CatalogueError(
            found.problems, headline="the catalogue was refused; nothing was written"
        )
    try:
        with transaction.atomic():
            changes = _apply(found.plans, dry_run=dry_run)
    except IntegrityError as err:
        # Another import created one of these clusters between our read and our write.
        raise CatalogueError(
            [FieldError("(catalogue)", "another import changed these clusters meanwhile")],
            headline="the catalogue was not written; run the import again",
        ) from err
    return ImportReport(tuple(changes), tuple(found.warnings), dry_run)


def _apply(plans: list[_Plan], *, dry_run: bool) -> list[ClusterChange]:
    """Inside the import's transaction: the checks that need the database, then the writes."""
    rows = Cluster.objects.filter(name__in=[plan.config.name for plan in plans])
    if not dry_run:
        rows = rows.select_for_update()
    existing = {c.name: c for c in rows}
    problems: list[FieldError] = []
    for plan in plans:
        cluster = existing.get(plan.config.name)
        if cluster is not None:
            problems.extend(_removal_problems(plan, cluster))
    if problems:
        raise CatalogueError(problems, headline="the catalogue was refused; nothing was written")
    changes = [_change(plan.config, existing.get(plan.config.name)) for plan in plans]
    if not dry_run:
        for plan, change in zip(plans, changes, strict=True):
            if change.action != "unchanged":
                _write(plan.config, existing.get(plan.config.name))
    return changes


def _where(document: Mapping[str, Any], position: int) -> str:
    if isinstance(document, CatalogueDocument):
        return f"{document.origin}[{document.index}]"
    return f"documents[{position}]"


def _validate(documents: Sequence[Mapping[str, Any]]) -> _Findings:
    """Every document's problems and warnings; needs no database."""
    found = _Findings()
    named: dict[str, str] = {}
    for position, document in enumerate(documents):
        where = _where(document, position)
        if not isinstance(document, Mapping):
            found.problems.append(FieldError(where, "must be a map of settings"))
            continue
        found.problems.extend(_envelope_problems(document, where))
        body = {k: v for k, v in document.items() if k not in _ENVELOPE}
        try:
            config = ProxmoxConfig.from_mapping(
                body, installation_id=_PLACEHOLDER_INSTALLATION, prefix=f"{where}."
            )
        except ConfigError as err:
            found.problems.extend(err.errors)
            continue
        found.problems.extend(_column_problems(config, where))
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
        found.plans.append(_Plan(where, config))
        found.warnings.extend(_file_warnings(config, where))
    return found


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


def _file_warnings(config: ProxmoxConfig, where: str) -> list[str]:
    """Files that are not there yet import with a warning, not a refusal: the token is read on
    every request and the secret may land after the catalogue (seed 000 entry 14). Only the
    paths are looked at; the files are never read."""
    warnings: list[str] = []
    for key, path, what in (
        ("tokenFile", config.token_file, "the API token"),
        ("caFile", config.ca_file, "the CA bundle"),
    ):
        if not path:
            continue
        label = f"{where}.{key}"
        if not os.path.isabs(path):
            warnings.append(
                f"{label}: {path} is a relative path; each worker resolves it against its own "
                "working directory, so prefer an absolute path"
            )
        if not os.path.exists(path):
            warnings.append(
                f"{label}: {path} does not exist yet; requests to cluster {config.name} fail "
                f"until {what} is written there"
            )
        elif not os.access(path, os.R_OK):
            warnings.append(f"{label}: {path} is not readable by this user")
    if config.insecure_skip_tls_verify:
        warnings.append(
            f"{where}.insecureSkipTLSVerify: TLS verification is off for cluster "
            f"{config.name}; anyone on the path can read the API token"
        )
    return warnings


def _removal_problems(plan: _Plan, cluster: Cluster) -> list[FieldError]:
    """Catalogue entries the document drops but a live proxy still names.

    A proxy being deleted no longer needs its placement (delete finds the VM by its id), so
    only proxies that should exist count.
    """
    config = plan.config
    live = Proxy.objects.filter(cluster=cluster, desired_state=DesiredState.PRESENT)
    checks = (
        (
            "templates",
            "image",
            Template.objects.filter(cluster=cluster).values_list("key", flat=True),
            config.templates,
        ),
        (
            "machineTypes",
            "machine_type",
            MachineType.objects.filter(cluster=cluster).values_list("key", flat=True),
            config.machine_types,
        ),
        (
            "nodes",
            "zone",
            ClusterNode.objects.filter(cluster=cluster).values_list("name", flat=True),
            config.nodes,
        ),
    )
    problems: list[FieldError] = []
    for key, proxy_field, current, wanted in checks:
        removed = sorted(set(current) - set(wanted))
        if not removed:
            continue
        users: dict[str, list[str]] = {}
        for name, value in live.filter(**{f"{proxy_field}__in": removed}).values_list(
            "name", proxy_field
        ):
            users.setdefault(value, []).append(name)
        for value in removed:
            if value in users:
                problems.append(
                    FieldError(
                        f"{plan.where}.{key}",
                        f'drops "{value}", which proxies still use: {_names(users[value])}; '
                        "delete or move those proxies first",
                    )
                )
    return problems


def _names(names: list[str]) -> str:
    names = sorted(names)
    shown = ", ".join(names[:_NAMED_PROXIES])
    rest = len(names) - _NAMED_PROXIES
    return f"{shown} and {rest} more" if rest > 0 else shown


# Seed key, ProxmoxConfig attribute, Cluster field. Optional text is None in the config and
# blank in the row.
_SCALARS = (
    ("url", "url", "url"),
    ("tokenFile", "token_file", "token_file"),
    ("caFile", "ca_file", "ca_file"),
    ("insecureSkipTLSVerify", "insecure_skip_tls_verify", "insecure_skip_tls_verify"),
    ("isoStorage", "iso_storage", "iso_storage"),
    ("storage", "storage", "storage"),
    ("bridge", "bridge", "bridge"),
    ("vlanTag", "vlan_tag", "vlan_tag"),
    ("vmidRange.min", "vmid_min", "vmid_min"),
    ("vmidRange.max", "vmid_max", "vmid_max"),
    ("requestTimeoutSeconds", "request_timeout_seconds", "request_timeout_seconds"),
    ("vendorData", "vendor_data", "vendor_data"),
    ("installGuestAgent", "install_guest_agent", "install_guest_agent"),
)
_BLANK_WHEN_UNSET = frozenset({"ca_file", "storage", "bridge", "vendor_data"})


def _change(config: ProxmoxConfig, cluster: Cluster | None) -> ClusterChange:
    """What writing ``config`` changes: key names only, never values (vendor-data may hold
    secrets, and a path is easier to read in the document than in a summary)."""
    if cluster is None:
        sizes = (
            _count(len(config.nodes), "node"),
            _count(len(config.templates), "template"),
            _count(len(config.machine_types), "machine type"),
        )
        return ClusterChange(config.name, "created", sizes)
    current = cluster.proxmox_config(_PLACEHOLDER_INSTALLATION)
    changes = [key for key, attr, _ in _SCALARS if getattr(current, attr) != getattr(config, attr)]
    if current.nodes != config.nodes:
        changes.append(_delta("nodes", current.nodes, config.nodes, reordered=True))
    changes.append(_delta("templates", current.templates, config.templates))
    changes.append(_delta("machineTypes", current.machine_types, config.machine_types))
    changes = [c for c in changes if c]
    return ClusterChange(config.name, "updated" if changes else "unchanged", tuple(changes))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _delta(
    key: str,
    before: Mapping[str, object] | Sequence[str],
    after: Mapping[str, object] | Sequence[str],
    *,
    reordered: bool = False,
) -> str:
    parts = [f"+{k}" for k in after if k not in before]
    parts += [f"-{k}" for k in before if k not in after]
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        parts += [f"~{k}" for k in after if k in before and before[k] != after[k]]
    if not parts and reordered:
        parts.append("reordered")
    return f"{key} {' '.join(parts)}" if parts else ""


def _write(config: ProxmoxConfig, cluster: Cluster | None) -> Cluster:
    """Write one cluster and make its children match; the row is saved last so its
    ``updated_at`` moves after every child (the provider cache keys on it)."""
    if cluster is None:
        cluster = Cluster(name=config.name)
    for _, attr, field_name in _SCALARS:
        value = getattr(config, attr)
        if value is None and field_name in _BLANK_WHEN_UNSET:
            value = ""
        setattr(cluster, field_name, value)
    if cluster.pk is None:
        cluster.save()
    _sync_nodes(cluster, config.nodes)
    _sync_templates(cluster, config.templates)
    _sync_machine_types(cluster, config.machine_types)
    cluster.save()
    return cluster


def _sync_nodes(cluster: Cluster, nodes: Sequence[str]) -> None:
    rows = {n.name: n for n in ClusterNode.objects.filter(cluster=cluster)}
    ClusterNode.objects.filter(cluster=cluster).exclude(name__in=list(nodes)).delete()
    new = []
    for position, name in enumerate(nodes):
        row = rows.get(name)
        if row is None:
            new.append(ClusterNode(cluster=cluster, name=name, position=position))
        elif row.position != position:
            row.position = position
            row.save(update_fields=["position"])
    ClusterNode.objects.bulk_create(new)


def _sync_templates(cluster: Cluster, templates: Mapping[str, TemplateRef]) -> None:
    rows = {t.key: t for t in Template.objects.filter(cluster=cluster)}
    Template.objects.filter(cluster=cluster).exclude(key__in=list(templates)).delete()
    new = []
    for key, ref in templates.items():
        row = rows.get(key)
        if row is None:
            new.append(Template(cluster=cluster, key=key, vmid=ref.vmid))
        elif row.vmid != ref.vmid:
            row.vmid = ref.vmid
            row.save(update_fields=["vmid"])
    Template.objects.bulk_create(new)


def _sync_machine_types(cluster: Cluster, machine_types: Mapping[str, MachineTypeSpec]) -> None:
    rows = {m.key: m for m in MachineType.objects.filter(cluster=cluster)}
    MachineType.objects.filter(cluster=cluster).exclude(key__in=list(machine_types)).delete()
    new = []
    for key, spec in machine_types.items():
        row = rows.get(key)
        if row is None:
            new.append(
                MachineType(
                    cluster=cluster,
                    key=key,
                    cores=spec.cores,
                    memory_mib=spec.memory_mib,
                    disk_gib=spec.disk_gib,
                )
            )
        elif (row.cores, row.memory_mib, row.disk_gib) != (
            spec.cores,
            spec.memory_mib,
            spec.disk_gib,
        ):
            row.cores, row.memory_mib, row.disk_gib = spec.cores, spec.memory_mib, spec.disk_gib
            row.save(update_fields=["cores", "memory_mib", "disk_gib"])
    MachineType.objects.bulk_create(new)


# --- exporting ------------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    """Multi-line text (vendor-data) as a literal block, so an export reads like the input."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def catalogue_export(clusters: Iterable[str] | None = None) -> str:
    """The catalogue as YAML documents, one per cluster in name order; importing the output
    changes nothing. ``clusters`` names the clusters to export (default: all)."""
    rows = Cluster.objects.order_by("name")
    if clusters is not None:
        wanted = list(dict.fromkeys(clusters))
        rows = rows.filter(name__in=wanted)
        missing = sorted(set(wanted) - {c.name for c in rows})
        if missing:
            raise CatalogueError(
                [FieldError("cluster", f"no cluster is named {name}") for name in missing],
                headline="nothing was exported",
            )
    documents = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            **c.proxmox_config(_PLACEHOLDER_INSTALLATION).to_mapping(),
        }
        for c in rows
    ]
    if not documents:
        return ""
    return yaml.dump_all(
        documents,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=True,
    )
