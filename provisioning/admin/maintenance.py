"""The maintenance switch in the console (issue 14): the cluster list's "Start maintenance…" (a
form: whole cluster or one node, and a reason) and "End maintenance", and a read-only list of
the switches that are on.

Both actions need the ``change_maintenance`` permission; each is recorded in the cluster's
history like the console's other actions. The switches themselves are turned on and off only
through ``services.maintenance`` (the same door as ``manage.py maintenance``), so ending one
resumes what waited.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from provisioning.models import Cluster, MaintenanceWindow, Node
from provisioning.models.choices import RequestedVia
from provisioning.models.maintenance import REASON_MAX
from provisioning.services.maintenance import (
    MaintenanceInputError,
    maintenance_end,
    maintenance_start,
)

from .action_form import action_form_page, only_one, posted
from .common import APP, ReadOnlyAdmin

MAINTENANCE = f"{APP}.change_maintenance"


class MaintenanceForm(forms.Form):
    node = forms.ChoiceField(required=False, help_text="blank: the whole cluster")
    reason = forms.CharField(
        max_length=REASON_MAX, help_text="shown on every page while maintenance is on"
    )

    def __init__(self, *args: Any, cluster: Cluster, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = Node.objects.filter(cluster=cluster).values_list("name", flat=True)
        node = self.fields["node"]
        assert isinstance(node, forms.ChoiceField)
        node.choices = [("", "the whole cluster"), *((n, n) for n in names)]


def maintenance_start_page(
    model_admin: admin.ModelAdmin[Cluster], request: HttpRequest, queryset: QuerySet[Cluster]
) -> TemplateResponse | None:
    cluster = only_one(model_admin, request, queryset)
    if cluster is None:
        return None
    form = MaintenanceForm(posted(request), cluster=cluster)
    if form.is_bound and form.is_valid():
        try:
            window = maintenance_start(
                cluster=cluster,
                node=form.cleaned_data["node"],
                reason=form.cleaned_data["reason"],
                user=request.user,
                via=RequestedVia.ADMIN,
            )
        except MaintenanceInputError as err:
            field = "node" if str(err).startswith("node ") else "reason"
            form.add_error(field, str(err))
        else:
            model_admin.log_change(
                request, cluster, f"Started maintenance on {window.target}: {window.reason}"
            )
            model_admin.message_user(
                request,
                f"Maintenance is on for {window.target}: proxyhub writes nothing there until "
                "it is ended.",
                messages.SUCCESS,
            )
            return None
    return action_form_page(
        model_admin,
        request,
        target=cluster,
        form=form,
        action="start_maintenance",
        title=f"Start maintenance on {cluster.name}",
        intro="While maintenance is on, proxyhub writes nothing to the cluster (or the node): "
        "operations wait and show why, reconcile and GC start nothing there. Ending it resumes "
        "what waited.",
        submit="Start maintenance",
    )


def maintenance_end_all(
    model_admin: admin.ModelAdmin[Cluster], request: HttpRequest, queryset: QuerySet[Cluster]
) -> None:
    """End every switch of the selected clusters (the cluster's own and its nodes')."""
    ended = 0
    for cluster in queryset:
        nodes = list(
            MaintenanceWindow.objects.filter(cluster=cluster).values_list("node", flat=True)
        )
        for node in nodes:
            if maintenance_end(cluster=cluster, node=node):
                ended += 1
                target = f"{cluster.name}/{node}" if node else cluster.name
                model_admin.log_change(request, cluster, f"Ended maintenance on {target}.")
    if not ended:
        model_admin.message_user(request, "No maintenance was on there.", messages.WARNING)
        return
    model_admin.message_user(
        request,
        ngettext(
            "Ended %(count)d maintenance switch; what waited resumes.",
            "Ended %(count)d maintenance switches; what waited resumes.",
            ended,
        )
        % {"count": ended},
        messages.SUCCESS,
    )


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(ReadOnlyAdmin):
    """What is on now; read-only (the cluster list's actions turn it on and off)."""

    list_display = ("cluster", "node", "reason", "started_by", "started_at")
    list_select_related = ("cluster",)
    list_filter = ("cluster",)
    search_fields = ("cluster__name", "node", "reason")
    search_help_text = "Cluster, node or reason (part of it)"
