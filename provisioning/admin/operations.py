"""The journal, read-only: every create, delete, replace and power action, who asked, and how
each step went (STYLE.md: "result and journal models are read-only entirely").

The change page lists the steps with their state, UPID, duration and message, the per-phase
durations an operator compares between runs, and a progress bar; while the operation runs a
small script in ``extrabody`` reloads the page every few seconds (see the template).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from provisioning.models import Operation
from provisioning.services import policy

from . import display
from .common import ReadOnlyAdmin

# The change page reloads itself this often while the operation has not ended.
REFRESH_SECONDS = 3


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = (
        "created",
        "kind",
        "proxy_link",
        "who",
        "state_badge",
        "queued",
        "took",
        "error_short",
    )
    list_display_links = ("created",)
    list_select_related = ("proxy", "cluster", "requested_by")
    list_filter = ("state", "kind", "requested_via", "cluster")
    search_fields = ("proxy_name",)
    search_help_text = "Proxy name (part of it) or the exact operation id"
    ordering = ("-created_at",)
    list_per_page = 100
    actions = None
    change_form_template = "admin/provisioning/operation/change_form.html"
    fieldsets = (
        (None, {"fields": ("kind", "proxy_link", "proxy_name", "cluster", "state_badge")}),
        ("Requested", {"fields": ("who", "reason", "idempotency_key")}),
        ("Timing", {"fields": ("created_at", "started_at", "finished_at", "took")}),
        (
            "Retries",
            {
                "fields": ("attempts", "faults", "next_attempt", "ceiling"),
                "description": "Faults are retried where they happen (a read again, a step "
                "again in the same delivery); a step that still fails waits a short backoff. "
                "Attempts counts failed deliveries in a row; at the ceiling the operation "
                "ends failed with its last error.",
            },
        ),
        ("Outcome", {"fields": ("last_error", "error_class")}),
    )
    readonly_fields = (
        "kind",
        "proxy_link",
        "proxy_name",
        "cluster",
        "state_badge",
        "who",
        "idempotency_key",
        "created_at",
        "started_at",
        "finished_at",
        "took",
        "reason",
        "attempts",
        "faults",
        "next_attempt",
        "ceiling",
        "last_error",
        "error_class",
    )

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        # The proxy change page links "all operations of this proxy" with this filter; the
        # proxy column is not a list filter (a dropdown over every proxy would be huge).
        if lookup in ("proxy__id__exact", "proxy"):
            return True
        return super().lookup_allowed(lookup, value, request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Operation], search_term: str
    ) -> tuple[QuerySet[Operation], bool]:
        """The proxy name by substring, or an operation id by value (only when the term is a
        UUID, so the database never compares ``id`` with arbitrary text)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(Q(pk=uuid.UUID(term)) | Q(proxy_name__icontains=term)), False
        except ValueError:
            return queryset.filter(proxy_name__icontains=term), False

    @admin.display(description="proxy", ordering="proxy_name")
    def proxy_link(self, obj: Operation) -> SafeString | str:
        if obj.proxy_id is None:
            return f"{obj.proxy_name} (gone)"
        url = reverse("admin:provisioning_proxy_change", args=[obj.proxy_id])
        return format_html('<a href="{}">{}</a>', url, obj.proxy_name)

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Operation) -> str:
        return timezone.localtime(obj.created_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="requested by")
    def who(self, obj: Operation) -> str:
        return display.requested_by(obj)

    @admin.display(description="queued")
    def queued(self, obj: Operation) -> str:
        if obj.started_at is None:
            return "" if obj.finished else "waiting for a worker"
        return display.seconds((obj.started_at - obj.created_at).total_seconds())

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Operation) -> SafeString:
        return display.operation_state_badge(obj)

    @admin.display(description="took")
    def took(self, obj: Operation) -> str:
        spent = display.elapsed(obj)
        if spent is None:
            return ""
        text = display.seconds(spent.total_seconds())
        return text if obj.finished else f"{text} so far"

    @admin.display(description="last error")
    def error_short(self, obj: Operation) -> SafeString | str:
        return display.short_error(obj.last_error)

    @admin.display(description="next attempt")
    def next_attempt(self, obj: Operation) -> str:
        """When the step runs next, shown while the operation is unfinished."""
        if obj.finished or obj.next_step_at is None:
            return ""
        when = timezone.localtime(obj.next_step_at).strftime("%Y-%m-%d %H:%M:%S")
        wait = (obj.next_step_at - timezone.now()).total_seconds()
        return f"{when} (in {display.seconds(wait)})" if wait > 0 else f"{when} (due)"

    @admin.display(description="ceiling")
    def ceiling(self, obj: Operation) -> str:
        limit = policy.ceiling_for(obj.kind)
        return (
            f"{limit.attempts} failed attempts in a row, or "
            f"{display.seconds(limit.age.total_seconds())} of age"
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        op = self.get_object(request, object_id)
        extra: dict[str, Any] = dict(extra_context or {})
        if op is not None:
            steps = list(op.steps.order_by("seq"))
            extra.update(
                steps=[
                    {
                        "step": step,
                        "badge": display.state_badge(step.state),
                        "duration": display.seconds(display.step_duration(step)),
                        "running": step.finished_at is None,
                    }
                    for step in steps
                ],
                phases=display.phase_durations(op, steps),
                progress=display.progress_percent(op, steps),
                operation_ended=op.finished,
                refresh_seconds=REFRESH_SECONDS,
                show_save=False,
            )
        return super().change_view(request, object_id, form_url, extra)
