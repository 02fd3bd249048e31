"""Importing the catalogue: every document's cluster written, or none (DESIGN.md §7).

An import is all or nothing: every document is validated first (``catalogue_validate``), every
problem is collected under its path, and only when none is found are the clusters written, in
one transaction. Importing a cluster that exists updates it to match the document, children
included, except that a template, machine type or node a live proxy still names is never
removed from under it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import IntegrityError, transaction

from provisioning.models import Cluster, MachineType, Proxy, Template
from provisioning.models import Node as ClusterNode
from provisioning.models.choices import DesiredState
from provisioning.proxmox.config import FieldError, TemplateRef
from provisioning.proxmox.config import MachineType as MachineTypeSpec

from .catalogue import (
    PLACEHOLDER_INSTALLATION,
    VENDOR_DATA_PLACEHOLDER,
    CatalogueError,
    DocumentPlan,
    catalogue_validate,
)

# A refusal names the proxies in the way; a fleet can be thousands, so the list is cut short.
_NAMED_PROXIES = 20


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


def catalogue_import(
    documents: Sequence[Mapping[str, Any]], *, dry_run: bool = False
) -> ImportReport:
    """Create or update one cluster per document; all documents or none (DESIGN.md §7).

    Raises ``CatalogueError`` listing every problem of every document, and then nothing is
    written. ``dry_run`` validates everything, database checks included, and writes nothing.
    """
    found = catalogue_validate(documents)
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


def _apply(plans: list[DocumentPlan], *, dry_run: bool) -> list[ClusterChange]:
    """Inside the import's transaction: the checks that need the database, then the writes."""
    rows = Cluster.objects.filter(name__in=[plan.config.name for plan in plans])
    if not dry_run:
        rows = rows.select_for_update()
    existing = {c.name: c for c in rows}
    problems: list[FieldError] = []
    plans = [_keep_sealed_vendor_data(p, existing.get(p.config.name), problems) for p in plans]
    for plan in plans:
        cluster = existing.get(plan.config.name)
        if cluster is not None:
            problems.extend(_removal_problems(plan, cluster))
    if problems:
        raise CatalogueError(problems, headline="the catalogue was refused; nothing was written")
    changes = [_change_of(plan, existing.get(plan.config.name)) for plan in plans]
    if not dry_run:
        for plan, change in zip(plans, changes, strict=True):
            if change.action != "unchanged":
                _write(plan, existing.get(plan.config.name))
    return changes


def _keep_sealed_vendor_data(
    plan: DocumentPlan, cluster: Cluster | None, problems: list[FieldError]
) -> DocumentPlan:
    """An export without ``--include-secrets`` carries a placeholder for vendor-data: importing
    it keeps the cluster's own, and for a cluster that does not exist yet there is nothing to
    keep, so it is refused rather than written as vendor-data."""
    if plan.config.vendor_data != VENDOR_DATA_PLACEHOLDER:
        return plan
    if cluster is None:
        problems.append(
            FieldError(
                f"{plan.where}.vendorData",
                "is the placeholder of an export without --include-secrets, and cluster "
                f"{plan.config.name} does not exist yet to keep its vendor-data; give the "
                "vendor-data itself, or leave the key out",
            )
        )
        return plan
    kept = replace(plan.config, vendor_data=cluster.vendor_data or None)
    return replace(plan, config=kept)


def _removal_problems(plan: DocumentPlan, cluster: Cluster) -> list[FieldError]:
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
    ("pool", "pool", "pool"),
    ("vmidRange.min", "vmid_min", "vmid_min"),
    ("vmidRange.max", "vmid_max", "vmid_max"),
    ("requestTimeoutSeconds", "request_timeout_seconds", "request_timeout_seconds"),
    ("vendorData", "vendor_data", "vendor_data"),
    ("installGuestAgent", "install_guest_agent", "install_guest_agent"),
    ("driftPolicy", "drift_policy", "drift_policy"),
)
_BLANK_WHEN_UNSET = frozenset({"ca_file", "storage", "bridge", "pool", "vendor_data"})


def _trusted_fingerprint(plan: DocumentPlan, cluster: Cluster | None) -> str:
    """The CA trust the row gets: the CA in caFile now; when there is none yet (the file has
    not landed), the trust already recorded, but only while url and caFile stay the same."""
    if plan.ca_fingerprint or cluster is None:
        return plan.ca_fingerprint
    if cluster.url == plan.config.url and cluster.ca_file == (plan.config.ca_file or ""):
        return cluster.ca_fingerprint
    return ""


def _change(plan: DocumentPlan, cluster: Cluster | None) -> ClusterChange:
    """What writing ``plan`` changes: key names only, never values (vendor-data may hold
    secrets, and a path is easier to read in the document than in a summary)."""
    config = plan.config
    if cluster is None:
        sizes = (
            _count(len(config.nodes), "node"),
            _count(len(config.templates), "template"),
            _count(len(config.machine_types), "machine type"),
        )
        return ClusterChange(config.name, "created", sizes)
    current = cluster.proxmox_config(PLACEHOLDER_INSTALLATION)
    changes = [key for key, attr, _ in _SCALARS if getattr(current, attr) != getattr(config, attr)]
    if _trusted_fingerprint(plan, cluster) != cluster.ca_fingerprint:
        changes.append("CA trust")
    if current.nodes != config.nodes:
        changes.append(_delta("nodes", current.nodes, config.nodes, reordered=True))
    changes.append(_delta("templates", current.templates, config.templates))
    changes.append(_delta("machineTypes", current.machine_types, config.machine_types))
    changes = [c for c in changes if c]
    return ClusterChange(config.name, "updated" if changes else "unchanged", tuple(changes))


def _change_of(plan: DocumentPlan, cluster: Cluster | None) -> ClusterChange:
    """``_change`` plus the ``quotas.*`` keys the document changes on an existing cluster."""
    change = _change(plan, cluster)
    keys = plan.quotas.changed_keys(cluster) if cluster is not None else []
    if not keys:
        return change
    return ClusterChange(change.name, "updated", (*change.changes, *keys))


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


def _write(plan: DocumentPlan, cluster: Cluster | None) -> Cluster:
    """Write one cluster and make its children match; the row is saved last so its
    ``updated_at`` moves after every child (the provider cache keys on it)."""
    config = plan.config
    trusted = _trusted_fingerprint(plan, cluster)
    if cluster is None:
        cluster = Cluster(name=config.name)
    for _, attr, field_name in _SCALARS:
        value = getattr(config, attr)
        if value is None and field_name in _BLANK_WHEN_UNSET:
            value = ""
        setattr(cluster, field_name, value)
    plan.quotas.apply(cluster)
    cluster.trust_ca(trusted)
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
        # Seed 003's declaration and the per-node copies (issue 14), as the document says.
        fields = {
            "vmid": ref.vmid,
            "template_version": ref.template_version or "",
            "disk_device": ref.disk_device or "",
            "source_disk_gib": ref.source_disk_gib,
            "guest_user": ref.guest_user or "",
            "copies": dict(ref.copies),
            "wait_for_cloud_init": ref.wait_for_cloud_init,
        }
        row = rows.get(key)
        if row is None:
            new.append(Template(cluster=cluster, key=key, **fields))
            continue
        changed = [name for name, value in fields.items() if getattr(row, name) != value]
        if changed:
            for name in changed:
                setattr(row, name, fields[name])
            row.save(update_fields=changed)
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
