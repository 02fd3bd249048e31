"""The inventory, read-only: every guest of each cluster as its last refresh listed it, with
the refresh time, count and last failure of each cluster above the list (issue 14). Written only
by ``services.inventory``; nothing here calls Proxmox."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from provisioning.models import Cluster, InventoryGuest, InventoryRefresh
from provisioning.services.inventory import inventory_limit

from .common import ReadOnlyAdmin


@admin.register(InventoryGuest)
class InventoryGuestAdmin(ReadOnlyAdmin):
    list_display = (
        "vmid",
        "name",
        "cluster",
        "node",
        "type",
        "status",
        "owner",
        "template",
        "lock",
        "hastate",
        "pool",
        "tags",
        "refreshed_at",
    )
    list_display_links = None
    list_filter = ("cluster", "node", "type", "status", "owner", "template")
    list_select_related = ("cluster",)
    list_per_page = 100
    list_max_show_all = 100  # the snapshot may hold 4,096 rows per cluster: pages only
    search_fields = ("name", "=vmid", "tags")
    search_help_text = "Search by name, exact VMID or tag."
    ordering = ("cluster__name", "vmid")
    actions = None
    show_full_result_count = False

    def get_search_fields(self, request: HttpRequest) -> Any:
        # A VMID is a number: a word would make the exact VMID lookup fail, so a search that is
        # not a number looks at names and tags only.
        term = request.GET.get("q", "").strip()
        if term and not term.isdigit():
            return ("name", "tags")
        return self.search_fields

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        records = {r.cluster_id: r for r in InventoryRefresh.objects.all()}
        rows = []
        for cluster in Cluster.objects.order_by("name").only("pk", "name"):
            record = records.get(cluster.pk)
            rows.append(
                {
                    "cluster": cluster.name,
                    "refreshed_at": record.refreshed_at if record else None,
                    "attempted_at": record.attempted_at if record else None,
                    "count": record.count if record else 0,
                    "listed": record.listed if record else 0,
                    "truncated": record.truncated if record else False,
                    "error": record.error if record else "",
                }
            )
        context = {"inventory_refreshes": rows, "inventory_limit": inventory_limit()}
        context.update(extra_context or {})
        return super().changelist_view(request, extra_context=context)
