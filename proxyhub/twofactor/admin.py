"""Authenticators in the admin, for administrators: who enrolled, when, and removal.

Replaces django-otp's own TOTP device admin, which can show a device's key and QR code to
anyone allowed to change devices and lets one user set another's key: here a device is never
added or edited, and its key is never shown (an owner enrols at /admin/two-factor/, an operator
with ``manage.py totp_enrol``). Deleting a device (a lost phone) needs ``delete_totpdevice``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django_otp.plugins.otp_totp.models import TOTPDevice

if admin.site.is_registered(TOTPDevice):
    admin.site.unregister(TOTPDevice)


@admin.register(TOTPDevice)
class AuthenticatorAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "confirmed", "created_at", "last_used_at"]
    list_filter = ["confirmed"]
    list_select_related = ["user"]
    search_fields = ["user__username"]
    search_help_text = "Search by username"
    fields = ("user", "name", "confirmed", "created_at", "last_used_at")
    readonly_fields = ("user", "name", "confirmed", "created_at", "last_used_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
