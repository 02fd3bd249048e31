"""App configs: the admin with proxyhub's console site, and this package as an app (its command)."""

from __future__ import annotations

from django.apps import AppConfig
from django.contrib.admin.apps import AdminConfig, SimpleAdminConfig


class ConsoleAdminConfig(AdminConfig):
    """``django.contrib.admin`` whose ``admin.site`` is the console site (login with a code).

    A Celery worker or Beat serves no page, so it does not import the console's admin modules
    (``load_console``): they and what only they import (forms, plan and inspection views, the
    changelist) cost each worker process about 2.5 MiB, counted again in every pool process
    (issue 12: the worker's memory). Should such a process ever load the URLconf, the URLconf
    loads the console first, so it is never served half registered.
    """

    default_site = "proxyhub.twofactor.site.ConsoleAdminSite"

    def ready(self) -> None:
        if _starting_celery_process():
            SimpleAdminConfig.ready(self)  # the admin's checks, without the autodiscovery
            return
        super().ready()
        load_console()


def load_console() -> None:
    """Register every app's ModelAdmins on the console site (idempotent: modules import once).

    Django's autodiscovery imports each app's ``admin`` module, django-otp's included; this
    package's own admin then replaces django-otp's device admin, so it must come after."""
    from django.contrib import admin

    admin.autodiscover()
    from . import admin as _console_admin  # noqa: F401


def _starting_celery_process() -> bool:
    """Whether Django is being set up by a starting Celery worker or Beat.

    Celery's loader marks itself ``worker_initialized`` before it imports the task modules, and
    that import is what sets Django up in both (its Django fix-up); no other process (web,
    ``manage.py``, tests, ``celery inspect``) starts a worker."""
    from proxyhub.celery import app

    return bool(app.loader.worker_initialized)


class TwoFactorConfig(AppConfig):
    """Holds ``manage.py totp_enrol``; no models (django-otp's TOTP plugin owns the table)."""

    name = "proxyhub.twofactor"
    label = "twofactor"
    verbose_name = "Two-factor sign-in"
