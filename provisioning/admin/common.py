"""What every model admin of the console shares: permissions, refused actions, confirmations.

Django's admin silently drops an action the user may not run from the menu, and a POST naming
it directly gets "No action selected." and a redirect. The console answers such a POST with 403
instead (``GuardedActionsMixin``), so a refused request is unmistakable in logs and tests and
can never look like a success.

Confirmation pages follow ``django.contrib.admin.actions.delete_selected``: the action renders
a page listing the exact targets; the page posts the same action back with ``post=yes`` and
the selected primary keys, so the admin's own permission check runs again on the confirm.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

APP = "provisioning"
PROVISION = f"{APP}.provision_proxy"
DELETE_VM = f"{APP}.delete_proxy_vm"
POWER = f"{APP}.power_proxy"
CHECK = f"{APP}.check_proxy"
CHANGE_ENDPOINT = f"{APP}.change_cluster_endpoint"

# A confirmation page posts one hidden field per target, and Django refuses a request with more
# than DATA_UPLOAD_MAX_NUMBER_FIELDS (1000) fields; one action covers at most this many.
MAX_TARGETS = 500

CONFIRMATION_TEMPLATE = "admin/provisioning/action_confirmation.html"
# What a confirmation page's key looks like (secrets.token_urlsafe); anything else is ignored.
_PAGE_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")


class ReadOnlyAdmin(admin.ModelAdmin):
    """A list of records the system writes (the journal, GC rounds, the inventory, maintenance
    windows, node health checks): the console shows them and never adds, edits or deletes
    one (STYLE.md, Admin)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class GuardedActionsMixin(admin.ModelAdmin):
    """Refuses with 403 a POSTed action the user lacks the permission for (see module doc).

    ``refused_actions`` names actions that are never offered on this model (Django's
    ``delete_selected`` for proxies: dropping rows would leak VMs).
    """

    refused_actions: tuple[str, ...] = ()

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        for name in self.refused_actions:
            actions.pop(name, None)
        return actions

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and "action" in request.POST:
            names = set(request.POST.getlist("action"))
            # _get_base_actions is ModelAdmin's own list of every declared action (before the
            # permission filter); it is private, so django-stubs does not declare it.
            base = self._get_base_actions()  # type: ignore[attr-defined]
            known = {name for _, name, _ in base} | set(self.refused_actions)
            allowed = set(self.get_actions(request))
            if names & (known - allowed):
                raise PermissionDenied
        return super().changelist_view(request, extra_context)


def confirmed(request: HttpRequest) -> bool:
    """The operator pressed the confirmation page's button (``delete_selected``'s ``post``)."""
    return request.method == "POST" and request.POST.get("post") == "yes"


def door_key(request: HttpRequest, action: str, target: Model) -> str | None:
    """The idempotency key of ``action`` on ``target`` for this confirmation: the page's own
    key (a hidden field drawn when the page was rendered), the action and the target. A confirm
    posted twice gives the same keys, so the services hand back the operations of the first
    post instead of starting them again (a double-clicked Reboot reboots once)."""
    page_key = str(request.POST.get("idempotency_key", "")).strip()
    if (
        not page_key
        or len(page_key) > 64
        or not page_key.replace("-", "").replace("_", "").isalnum()
    ):
        return None
    return f"admin:{page_key}:{action}:{target.pk}"


def too_many(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> bool:
    """Refuse (with a message) an action over more targets than a confirmation can carry."""
    count = queryset.count()
    if count <= MAX_TARGETS:
        return False
    modeladmin.message_user(
        request,
        f"{count} proxies are selected; an action covers at most {MAX_TARGETS} at a time. "
        "Narrow the list with a filter or a search.",
        level="error",
    )
    return True


def confirmation(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: Iterable[Model],
    *,
    action: str,
    title: str,
    intro: str,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    submit: str,
    submit_count: int,
    template: str = CONFIRMATION_TEMPLATE,
    destructive: bool = True,
    **extra: Any,
) -> TemplateResponse:
    """A confirmation page: ``rows`` are ``{"cells": [...], "skip": reason}``; skipped rows are
    shown struck through with their reason and are not acted on. ``destructive`` paints the
    confirm button red, as Django's delete confirmation does."""
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "intro": intro,
        "columns": columns,
        "rows": rows,
        "any_skip": any(row.get("skip") for row in rows),
        "destructive": destructive,
        "submit": submit,
        "submit_count": submit_count,
        "targets": [obj.pk for obj in queryset],
        "action_name": action,
        "opts": opts,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "idempotency_key": secrets.token_urlsafe(16),
        "media": modeladmin.media,
        **extra,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, context)


def page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    template: str,
    *,
    title: str,
    **extra: Any,
) -> TemplateResponse:
    """A read-only result page (plan preview, preflight) in the admin's frame."""
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": modeladmin.model._meta,
        "media": modeladmin.media,
        **extra,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, context)


def require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied
