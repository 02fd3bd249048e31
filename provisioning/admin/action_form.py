"""The page of an action that asks for a few inputs about one selected object before it acts
(the cluster's "Build a template" and "Start maintenance…"): its form, posted back to the same
action with ``post=yes``, shown again with the refusals on their fields."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

TEMPLATE = "admin/provisioning/action_form.html"


def action_form_page(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    *,
    target: Model,
    form: forms.Form,
    action: str,
    title: str,
    intro: str,
    submit: str,
) -> TemplateResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "intro": intro,
        "form": form,
        "form_id": action.replace("_", "-"),
        "target": target,
        "action": action,
        "submit": submit,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, TEMPLATE, context)


def posted(request: HttpRequest) -> Any:
    """The form's data when the page itself was posted back; None on the action's first POST
    (the changelist's, which carries only the selection)."""
    return request.POST if request.POST.get("post") == "yes" else None


def only_one(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]
) -> Any:
    """The one object such a page is about, or None (and a message) for another selection."""
    chosen = list(queryset[:2])
    if len(chosen) != 1:
        name = model_admin.model._meta.verbose_name
        model_admin.message_user(request, f"Select exactly one {name}.", messages.ERROR)
        return None
    return chosen[0]
