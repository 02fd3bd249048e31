"""Commit only the plan that was shown (issue 14, seed 003).

Seed 003: a confirmation carries the ``planHash`` of the preview it approves, and a "changed
plan" refuses the create (409) and writes nothing. ``plan_set_for`` builds the plans of a batch
of proxies not saved yet, reading the catalogue once per cluster and placement's inputs once
per cluster (``node_choice``), and hashes them as one set (``plan_set``). ``commit`` builds the
set again inside the transaction that writes the proxies, after locking their clusters' rows
(which every declaration of proxies on them locks first), compares, and refuses with what
changed, so a change between the check and the write cannot slip in.

The shown document travels through a browser or a file; ``sign_shown``/``load_shown`` wrap it in
a ``django.core.signing`` signature bound to the user, so a forged form cannot claim it was
shown a different plan. It holds digests of the cloud-init and vendor-data, never content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.db import transaction

from provisioning.models import Operation
from provisioning.models.choices import RequestedVia
from provisioning.proxmox.config import ProxmoxConfig
from provisioning.proxmox.node_choice import PlacementInputs
from provisioning.proxmox.plan import Plan
from provisioning.proxmox.plan_set import plan_set_document, plan_set_hash, what_changed

from .installation import installation_id
from .operations import ProxySpec, User, proxies_create
from .placement import place, placement_inputs
from .plans import plan_for_spec
from .quotas import cluster_lock

SHOWN_SALT = "proxyhub.plan-shown"
MIB = 1024**2


@dataclass(frozen=True)
class PlanSet:
    """The plans of a batch, each with its proxy's name, and the set's document and hash."""

    plans: list[tuple[str, Plan]]
    document: dict[str, Any]
    plan_hash: str

    def nodes(self) -> dict[str, int]:
        """How many of the batch go to each node, in first-seen order."""
        out: dict[str, int] = {}
        for _, plan in self.plans:
            out[plan.node] = out.get(plan.node, 0) + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        """``proxies create --dry-run --json``: the hash, each proxy's resolved plan, and the
        set document that ``--plan-file`` hands back to show what changed."""
        return {
            "planHash": self.plan_hash,
            "proxies": [{"name": name, **plan.as_dict()} for name, plan in self.plans],
            "planSet": self.document,
        }


class PlanChanged(ValidationError):
    """The plan the commit would make is not the one that was shown; ``changes`` says how."""

    def __init__(self, changes: Sequence[str]) -> None:
        self.changes = list(changes)
        super().__init__(
            "the plan changed since it was shown: "
            + "; ".join(self.changes)
            + "; review the new plan and confirm again",
            code="plan_changed",
        )


def plan_set_for(specs: Sequence[ProxySpec]) -> PlanSet:
    """The plans of ``specs`` in order, without a Proxmox call and without writing.

    Each proxy with a blank zone on a multi-node cluster is placed on the inputs read once for
    its cluster, every proxy of the batch counted in flight on its node as it is placed, so
    the batch spreads as its creates will. Unknown catalogue keys raise the create's
    ``PermanentError``.
    """
    configs: dict[int, ProxmoxConfig] = {}
    read: dict[int, PlacementInputs] = {}
    for spec in specs:
        if spec.cluster.pk not in configs:
            configs[spec.cluster.pk] = spec.cluster.proxmox_config(installation_id())
        if _placed(spec, configs[spec.cluster.pk]) and spec.cluster.pk not in read:
            read[spec.cluster.pk] = placement_inputs(spec.cluster, configs[spec.cluster.pk])
    current = dict(read)
    plans: list[tuple[str, Plan]] = []
    for spec in specs:
        config = configs[spec.cluster.pk]
        node = None
        if _placed(spec, config):
            node = place(spec.cluster, current[spec.cluster.pk])
        plan = plan_for_spec(spec, config=config, placement_node=node or "")
        if spec.cluster.pk in current:
            machine = config.machine_types.get(spec.machine_type)
            memory = machine.memory_mib * MIB if machine is not None else 0
            current[spec.cluster.pk] = current[spec.cluster.pk].with_placed(plan.node, memory)
        plans.append((spec.name, plan))
    placements = {inputs.cluster: inputs for inputs in read.values()}
    document = plan_set_document(plans, placements)
    return PlanSet(plans=plans, document=document, plan_hash=plan_set_hash(document))


def commit(
    specs: Sequence[ProxySpec],
    *,
    plan_hash: str,
    shown: Mapping[str, Any] | None = None,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> list[Operation]:
    """Create ``specs`` only if their plan set still hashes to ``plan_hash``.

    ``shown`` is the document that was shown (signed page field, or the dry run's file); with
    it a refusal names what changed, without it only that the hash moved. Refused whole, with
    nothing written: ``PlanChanged``, or ``ValidationError`` when ``shown`` does not hash to
    ``plan_hash`` (it is not the plan that hash was shown for).
    """
    if shown is not None and plan_set_hash(shown) != plan_hash:
        raise ValidationError(
            {"plan_hash": "the shown plan does not hash to the plan hash given; preview again"}
        )
    specs = list(specs)
    with transaction.atomic():
        # Every declaration of proxies on these clusters locks them first (quotas), so no
        # create can move placement's inputs between this check and the write below.
        cluster_lock(cluster_ids=[s.cluster.pk for s in specs])
        now = plan_set_for(specs)
        if now.plan_hash != plan_hash:
            changes = (
                what_changed(shown, now.document)
                if shown is not None
                else [f"its hash is now {now.plan_hash}, not {plan_hash}"]
            )
            raise PlanChanged(changes)
        return proxies_create(specs=specs, user=user, via=via, idempotency_key=idempotency_key)


def sign_shown(document: Mapping[str, Any], *, user_id: int) -> str:
    """The shown document, signed for ``user_id`` (compressed: a batch repeats itself)."""
    return signing.dumps({"u": user_id, "d": dict(document)}, salt=SHOWN_SALT, compress=True)


def load_shown(token: str, *, user_id: int) -> dict[str, Any]:
    """The document ``sign_shown`` signed for ``user_id``, at most
    ``PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS`` ago; else ``ValidationError`` naming the field."""
    try:
        payload = signing.loads(
            token, salt=SHOWN_SALT, max_age=settings.PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS
        )
    except signing.SignatureExpired:
        raise ValidationError({"plan_shown": "the shown plan is too old; preview again"}) from None
    except signing.BadSignature:
        raise ValidationError(
            {"plan_shown": "the shown plan was altered or made for something else"}
        ) from None
    if not isinstance(payload, dict) or payload.get("u") != user_id:
        raise ValidationError({"plan_shown": "the shown plan was made for another user"})
    document = payload.get("d")
    if not isinstance(document, dict):
        raise ValidationError({"plan_shown": "the shown plan was altered"})
    return document


def _placed(spec: ProxySpec, config: ProxmoxConfig) -> bool:
    """Whether placement chooses this proxy's node: a blank zone on a multi-node cluster,
    unless the zone is required (then the plan refuses the blank zone as the create would)."""
    return (
        not spec.zone
        and len(config.nodes) > 1
        and not getattr(settings, "PROXYHUB_ZONE_REQUIRED", False)
    )
