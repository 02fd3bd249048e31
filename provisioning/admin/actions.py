"""The proxy list's actions: thin doors onto ``provisioning.services.operations``.

Each action checks its own model permission (``@admin.action(permissions=...)``), refuses more
targets than a confirmation can carry, and reports with an ``ngettext`` message that counts
what it queued and what it skipped. Destructive and power actions first show a confirmation
page listing the exact targets (modelled on Django's ``delete_selected``). Every operation is
written by a service with ``requested_by`` and ``requested_via="admin"`` and sent only after
commit; the only Proxmox calls in these requests are the power page's bounded reads
(``inspection``) and preflight's GETs (``services.plans``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from provisioning.models import Operation, Proxy
from provisioning.models.choices import (
    ACTIVE_STATES,
    DesiredState,
    ErrorClass,
    OperationKind,
    RequestedVia,
)
from provisioning.proxmox.power_checks import Action
from provisioning.proxmox.seed import seed_iso_name, seed_volid
from provisioning.services import operations, shown_digests
from provisioning.services.installation import installation_id

from . import display, inspection, plans
from .common import confirmation, confirmed, door_key, too_many
from .inspection import power_targets

ADMIN = RequestedVia.ADMIN

# The buttons on a proxy's change page, which run these actions on that one proxy.
SHORT_LABELS = {
    "provision": "Provision or retry",
    "replace": "Replace its VM…",
    "accept_vm": "Accept the VM found…",
    "start": "Start…",
    "shutdown": "Shut down…",
    "reboot": "Reboot…",
    "delete_vms": "Delete with its VM…",
    "preview_plan": "Preview plan",
    "preflight": "Preflight",
}


def _names(names: Sequence[str], shown: int = 10) -> str:
    rest = len(names) - shown
    text = ", ".join(names[:shown])
    return f"{text} and {rest} more" if rest > 0 else text


def _report_skipped(modeladmin: admin.ModelAdmin, request: HttpRequest, skipped: list[str]) -> None:
    if not skipped:
        return
    modeladmin.message_user(
        request,
        ngettext(
            "%(count)d proxy was skipped: %(reasons)s",
            "%(count)d proxies were skipped: %(reasons)s",
            len(skipped),
        )
        % {"count": len(skipped), "reasons": "; ".join(skipped[:10])},
        messages.WARNING,
    )


def _errors(err: ValidationError) -> str:
    return "; ".join(err.messages)


def _shown(request: HttpRequest, action: str) -> dict[int, str]:
    """The config digests the confirmation page showed, by proxy id (issue 14). A confirm
    without the field (a page from before it was added) binds none; a forged or foreign one
    raises ``ValidationError``."""
    token = str(request.POST.get(shown_digests.FIELD, ""))
    if not token:
        return {}
    return shown_digests.load_digests(token, action=action, user_id=_user_id(request))


def _sign_shown(request: HttpRequest, action: str, digests: dict[int, str]) -> str:
    if digests:
        # The page read them: keep them as the last digests seen of those VMs.
        shown_digests.record_digests(digests)
    return shown_digests.sign_digests(digests, action=action, user_id=_user_id(request))


def _user_id(request: HttpRequest) -> int:
    return cast(int, request.user.pk)


def _short_digest(digest: str) -> str:
    return digest[:12] if digest else "not read"


# --- provision / retry -------------------------------------------------------------------------


@admin.action(permissions=["provision"], description="Provision or retry (clears Failed)")
def provision(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> None:
    """Start the proxy's create (or, for one being deleted, its delete) again: a ``Failed``
    proxy is cleared and retried; one whose operation still runs keeps that operation."""
    if too_many(modeladmin, request, queryset):
        return
    proxies = list(queryset)
    running_before = set(
        Operation.objects.filter(proxy__in=proxies, state__in=ACTIVE_STATES).values_list(
            "pk", flat=True
        )
    )
    queued: list[str] = []
    deleting: list[str] = []
    busy: list[str] = []
    refused: list[str] = []
    for proxy in proxies:
        try:
            op = operations.proxy_retry(proxy=proxy, user=request.user, via=ADMIN)
        except ValidationError as err:  # a quota: the cluster has too many creates in flight
            refused.append(f"{proxy.name}: {_errors(err)}")
            continue
        if op.pk in running_before:
            busy.append(proxy.name)
        elif op.kind == OperationKind.DELETE:
            deleting.append(proxy.name)
        else:
            queued.append(proxy.name)
    if deleting:
        modeladmin.message_user(
            request,
            ngettext(
                "Retrying the delete of %(count)d proxy: %(names)s.",
                "Retrying the delete of %(count)d proxies: %(names)s.",
                len(deleting),
            )
            % {"count": len(deleting), "names": _names(deleting)},
            messages.SUCCESS,
        )
    if queued:
        modeladmin.message_user(
            request,
            ngettext(
                "Queued provisioning of %(count)d proxy: %(names)s.",
                "Queued provisioning of %(count)d proxies: %(names)s.",
                len(queued),
            )
            % {"count": len(queued), "names": _names(queued)},
            messages.SUCCESS,
        )
    if busy:
        modeladmin.message_user(
            request,
            ngettext(
                "%(count)d proxy already has an operation running: %(names)s.",
                "%(count)d proxies already have an operation running: %(names)s.",
                len(busy),
            )
            % {"count": len(busy), "names": _names(busy)},
            messages.INFO,
        )
    _report_skipped(modeladmin, request, refused)


# --- replace -----------------------------------------------------------------------------------


@admin.action(permissions=["provision"], description="Replace the VM of selected proxies…")
def replace(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> TemplateResponse | None:
    """Delete each proxy's VM and create a new one from its current spec (confirmed first)."""
    if too_many(modeladmin, request, queryset):
        return None
    proxies = list(queryset)

    def skip_reason(proxy: Proxy) -> str:
        return "is being deleted" if proxy.desired_state == DesiredState.DELETED else ""

    if confirmed(request):
        try:
            shown = _shown(request, "replace")
        except ValidationError as err:
            modeladmin.message_user(
                request, f"Nothing was replaced: {_errors(err)}", messages.ERROR
            )
            return None
        done: list[str] = []
        skipped: list[str] = []
        for proxy in proxies:
            reason = skip_reason(proxy)
            if not reason:
                try:
                    operations.proxy_replace(
                        proxy=proxy,
                        user=request.user,
                        via=ADMIN,
                        idempotency_key=door_key(request, "replace", proxy),
                        # Seed 001, issue 14: the worker refuses a VM whose config changed
                        # since this page showed it, before stopping anything.
                        expected_digest=shown.get(proxy.pk, ""),
                    )
                except ValidationError as err:
                    reason = _errors(err)
            if reason:
                skipped.append(f"{proxy.name} {reason}")
            else:
                done.append(proxy.name)
        if done:
            modeladmin.message_user(
                request,
                ngettext(
                    "Replacing the VM of %(count)d proxy: %(names)s.",
                    "Replacing the VMs of %(count)d proxies: %(names)s.",
                    len(done),
                )
                % {"count": len(done), "names": _names(done)},
                messages.SUCCESS,
            )
        _report_skipped(modeladmin, request, skipped)
        return None
    # The live digest where the VM can be read now, else the last one seen (issue 14).
    digests = {p.pk: p.config_digest for p in proxies if p.config_digest}
    live = inspection.read_digests(p for p in proxies if not skip_reason(p))
    shown_digests.record_digests(live)
    digests.update(live)
    rows = [
        {
            "cells": [
                proxy.name,
                proxy.node,
                proxy.vmid or "",
                proxy.provider_id or "no VM yet",
                display.phase_badge(proxy.phase),
                _short_digest(digests.get(proxy.pk, "")),
            ],
            "skip": skip_reason(proxy),
        }
        for proxy in proxies
    ]
    return confirmation(
        modeladmin,
        request,
        proxies,
        action="replace",
        title="Replace the VMs of these proxies?",
        intro="Each VM below is stopped and destroyed with its disks and seed ISO, then a new "
        "VM is created from the proxy's current spec. The proxy keeps its name and UID; its "
        "address may change.",
        columns=["Proxy", "Node", "VMID", "Provider id", "Phase", "Config digest"],
        rows=rows,
        submit="Yes, replace them",
        submit_count=sum(1 for r in rows if not r["skip"]),
        shown_digests=_sign_shown(request, "replace", digests),
    )


