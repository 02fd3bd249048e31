"""Intents: creating, deleting, replacing, retrying and powering proxies.

Every entry point writes the proxy change and its ``Operation`` in one transaction and sends
the operation's first step only after commit (STYLE.md: enqueue on commit). An optional
idempotency key returns the operation a repeated request already made, and refuses the same key
with different inputs. A newer intent supersedes older unfinished ones on the same proxy: a
delete wins over a create still running, for example.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F

from provisioning import sealing
from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredPower,
    DesiredState,
    ErrorClass,
    OperationKind,
    OperationState,
    Phase,
    RequestedVia,
)
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.placement import resolve_machine_type, resolve_template, resolve_zone

from . import dispatch, policy, quotas, tracing
from .clock import db_now
from .requesters import requester_name

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

User = AbstractBaseUser | AnonymousUser | None

log = logging.getLogger("proxyhub.operations")


class IdempotencyConflict(ValueError):
    """An idempotency key was reused with different inputs."""


# A NoCloud user-data file is a few kilobytes; a megabyte is far beyond any real one and keeps a
# mistaken upload (an image, a log) out of the database and the seed ISO. The admin's forms and
# ``proxies create`` apply it alike.
CLOUD_INIT_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ProxySpec:
    """What an operator asks for when creating a proxy."""

    name: str
    cluster: Cluster
    machine_type: str
    image: str
    zone: str = ""
    cloud_init: bytes = b""

    def __repr__(self) -> str:  # never show the cloud-init
        return (
            f"ProxySpec(name={self.name!r}, cluster={self.cluster.name!r}, "
            f"machine_type={self.machine_type!r}, image={self.image!r}, zone={self.zone!r}, "
            f"cloud_init=<{len(self.cloud_init)} bytes>)"
        )


def zone_required() -> bool:
    """``PROXYHUB_ZONE_REQUIRED``: seed 000 entry 3's rule that a cluster of several nodes
    needs a zone, instead of proxyhub's placement of a blank zone (the default)."""
    return bool(getattr(settings, "PROXYHUB_ZONE_REQUIRED", False))


def validate_placement(cluster: Cluster, *, zone: str, machine_type: str, image: str) -> None:
    """Entry 3's checks against the catalogue, as field errors an operator can act on."""
    config = cluster.proxmox_config("validation")
    errors: dict[str, str] = {}
    checks = (
        # A blank zone is placed by proxyhub unless the seed's rule is asked for.
        ("zone", lambda: resolve_zone(config, zone) if zone or zone_required() else None),
        ("machine_type", lambda: resolve_machine_type(config, machine_type)),
        ("image", lambda: resolve_template(config, image)),
    )
    for field, check in checks:
        try:
            check()
        except PermanentError as err:
            errors[field] = str(err)
    if errors:
        raise ValidationError(errors)


def numbered_names(prefix: str, count: int) -> list[str]:
    """``prefix-1`` .. ``prefix-N`` zero padded to N's width (``web-01`` .. ``web-12``): how
    bulk creates name proxies, from the command line and the admin alike."""
    width = len(str(count))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, count + 1)]


