"""App configs: the admin with proxyhub's console site, and this package as an app (its command)."""

from __future__ import annotations

from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig


class ConsoleAdminConfig(AdminConfig):
    """``django.contrib.admin`` whose ``admin.site`` is the console site (login with a code)."""

    default_site = "proxyhub.twofactor.site.ConsoleAdminSite"

    def ready(self) -> None:
        super().ready()  # autodiscover: every app's admin module, django-otp's included
        from . import admin  # noqa: F401  (replaces django-otp's device admin)


class TwoFactorConfig(AppConfig):
    """Holds ``manage.py totp_enrol``; no models (django-otp's TOTP plugin owns the table)."""

    name = "proxyhub.twofactor"
    label = "twofactor"
    verbose_name = "Two-factor sign-in"
