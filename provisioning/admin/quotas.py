"""Per-user quotas: a console user's own bulk-create limit (``services.quotas``).

Users without a row get ``PROXYHUB_MAX_BULK_CREATE``. Managing these rows needs the model's own
permissions (``add/change/delete_userquota``), which an operator group does not hold by default:
raising one's own limit is a privilege, not part of provisioning.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from provisioning.models import UserQuota
from provisioning.services.quotas import BULK_DEFAULT, BULK_SETTING


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    list_display = ("user", "max_bulk_create", "updated_at")
    list_select_related = ("user",)
    search_fields = ("user__username",)
    search_help_text = "User name (part of it)"
    autocomplete_fields = ("user",)
    readonly_fields = ("updated_at",)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        default = getattr(settings, BULK_SETTING, BULK_DEFAULT)
        extra = {
            "subtitle": f"Users without a row may declare {default} proxies in one bulk create "
            f"({BULK_SETTING}); commands always get that setting.",
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)
