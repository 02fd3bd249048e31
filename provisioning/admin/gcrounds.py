"""GC rounds, read-only: what each round removed, what it held back over the per-round cap,
and why a cluster was not collected at all (an installation identity that disagrees with the
database, an unreachable cluster). Written only by GC."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from provisioning.models import GcRound

from .common import ReadOnlyAdmin


def _items(items: list[dict[str, Any]]) -> SafeString | str:
    if not items:
        return "none"
    return format_html(
        "<ul>{}</ul>",
        format_html_join(
            "",
            "<li>{} {} on {}/{} ({})</li>",
            (
                (
                    item.get("kind", ""),
                    item.get("name") if item.get("kind") == "vm" else item.get("volid"),
                    item.get("cluster", ""),
                    item.get("node", ""),
                    item.get("reason", ""),
                )
                for item in items
            ),
        ),
    )


@admin.register(GcRound)
class GcRoundAdmin(ReadOnlyAdmin):
    list_display = (
        "started_at",
        "dry_run",
        "requested_via",
        "removed_count",
        "held_back_count",
        "refused_short",
    )
    list_filter = ("dry_run", "requested_via")
    ordering = ("-started_at",)
    actions = None
    fields = (
        "started_at",
        "finished_at",
        "dry_run",
        "requested_via",
        "removed_list",
        "held_back_list",
        "refused_list",
    )
    readonly_fields = fields

    @admin.display(description="removed")
    def removed_count(self, obj: GcRound) -> int:
        return len(obj.removed)

    @admin.display(description="held back")
    def held_back_count(self, obj: GcRound) -> int:
        return len(obj.held_back)

    @admin.display(description="refused")
    def refused_short(self, obj: GcRound) -> str:
        return "; ".join(
            f"{r.get('cluster') or 'all'}: {r.get('reason', '')}"[:120] for r in obj.refused
        )

    @admin.display(description="removed")
    def removed_list(self, obj: GcRound) -> SafeString | str:
        return _items(obj.removed)

    @admin.display(
        description="held back for the next round (over PROXYHUB_GC_MAX_DELETES_PER_ROUND)"
    )
    def held_back_list(self, obj: GcRound) -> SafeString | str:
        return _items(obj.held_back)

    @admin.display(description="not collected")
    def refused_list(self, obj: GcRound) -> SafeString | str:
        if not obj.refused:
            return "none"
        return format_html("<pre>{}</pre>", json.dumps(obj.refused, indent=2))
