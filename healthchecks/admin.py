"""Read-only admin for node health results (STYLE.md: result models are read-only entirely).

Results are written only by health rounds; the admin lists and filters them. The latest result
per node on the cluster page and the "no ready node" banner on the proxy list come from the
selectors in ``healthchecks.services``.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from provisioning.admin.common import ReadOnlyAdmin

from .models import NodeHealth

_SHOWN = [
    "cluster",
    "node",
    "ready",
    "reason",
    "message",
    "details_display",
    "duration_display",
    "checked_at",
    "latest",
]


@admin.register(NodeHealth)
class NodeHealthAdmin(ReadOnlyAdmin):
    list_display = ["cluster", "node", "ready", "reason", "checked_at", "duration_display"]
    list_filter = ["cluster", "reason", "ready", "latest"]
    list_select_related = ["cluster"]
    search_fields = ["node"]
    search_help_text = "Search by node name (as Proxmox names it, e.g. pve1)."
    # History grows by one row per node per minute; counting all of it on every page is waste.
    show_full_result_count = False
    fields = tuple(_SHOWN)
    readonly_fields = _SHOWN

    @admin.display(description="duration", ordering="duration")
    def duration_display(self, obj: NodeHealth) -> str:
        return f"{obj.duration:.2f} s"

    @admin.display(description="details")
    def details_display(self, obj: NodeHealth) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.details, indent=2, sort_keys=True))
