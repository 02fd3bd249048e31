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
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from provisioning.models import Cluster, Operation, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredPower,
    DesiredState,
    OperationKind,
    OperationState,
    Phase,
    RequestedVia,
)
from provisioning.proxmox.errors import PermanentError
from provisioning.proxmox.placement import resolve_machine_type, resolve_template, resolve_zone

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

User = AbstractBaseUser | AnonymousUser | None


class IdempotencyConflict(ValueError):
    """An idempotency key was reused with different inputs."""


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


def validate_placement(cluster: Cluster, *, zone: str, machine_type: str, image: str) -> None:
    """Entry 3's checks against the catalogue, as field errors an operator can act on."""
    config = cluster.proxmox_config("validation")
    errors: dict[str, str] = {}
    checks = (
        ("zone", lambda: resolve_zone(config, zone) if zone else None),
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
    """Write the proxy and its ``create`` operation; send the first step after commit."""
    inputs = _inputs_hash(
        "create",
        spec.name,
        spec.cluster.pk,
        spec.zone,
        spec.machine_type,
        spec.image,
        hashlib.sha256(spec.cloud_init).hexdigest(),
    )
    existing = _by_key(idempotency_key, inputs)
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
            proxy.save()
            return _start(proxy, OperationKind.CREATE, user, via, idempotency_key, inputs)
    except IntegrityError as err:
        if idempotency_key and Operation.objects.filter(idempotency_key=idempotency_key).exists():
            return _by_key(idempotency_key, inputs) or _conflict(idempotency_key)
        raise ValidationError({"name": f"a proxy named {spec.name} already exists"}) from err


def proxies_create(
    *, specs: Iterable[ProxySpec], user: User = None, via: str = RequestedVia.COMMAND
) -> list[Operation]:
    """Create many proxies in one transaction: all are written, or none is."""
    specs = list(specs)
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValidationError({"name": f"names given twice: {', '.join(duplicates)}"})
    taken = sorted(Proxy.objects.filter(name__in=names).values_list("name", flat=True))
    if taken:
        raise ValidationError({"name": f"proxies already exist: {', '.join(taken)}"})
    with transaction.atomic():
        return [proxy_create(spec=s, user=user, via=via) for s in specs]


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
    """Change placement or cloud-init; the VM is replaced. Returns None when nothing changed."""
    with transaction.atomic():
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


def proxy_replace(*, proxy: Proxy, user: User = None, via: str = RequestedVia.COMMAND) -> Operation:
    """Replace the proxy's VM with a new one built from the current spec."""
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        if locked.desired_state == DesiredState.DELETED:
            raise ValidationError("the proxy is being deleted; it cannot be replaced")
        _supersede(locked, "replace")
        locked.phase = Phase.PENDING
        locked.last_error, locked.last_error_class = "", ""
        locked.save(update_fields=["phase", "last_error", "last_error_class", "updated_at"])
        return _start(locked, OperationKind.REPLACE, user, via, None, "")


def proxy_retry(*, proxy: Proxy, user: User = None, via: str = RequestedVia.COMMAND) -> Operation:
    """Clear a latched ``Failed`` and try again: a delete when one was asked for, else a create
    (which adopts whatever VM of this proxy already exists)."""
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        existing = _active(locked).first()
        if existing is not None:
            return existing
        kind = (
            OperationKind.DELETE
            if locked.desired_state == DesiredState.DELETED
            else OperationKind.CREATE
        )
        locked.phase = Phase.DELETING if kind == OperationKind.DELETE else Phase.PENDING
        locked.last_error, locked.last_error_class = "", ""
        locked.save(update_fields=["phase", "last_error", "last_error_class", "updated_at"])
        return _start(locked, kind, user, via, None, "")


def proxy_power(
    *, proxy: Proxy, action: str, user: User = None, via: str = RequestedVia.COMMAND
) -> Operation:
    """Start, gracefully shut down or reboot the proxy's VM (seed 001)."""
    kinds = {
        "start": OperationKind.START,
        "shutdown": OperationKind.SHUTDOWN,
        "reboot": OperationKind.REBOOT,
    }
    if action not in kinds:
        raise ValidationError({"action": f"must be one of start, shutdown, reboot; got {action!r}"})
    with transaction.atomic():
        locked = Proxy.objects.select_for_update().get(pk=proxy.pk)
        if locked.desired_state == DesiredState.DELETED:
            raise ValidationError(f"{locked.name} is being deleted")
        if not locked.provider_id:
            raise ValidationError(f"{locked.name} has no VM yet")
        if action == "shutdown":
            locked.desired_power = DesiredPower.OFF
        elif action == "start":
            locked.desired_power = DesiredPower.ON
        locked.save(update_fields=["desired_power", "updated_at"])
        _supersede(
            locked,
            action,
            kinds=(OperationKind.START, OperationKind.SHUTDOWN, OperationKind.REBOOT),
        )
        return _start(locked, kinds[action], user, via, None, "")


def operation_for_gc(*, cluster: Cluster, vm_name: str, uid: str, vmid: int) -> Operation:
    """A journalled delete of an orphaned VM (no proxy row): GC's deletes show in the journal."""
    with transaction.atomic():
        return _new_operation(
            kind=OperationKind.DELETE,
            proxy=None,
            proxy_name=vm_name.removeprefix("proxy-"),
            cluster=cluster,
            requested_via=RequestedVia.BEAT,
            progress={"target": {"vm_name": vm_name, "uid": uid, "vmid": vmid}},
        )


# --- helpers ---------------------------------------------------------------------------


def _start(
    proxy: Proxy,
    kind: str,
    user: User,
    via: str,
    idempotency_key: str | None,
    inputs: str,
) -> Operation:
    return _new_operation(
        kind=kind,
        proxy=proxy,
        proxy_name=proxy.name,
        cluster=proxy.cluster,
        # An authenticated user is an instance of AUTH_USER_MODEL (auth.User here); the stubs
        # type request.user as AbstractBaseUser and cannot know that.
        requested_by=cast("AuthUser", user) if user is not None and user.is_authenticated else None,
        requested_via=via,
        idempotency_key=idempotency_key or None,
        inputs_hash=inputs,
    )


def _new_operation(**fields: Any) -> Operation:
    """Write an operation whose first step is due now, and send that step after commit."""
    op = Operation.objects.create(
        next_step_at=timezone.now(), dispatch_token=secrets.token_hex(8), **fields
    )
    _send_on_commit(op)
    return op


def _send_on_commit(op: Operation) -> None:
    from provisioning.tasks import send_step

    op_id, token = str(op.pk), op.dispatch_token
    transaction.on_commit(lambda: send_step(op_id, token, countdown=0))


def _active(proxy: Proxy):  # type: ignore[no-untyped-def]
    return Operation.objects.filter(proxy=proxy, state__in=ACTIVE_STATES)


def _supersede(
    proxy: Proxy,
    by: str,
    kinds: Iterable[str] = (
        OperationKind.CREATE,
        OperationKind.REPLACE,
        OperationKind.START,
        OperationKind.SHUTDOWN,
        OperationKind.REBOOT,
    ),
) -> None:
    """End unfinished older operations of the given kinds: the newer intent wins. A step such an
    operation is running right now finishes, but its result is not applied (see the driver)."""
    now = timezone.now()
    _active(proxy).filter(kind__in=list(kinds)).update(
        state=OperationState.FAILED,
        last_error=f"superseded by {by}",
        finished_at=now,
        next_step_at=None,
    )


def _inputs_hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()


def _by_key(key: str | None, inputs: str) -> Operation | None:
    if not key:
        return None
    op = Operation.objects.filter(idempotency_key=key).first()
    if op is None:
        return None
    if op.inputs_hash != inputs:
        _conflict(key)
    return op


def _conflict(key: str) -> Operation:
    raise IdempotencyConflict(
        f"idempotency key {key!r} was already used for a different request; use a new key"
    )
