"""Template builds: the operator's intent, journalled like a create (issue 14).

``template_build_start`` checks the inputs (every refusal names its field) and writes one
``template_build`` operation per node, each run by the same driver as a create
(``services.driver``: claim, ceiling, breaker, one step, journal with the UPID before the wait,
next message after commit), so a killed build continues and its receipts are never submitted
twice. A build serves no proxy: the operation has none, and its inputs live in its progress
record (``build``) beside the step machine's (``record``).

``--all-nodes``: a template on shared storage serves every node, so one build is made; on local
storage one build per node, at VMIDs ``V, V+1, ...`` in the cluster's node order starting with
the chosen node. The first is the catalogue's template, the others its per-node copies
(``Template.copies``), which a create on that node clones instead (``TemplateRef.vmid_on``).

``template_register`` is called by the driver when a build succeeds, in the transaction that
ends it: the catalogue then says what was built.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from provisioning.models import Cluster, Operation, Template
from provisioning.models.choices import ACTIVE_STATES, OperationKind, OperationState
from provisioning.proxmox.build_inputs import (
    InputProblem,
    Storages,
    check_declaration,
    check_url,
    check_vmids,
    image_filename,
    judge_storages,
    parse_checksum,
)

from .operations import operation_for_template_build
from .providers import provider_for

User = AbstractBaseUser | AnonymousUser | None


@dataclass(frozen=True)
class BuildSpec:
    """What the operator asked for (the command's options, the admin form's fields)."""

    key: str
    node: str
    image_url: str
    checksum: str
    vmid: int
    storage: str
    template_version: str
    guest_user: str
    image_storage: str = ""
    bridge: str = ""
    disk_device: str = "scsi0"
    disk_gib: int = 8
    all_nodes: bool = False


def template_build_start(
    *, cluster: Cluster, spec: BuildSpec, user: User, via: str, preflight: bool = True
) -> list[Operation]:
    """Check ``spec`` and start its builds; raises ``InputProblem`` with nothing written.

    ``preflight`` reads the node's storages and the cluster's VMIDs first (the command does;
    the admin action makes no Proxmox call in a web request, so its builds meet the same
    refusals in their first step, before anything is downloaded)."""
    check_url(spec.image_url)
    parse_checksum(spec.checksum)
    check_declaration(
        key=spec.key,
        template_version=spec.template_version,
        guest_user=spec.guest_user,
        disk_device=spec.disk_device,
        disk_gib=spec.disk_gib,
    )
    nodes = list(cluster.nodes.order_by("position", "name").values_list("name", flat=True))
    if spec.node not in nodes:
        raise InputProblem("node", f"{spec.node!r} is not a node of {cluster.name}: {nodes}")
    shared = False
    if preflight:
        storages = _judge(cluster, spec, spec.node)
        shared = storages.disk_shared
    targets = [spec.node]
    if spec.all_nodes and not shared:
        targets += [n for n in nodes if n != spec.node]
    vmids = [spec.vmid + i for i in range(len(targets))]
    check_vmids(vmids, proxy_range=(cluster.vmid_min, cluster.vmid_max))
    if preflight:
        for node in targets[1:]:
            _judge(cluster, spec, node)
        _assert_free(cluster, vmids)
    group = dict(zip(targets, vmids, strict=True))
    with transaction.atomic():
        busy = Operation.objects.filter(
            cluster=cluster,
            kind=OperationKind.TEMPLATE_BUILD,
            state__in=ACTIVE_STATES,
            progress__build__key=spec.key,
        ).exists()
        if busy:
            raise InputProblem("key", f"a build of {spec.key!r} is already running on {cluster}")
        return [
            operation_for_template_build(
                cluster=cluster,
                name=f"template {spec.key} on {node}",
                build=_build_record(spec, node, vmid, group, primary=node == spec.node),
                user=user,
                via=via,
            )
            for node, vmid in group.items()
        ]


def _build_record(
    spec: BuildSpec, node: str, vmid: int, group: dict[str, int], *, primary: bool
) -> dict[str, Any]:
    return {
        "uid": str(uuid.uuid4()),
        "key": spec.key,
        "node": node,
        "vmid": vmid,
        "url": spec.image_url,
        "checksum": spec.checksum,
        "storage": spec.storage,
        "image_storage": spec.image_storage,
        "bridge": spec.bridge,
        "disk_device": spec.disk_device,
        "disk_gib": spec.disk_gib,
        "template_version": spec.template_version,
        "guest_user": spec.guest_user,
        "primary": primary,
        "group": group,
    }


def _judge(cluster: Cluster, spec: BuildSpec, node: str) -> Storages:
    provider = provider_for(cluster)
    return judge_storages(
        provider.api.node_storages(node),
        node=node,
        storage=spec.storage,
        image_storage=spec.image_storage,
        filename=image_filename(spec.image_url),
    )


def _assert_free(cluster: Cluster, vmids: list[int]) -> None:
    listing = provider_for(cluster).api.cluster_resources()
    used = {int(e["vmid"]): str(e.get("node") or "") for e in listing if "vmid" in e}
    for vmid in vmids:
        if vmid in used:
            raise InputProblem("vmid", f"VMID {vmid} is already taken (on {used[vmid]})")


def template_register(*, op: Operation, details: dict[str, Any]) -> None:
    """Record a finished build in its cluster's catalogue (inside the driver's transaction).

    The group's first node owns the catalogue entry (VMID and seed 003's declaration); every
    other node's build is a copy. The entry keeps only copies of the same group, so a rebuild
    never leaves a copy of an older template behind."""
    build = dict(op.progress.get("build") or {})
    if op.cluster_id is None or not build or details.get("shared"):
        return  # a copy found unneeded (shared storage) registers nothing
    group = {str(n): int(v) for n, v in (build.get("group") or {}).items()}
    primary = next(iter(group))
    row = Template.objects.select_for_update().filter(cluster_id=op.cluster_id, key=build["key"])
    template = row.first()
    done = _built_nodes(op, build["key"], group)
    copies = {n: group[n] for n in done if n != primary}
    fields = {
        "vmid": group[primary],
        "template_version": build["template_version"],
        "disk_device": build["disk_device"],
        "guest_user": build["guest_user"],
        "copies": copies,
    }
    if build.get("primary"):
        fields["source_disk_gib"] = details.get("sourceDiskGiB")
    if template is None:
        Template.objects.create(cluster_id=op.cluster_id, key=build["key"], **fields)
    else:
        for name, value in fields.items():
            setattr(template, name, value)
        template.save(update_fields=list(fields))
    # A catalogue change moves the cluster's updated_at, as the import's does, so the next
    # step's provider (cached by it, services.providers) sees the new template.
    Cluster.objects.filter(pk=op.cluster_id).update(updated_at=timezone.now())


def _built_nodes(op: Operation, key: str, group: dict[str, int]) -> list[str]:
    """The group's nodes whose build succeeded, this one included (it ends in this commit)."""
    done = {str(op.progress["build"]["node"])}
    for other in Operation.objects.filter(
        cluster=op.cluster_id,
        kind=OperationKind.TEMPLATE_BUILD,
        state=OperationState.SUCCEEDED,
        progress__build__key=key,
    ).exclude(pk=op.pk):
        build = other.progress.get("build") or {}
        shared = bool((other.progress.get("record") or {}).get("shared"))
        if build.get("group") == op.progress["build"].get("group") and not shared:
            done.add(str(build.get("node")))
    return [n for n in group if n in done]


def build_result(op: Operation) -> dict[str, Any]:
    """What ``templates build --json`` prints for one build."""
    build = dict(op.progress.get("build") or {})
    record = dict(op.progress.get("record") or {})
    storages = record.get("storages") or {}
    volume = Storages(**storages).image_volid if storages else ""  # known once the first step ran
    return {
        "cluster": op.cluster.name if op.cluster else "",
        "node": build.get("node"),
        "vmid": build.get("vmid"),
        "templateKey": build.get("key"),
        "storage": build.get("storage"),
        "imageVolume": volume,
        "checksum": build.get("checksum"),
        "templateVersion": build.get("template_version"),
        "diskDevice": build.get("disk_device"),
        "sourceDiskGiB": record.get("disk_gib"),
        "guestUser": build.get("guest_user"),
        "state": op.state,
        "operation": str(op.pk),
        "error": op.last_error,
    }