def proxy_create(
    *,
    spec: ProxySpec,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> Operation:
    """Write the proxy and its ``create`` operation; send the first step after commit.

    Refused (``quotas.QuotaExceeded``) when the cluster's quotas leave no room for it."""
    return _create(spec, user, via, idempotency_key, admit=True)


def _create(
    spec: ProxySpec, user: User, via: str, idempotency_key: str | None, *, admit: bool
) -> Operation:
    """``proxy_create``; ``admit=False`` when the caller has admitted the whole batch already."""
    # The cloud-init enters as its keyed digest (an unsalted SHA-256 in a stored column would
    # confirm a guessed cloud-init), under each configured key: the same request made again
    # after a new sealing key was put in front still matches what the first one stored.
    inputs, *earlier = [
        _inputs_hash(
            "create", spec.name, spec.cluster.pk, spec.zone, spec.machine_type, spec.image, digest
        )
        for digest in sealing.digests(spec.cloud_init)
    ]
    existing = _by_key(idempotency_key, inputs, also=earlier)
    if existing is not None:
        return existing
    validate_placement(
        spec.cluster, zone=spec.zone, machine_type=spec.machine_type, image=spec.image
    )
    proxy = Proxy(
        name=spec.name,
        cluster=spec.cluster,
        zone=spec.zone,
        machine_type=spec.machine_type,
        image=spec.image,
    )
    proxy.set_cloud_init(spec.cloud_init)
    proxy.full_clean(exclude=["cluster"])
    try:
        with transaction.atomic():
            if admit:
                quotas.cluster_quota_admit(cluster=spec.cluster, proxies=1, creates=1)
            proxy.save()
            return _start(proxy, OperationKind.CREATE, user, via, idempotency_key, inputs)
    except IntegrityError as err:
        if idempotency_key and Operation.objects.filter(idempotency_key=idempotency_key).exists():
            return _by_key(idempotency_key, inputs, also=earlier) or _conflict(idempotency_key)
        raise ValidationError({"name": f"a proxy named {spec.name} already exists"}) from err


def proxies_create(
    *,
    specs: Iterable[ProxySpec],
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> list[Operation]:
    """Create many proxies in one transaction: all are written, or none is.

    Refused whole (``quotas.QuotaExceeded``) when the batch is larger than the requester's bulk
    limit, or would take a cluster past its quotas.

    With ``idempotency_key``, each proxy's create gets the key ``<key>:create:<name>``: the
    same request made again (a command re-run after its connection dropped) returns the
    operations the first one made instead of refusing the names as taken.
    """
    specs = list(specs)
    quotas.bulk_create_admit(user=user, count=len(specs))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValidationError({"name": f"names given twice: {', '.join(duplicates)}"})
    keys = {
        s.name: f"{idempotency_key}:create:{s.name}" if idempotency_key else None for s in specs
    }
    made: set[str] = set()
    if idempotency_key:
        made = set(
            Operation.objects.filter(
                idempotency_key__in=[k for k in keys.values() if k]
            ).values_list("proxy_name", flat=True)
        )
    taken = sorted(
        Proxy.objects.filter(name__in=[n for n in names if n not in made]).values_list(
            "name", flat=True
        )
    )
    if taken:
        raise ValidationError({"name": f"proxies already exist: {', '.join(taken)}"})
    # What the batch adds per cluster: a proxy this key made already is held, not added.
    adding = Counter(s.cluster.pk for s in specs if s.name not in made)
    with transaction.atomic():
        quotas.clusters_quota_admit(adding=adding)
        return [_create(s, user, via, keys[s.name], admit=False) for s in specs]


def proxy_request_delete(
    *,
    proxy: Proxy,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> Operation:
    """Mark the proxy for deletion; its VM, disks and seed ISO go, then the row."""
    inputs = _inputs_hash("delete", proxy.pk)
    existing = _by_key(idempotency_key, inputs)
    if existing is not None:
        return existing
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        active = _active(locked).filter(kind=OperationKind.DELETE).first()
        if active is not None:
            return active
        locked.desired_state = DesiredState.DELETED
        locked.phase = Phase.DELETING
        locked.save(update_fields=["desired_state", "phase", "updated_at"])
        _supersede(locked, "delete")
        return _start(locked, OperationKind.DELETE, user, via, idempotency_key, inputs)


def proxy_update(
    *,
    proxy: Proxy,
    zone: str | None = None,
    machine_type: str | None = None,
    image: str | None = None,
    cloud_init: bytes | None = None,
    user: User = None,
    via: str = RequestedVia.COMMAND,
) -> Operation | None:
    """Change placement or cloud-init; the VM is replaced. Returns None when nothing changed.

    Refused (``quotas.QuotaExceeded``) with nothing changed when the cluster's creates in flight
    leave no room for the replace."""
    with transaction.atomic():
        quotas.cluster_lock(cluster_ids=[proxy.cluster_id])  # the cluster before its proxy
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        before = locked.compute_spec_hash()
        if zone is not None:
            locked.zone = zone
        if machine_type is not None:
            locked.machine_type = machine_type
        if image is not None:
            locked.image = image
        if cloud_init is not None:
            locked.set_cloud_init(cloud_init)
        if locked.compute_spec_hash() == before:
            return None
        validate_placement(
            locked.cluster, zone=locked.zone, machine_type=locked.machine_type, image=locked.image
        )
        locked.save()
        return proxy_replace(proxy=locked, user=user, via=via)


def proxy_replace(
    *,
    proxy: Proxy,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
    expected_digest: str = "",
) -> Operation:
    """Replace the proxy's VM with a new one built from the current spec.

    ``expected_digest``: the VM config digest the confirmation page showed (seed 001, issue
    14); the worker refuses the replace, before stopping anything, if the VM's config has
    another digest by then."""
    inputs = _inputs_hash("replace", proxy.pk)
    existing = _by_key(idempotency_key, inputs)
    if existing is not None:
        return existing
    with transaction.atomic():
        quotas.cluster_lock(cluster_ids=[proxy.cluster_id])  # the cluster before its proxy
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        if locked.desired_state == DesiredState.DELETED:
            raise ValidationError("the proxy is being deleted; it cannot be replaced")
        # A replace builds a VM as a create does; the proxy's own unfinished build ends here.
        quotas.cluster_quota_admit(cluster=locked.cluster, proxies=0, creates=1, superseding=locked)
        _supersede(locked, "replace")
        locked.phase = Phase.PENDING
        locked.last_error, locked.last_error_class = "", ""
        locked.save(update_fields=["phase", "last_error", "last_error_class", "updated_at"])
        return _start(
            locked,
            OperationKind.REPLACE,
            user,
            via,
            idempotency_key,
            inputs,
            progress=_confirmed(expected_digest),
        )


def proxy_retry(
    *,
    proxy: Proxy,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> Operation:
    """Clear a latched ``Failed`` and try again: a delete when one was asked for, else a create
    (which adopts whatever VM of this proxy already exists). An operation still running is
    handed back, unless it is past its ceiling: then it is superseded by the new one."""
    inputs = _inputs_hash("retry", proxy.pk)
    existing = _by_key(idempotency_key, inputs)
    if existing is not None:
        return existing
    with transaction.atomic():
        quotas.cluster_lock(cluster_ids=[proxy.cluster_id])  # the cluster before its proxy
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        active = _active(locked).first()
        if active is not None:
            if not _past_ceiling(active):
                return active
            _supersede(locked, "a retry (the operation was past its ceiling)")
        kind = (
            OperationKind.DELETE
            if locked.desired_state == DesiredState.DELETED
            else OperationKind.CREATE
        )
        if kind == OperationKind.CREATE:
            # A create again: it counts against the creates in flight (a delete never waits).
            quotas.cluster_quota_admit(
                cluster=locked.cluster, proxies=0, creates=1, superseding=locked
            )
        locked.phase = Phase.DELETING if kind == OperationKind.DELETE else Phase.PENDING
        locked.last_error, locked.last_error_class = "", ""
        locked.save(update_fields=["phase", "last_error", "last_error_class", "updated_at"])
        return _start(locked, kind, user, via, idempotency_key, inputs)


def proxy_accept_vm(
    *,
    proxy: Proxy,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
) -> Operation:
    """Seed 001: the operator says the VM found at the proxy's name, which carries its mark but
    not the identity recorded (restored from a backup on purpose, say), is the proxy's VM.

    The recorded SMBIOS UUID and vmgenid are forgotten and the proxy is retried: its create
    adopts that VM and records its identity (or, for a proxy being deleted, its delete now
    destroys it). Refused for a proxy without an identity mismatch, so it never loosens the
    check on a proxy nobody looked at."""
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        if locked.last_error_class != ErrorClass.IDENTITY:
            raise ValidationError(
                f"{locked.name} shows no identity mismatch; there is no found VM to accept"
            )
        log.info(
            "identity of a found vm accepted",
            extra={
                "proxy": locked.name,
                "smbios_uuid": locked.smbios_uuid,
                "vmgenid": locked.vmgenid,
                "user": getattr(user, "username", "") or "",
            },
        )
        locked.smbios_uuid, locked.vmgenid = "", ""
        locked.save(update_fields=["smbios_uuid", "vmgenid", "updated_at"])
        return proxy_retry(proxy=locked, user=user, via=via, idempotency_key=idempotency_key)


def proxy_power(
    *,
    proxy: Proxy,
    action: str,
    user: User = None,
    via: str = RequestedVia.COMMAND,
    idempotency_key: str | None = None,
    expected_digest: str = "",
) -> Operation:
    """Start, gracefully shut down or reboot the proxy's VM (seed 001), as the operator asks:
    ``desired_power`` follows a start or a shutdown. Refused while the proxy's VM is being
    created, replaced or deleted: a power action between those steps would act on a VM that
    is not ready (a start before its seed ISO is attached boots a VM that never gets an
    address).

    ``expected_digest``: the VM config digest the confirmation page showed (seed 001, issue
    14); the worker refuses the action, before its intent and again right before dispatch, if
    the VM's config has another digest by then."""
    kinds = {
        "start": OperationKind.START,
        "shutdown": OperationKind.SHUTDOWN,
        "reboot": OperationKind.REBOOT,
    }
    if action not in kinds:
        raise ValidationError({"action": f"must be one of start, shutdown, reboot; got {action!r}"})
    inputs = _inputs_hash(action, proxy.pk)
    existing = _by_key(idempotency_key, inputs)
    if existing is not None:
        return existing
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        if locked.desired_state == DesiredState.DELETED:
            raise ValidationError(f"{locked.name} is being deleted")
        building = _active(locked).exclude(kind__in=_YIELDING).first()
        if building is not None:
            raise ValidationError(
                f"{locked.name} is being {_BUILDING[building.kind]}; ask again once it is "
                f"{'Running' if building.kind != OperationKind.DELETE else 'gone'}"
            )
        if not locked.provider_id:
            raise ValidationError(f"{locked.name} has no VM yet")
        if action == "shutdown":
            locked.desired_power = DesiredPower.OFF
        elif action == "start":
            locked.desired_power = DesiredPower.ON
        locked.save(update_fields=["desired_power", "updated_at"])
        _supersede(locked, action, kinds=_YIELDING)
        return _start(
            locked,
            kinds[action],
            user,
            via,
            idempotency_key,
            inputs,
            progress=_confirmed(expected_digest),
        )


def proxy_converge(*, proxy: Proxy, kind: str, reason: str) -> Operation:
    """Reconcile's own door: start ``kind`` on an idle proxy to bring it to what the operator
    asked for, without touching what was asked (``desired_*``) and without superseding
    anything. The caller holds the proxy's row lock and has checked, on the row as it is now,
    that no operation runs and none ran since its snapshot (``services.reconcile``)."""
    if _active(proxy).exists():
        raise ValidationError(f"{proxy.name} is busy; reconcile acts only on idle proxies")
    fields = ["updated_at"]
    if kind in (OperationKind.CREATE, OperationKind.REPLACE):
        proxy.phase, proxy.last_error, proxy.last_error_class = Phase.PENDING, "", ""
        fields += ["phase", "last_error", "last_error_class"]
    elif kind == OperationKind.DELETE:
        proxy.phase = Phase.DELETING
        fields.append("phase")
    proxy.save(update_fields=fields)
    log.info(
        "reconcile converges a proxy", extra={"proxy": proxy.name, "kind": kind, "reason": reason}
    )
    return _start(proxy, kind, None, RequestedVia.BEAT, None, "", reason=reason)


def operation_for_gc(*, cluster: Cluster, vm_name: str, uid: str, vmid: int) -> Operation:
    """A journalled delete of an orphaned VM (no proxy row): GC's deletes show in the journal."""
    with transaction.atomic():
        return _new_operation(
            kind=OperationKind.DELETE,
            proxy=None,
            # The journal's name column fits a proxy name; a foreign VM's may be longer (the
            # target in progress keeps it whole).
            proxy_name=vm_name.removeprefix("proxy-")[
                : Operation._meta.get_field("proxy_name").max_length
            ],
            cluster=cluster,
            requested_via=RequestedVia.BEAT,
            progress={"target": {"vm_name": vm_name, "uid": uid, "vmid": vmid}},
        )


def operation_for_template_build(
    *, cluster: Cluster, name: str, build: dict[str, Any], user: User, via: str
) -> Operation:
    """A journalled template build (issue 14): no proxy; its inputs in ``progress.build``.

    Run by the same driver as a create, so it has the journal's receipts, claims, ceilings and
    sweeper; only the proxy lease and row are absent (the driver takes none without a proxy)."""
    return _new_operation(
        kind=OperationKind.TEMPLATE_BUILD,
        proxy=None,
        proxy_name=name[: Operation._meta.get_field("proxy_name").max_length],
        cluster=cluster,
        requested_by=cast("AuthUser", user) if user is not None and user.is_authenticated else None,
        requested_by_name=requester_name(user, via),
        requested_via=via,
        progress={"build": build},
    )


# --- helpers ---------------------------------------------------------------------------


def _start(
    proxy: Proxy,
    kind: str,
    user: User,
    via: str,
    idempotency_key: str | None,
    inputs: str,
    *,
    reason: str = "",
    progress: dict[str, Any] | None = None,
) -> Operation:
    extra = {"progress": progress} if progress else {}
    return _new_operation(
        kind=kind,
        proxy=proxy,
        proxy_name=proxy.name,
        cluster=proxy.cluster,
        # An authenticated user is an instance of AUTH_USER_MODEL (auth.User here); the stubs
        # type request.user as AbstractBaseUser and cannot know that.
        requested_by=cast("AuthUser", user) if user is not None and user.is_authenticated else None,
        requested_by_name=requester_name(user, via),
        requested_via=via,
        idempotency_key=idempotency_key or None,
        inputs_hash=inputs,
        reason=reason,
        **extra,
    )


def _confirmed(expected_digest: str) -> dict[str, Any] | None:
    """The operation's first progress when a confirmation page bound it to a config digest."""
    if not expected_digest:
        return None
    if not re.fullmatch(r"[0-9a-f]{1,64}", expected_digest):
        raise ValidationError({"expected_digest": "must be the hexadecimal digest shown"})
    return {"expected_digest": expected_digest}


def _new_operation(**fields: Any) -> Operation:
    """Write an operation whose first step is due now, and send that step after commit.

    Its times come from the database's clock, which ages and ceilings are measured against.
    Starting an operation moves its proxy's ``generation``, so a reconcile decision taken on a
    snapshot from before it is recognised as stale.
    """
    now = db_now()
    op = Operation.objects.create(
        created_at=now, next_step_at=now, dispatch_token=secrets.token_hex(8), **fields
    )
    if op.proxy_id is not None:
        Proxy.objects.filter(pk=op.proxy_id).update(generation=F("generation") + 1)
    # New work: it waits while steps of work under way are due (dispatch.PRIORITY_CAN_WAIT).
    dispatch.send_after_commit(
        str(op.pk),
        op.dispatch_token,
        trace_parent=op.trace_parent,
        priority=dispatch.PRIORITY_CAN_WAIT,
    )
    return op


def _active(proxy: Proxy):  # type: ignore[no-untyped-def]
    return Operation.objects.filter(proxy=proxy, state__in=ACTIVE_STATES)


_NAME_MAX = 57  # Operation.proxy_name's max_length, as long as the longest proxy name

_POWER_KINDS = (OperationKind.START, OperationKind.SHUTDOWN, OperationKind.REBOOT)
# Kinds that leave the proxy's VM in place, and that an operator's power request supersedes:
# reconcile's drift repair yields to any request of the operator.
_YIELDING = (*_POWER_KINDS, OperationKind.REPAIR)
_BUILDING = {
    OperationKind.CREATE: "created",
    OperationKind.REPLACE: "replaced",
    OperationKind.DELETE: "deleted",
}


def _supersede(
    proxy: Proxy,
    by: str,
    kinds: Iterable[str] = (
        OperationKind.CREATE,
        OperationKind.REPLACE,
        OperationKind.START,
        OperationKind.SHUTDOWN,
        OperationKind.REBOOT,
        OperationKind.REPAIR,
    ),
) -> None:
    """End unfinished older operations of the given kinds: the newer intent wins. A step such an
    operation is running right now finishes, but its result is not applied (see the driver),
    and the new operation waits for the proxy's lease until that step is done."""
    ended = list(_active(proxy).filter(kind__in=list(kinds)).select_related("cluster"))
    now = db_now()
    _active(proxy).filter(pk__in=[op.pk for op in ended]).update(
        state=OperationState.FAILED,
        last_error=f"superseded by {by}",
        finished_at=now,
        next_step_at=None,
    )
    for op in ended:
        transaction.on_commit(partial(tracing.operation_span_end, op, OperationState.FAILED, now))


def _past_ceiling(op: Operation) -> bool:
    """Whether ``op`` is older than its kind allows: its next delivery would end it."""
    return policy.age_of(op, db_now()) > policy.ceiling_for(op.kind).age


def _inputs_hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


def _by_key(key: str | None, inputs: str, also: Iterable[str] = ()) -> Operation | None:
    """The operation made under ``key`` before, if its inputs were ``inputs`` (or one of
    ``also``); another request under the same key is a conflict."""
    if not key:
        return None
    op = Operation.objects.filter(idempotency_key=key).first()
    if op is None:
        return None
    if op.inputs_hash != inputs and op.inputs_hash not in set(also):
        _conflict(key)
    return op


def _conflict(key: str) -> Operation:
    raise IdempotencyConflict(
        f"idempotency key {key!r} was already used for a different request; use a new key"
    )
