"""URLs: the admin console, probes and metrics (DESIGN §7)."""

from django.contrib import admin
from django.urls import path

from . import views
from .twofactor.apps import load_console

# A Celery process sets Django up without the console (ConsoleAdminConfig); one that loads the
# URLconf gets the whole console first. Elsewhere the admin's ready() has already loaded it.
load_console()

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics_view, name="metrics"),
]