# --- accept the VM found (seed 001 identity) ---------------------------------------------------


@admin.action(permissions=["provision"], description="Accept the VM found (identity mismatch)…")
def accept_vm(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> TemplateResponse | None:
    """Take the VM that carries a proxy's name and mark but not its recorded identity (restored
    from a backup on purpose) as the proxy's own: its identity is recorded and the proxy is
    retried, which adopts it (confirmed first: the VM is then started and written to)."""
    if too_many(modeladmin, request, queryset):
        return None
    proxies = list(queryset)

    def skip_reason(proxy: Proxy) -> str:
        return "" if proxy.last_error_class == ErrorClass.IDENTITY else "shows no identity mismatch"

    if confirmed(request):
        done: list[str] = []
        skipped: list[str] = []
        for proxy in proxies:
            reason = skip_reason(proxy)
            if not reason:
                try:
                    operations.proxy_accept_vm(
                        proxy=proxy,
                        user=request.user,
                        via=ADMIN,
                        idempotency_key=door_key(request, "accept_vm", proxy),
                    )
                except ValidationError as err:
                    reason = _errors(err)
            if reason:
                skipped.append(f"{proxy.name} {reason}")
            else:
                done.append(proxy.name)
        if done:
            modeladmin.message_user(
                request,
                ngettext(
                    "Accepted the VM found for %(count)d proxy: %(names)s.",
                    "Accepted the VMs found for %(count)d proxies: %(names)s.",
                    len(done),
                )
                % {"count": len(done), "names": _names(done)},
                messages.SUCCESS,
            )
        _report_skipped(modeladmin, request, skipped)
        return None
    rows = [
        {
            "cells": [
                proxy.name,
                proxy.node,
                proxy.vmid or "",
                proxy.smbios_uuid or "(none recorded)",
                proxy.last_error,
            ],
            "skip": skip_reason(proxy),
        }
        for proxy in proxies
    ]
    return confirmation(
        modeladmin,
        request,
        proxies,
        action="accept_vm",
        title="Accept the VMs found as these proxies' own?",
        intro="Each VM below carries its proxy's name and mark but not the identity proxyhub "
        "recorded: it was restored from a backup or created again at the VMID. Accepting it "
        "records its SMBIOS UUID and vmgenid, and the proxy is provisioned again on it: started "
        "if stopped, its seed ISO attached. Accept only a VM you know to be the proxy's.",
        columns=["Proxy", "Node", "VMID", "Recorded SMBIOS UUID", "Mismatch"],
        rows=rows,
        submit="Yes, accept them",
        submit_count=sum(1 for r in rows if not r["skip"]),
    )


# --- delete ------------------------------------------------------------------------------------


def delete_rows(proxies: Sequence[Proxy]) -> list[dict[str, Any]]:
    """What a delete removes, proxy by proxy: the VM, its disks and its seed ISO (named for
    this installation and the proxy's uid; gone already when it was detached after boot)."""
    installation = installation_id()
    return [
        {
            "cells": [
                proxy.name,
                proxy.cluster.name,
                proxy.node or "",
                proxy.vmid or "",
                proxy.provider_id or "no VM recorded",
                seed_volid(
                    proxy.cluster.iso_storage,
                    seed_iso_name(proxy.vm_name, installation_id=installation, uid=str(proxy.uid)),
                ),
                display.phase_badge(proxy.phase),
            ],
            "skip": "",
        }
        for proxy in proxies
    ]


DELETE_COLUMNS = ["Proxy", "Cluster", "Node", "VMID", "Provider id", "Seed ISO", "Phase"]
DELETE_INTRO = (
    "Each VM below is stopped and destroyed with its disks, and its seed ISO is removed; the "
    "proxy disappears from this list once Proxmox confirms. A VM whose name or mark is not "
    "this proxy's is left alone."
)


def request_deletes(
    modeladmin: admin.ModelAdmin, request: HttpRequest, proxies: Sequence[Proxy]
) -> None:
    """Queue the delete of each proxy's VM, disks and seed ISO, and report it."""
    names = []
    for proxy in proxies:
        operations.proxy_request_delete(
            proxy=proxy,
            user=request.user,
            via=ADMIN,
            idempotency_key=door_key(request, "delete", proxy),
        )
        names.append(proxy.name)
    if names:
        modeladmin.message_user(
            request,
            ngettext(
                "Deleting %(count)d proxy with its VM, disks and seed ISO: %(names)s.",
                "Deleting %(count)d proxies with their VMs, disks and seed ISOs: %(names)s.",
                len(names),
            )
            % {"count": len(names), "names": _names(names)},
            messages.SUCCESS,
        )


@admin.action(permissions=["delete_vm"], description="Delete selected proxies and their VMs…")
def delete_vms(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> TemplateResponse | None:
    """Seed 000 entry 11 for each proxy, after a confirmation listing every VM and seed ISO."""
    if too_many(modeladmin, request, queryset):
        return None
    proxies = list(queryset)
    if confirmed(request):
        request_deletes(modeladmin, request, proxies)
        return None
    return confirmation(
        modeladmin,
        request,
        proxies,
        action="delete_vms",
        title="Delete these proxies and their VMs?",
        intro=DELETE_INTRO,
        columns=DELETE_COLUMNS,
        rows=delete_rows(proxies),
        submit="Yes, delete them",
        submit_count=len(proxies),
    )


# --- power (seed 001) --------------------------------------------------------------------------

_POWER_WORDS = {
    "start": ("Start", "start", "Starting"),
    "shutdown": ("Shut down", "graceful shutdown (60 s, never forced)", "Shutting down"),
    "reboot": ("Reboot", "reboot", "Rebooting"),
}


def _power_action(action: Action) -> Callable[..., TemplateResponse | None]:
    verb, what, doing = _POWER_WORDS[action]

    def power(
        modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
    ) -> TemplateResponse | None:
        if too_many(modeladmin, request, queryset):
            return None
        # Judged now, on the confirmation page and again on the confirm: a VM refused a moment
        # ago is not sent, and one refused since is caught before its operation is written.
        # The confirm is bound to the config digests the page showed (seed 001, issue 14).
        shown: dict[int, str] = {}
        if confirmed(request):
            try:
                shown = _shown(request, action)
            except ValidationError as err:
                modeladmin.message_user(
                    request, f"Nothing was sent: {_errors(err)}", messages.ERROR
                )
                return None
        targets = power_targets(queryset, action, shown)
        if confirmed(request):
            done: list[str] = []
            skipped: list[str] = []
            for target in targets:
                if not target.submits:
                    skipped.append(f"{target.proxy.name}: {target.skip}")
                    continue
                try:
                    operations.proxy_power(
                        proxy=target.proxy,
                        action=action,
                        user=request.user,
                        via=ADMIN,
                        idempotency_key=door_key(request, action, target.proxy),
                        expected_digest=shown.get(target.proxy.pk, ""),
                    )
                except ValidationError as err:
                    skipped.append(f"{target.proxy.name}: {_errors(err)}")
                    continue
                done.append(target.proxy.name)
            if done:
                modeladmin.message_user(
                    request,
                    ngettext(
                        "%(doing)s %(count)d proxy: %(names)s.",
                        "%(doing)s %(count)d proxies: %(names)s.",
                        len(done),
                    )
                    % {"doing": doing, "count": len(done), "names": _names(done)},
                    messages.SUCCESS,
                )
            _report_skipped(modeladmin, request, skipped)
            return None
        rows = [
            {
                "cells": [
                    t.proxy.name,
                    t.node,
                    t.vmid or "",
                    t.state or "unknown",
                    t.outcome,
                    _short_digest(t.preview.digest if t.preview else ""),
                ],
                "skip": t.skip,
                "note": bool(t.unknown or (t.preview and t.preview.noop)),
            }
            for t in targets
        ]
        return confirmation(
            modeladmin,
            request,
            [t.proxy for t in targets],
            action=action,
            title=f"{verb} these proxies?",
            intro=f"A {what} is sent to each VM below as a Proxmox task; its UPID is recorded "
            "in the operation. VMs Proxmox would refuse (templates, locked, hibernated or "
            "paused VMs, pending changes, hook scripts, HA-managed VMs) are shown struck "
            "through and are left alone.",
            columns=["Proxy", "Node", "VMID", "Current state", "What will happen", "Config digest"],
            rows=rows,
            submit=f"Yes, {verb.lower()}",
            submit_count=sum(1 for r in rows if not r["skip"]),
            destructive=action != "start",
            shown_digests=_sign_shown(request, action, inspection.shown_digests(targets)),
        )

    power.__name__ = action
    return admin.action(permissions=["power"], description=f"{verb} selected proxies…")(power)


start = _power_action("start")
shutdown = _power_action("shutdown")
reboot = _power_action("reboot")


# --- plan preview and preflight (seed 003) -----------------------------------------------------


@admin.action(permissions=["check"], description="Preview plan (no Proxmox call)")
def preview_plan(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> TemplateResponse:
    return plans.preview_page(modeladmin, request, queryset)


@admin.action(permissions=["check"], description="Preflight (read-only checks in Proxmox)")
def preflight(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Proxy]
) -> TemplateResponse:
    return plans.preflight_page(modeladmin, request, queryset)
