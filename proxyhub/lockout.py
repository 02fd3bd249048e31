"""The page a locked-out login gets (django-axes' ``AXES_LOCKOUT_CALLABLE``).

The console's own login page, its form replaced by what happened and for how long, answered
with 429. It names no username and says nothing of whether the last password was right.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    minutes = max(1, int(settings.AXES_COOLOFF_TIME.total_seconds() // 60))
    context = {**admin.site.each_context(request), "cooloff_minutes": minutes}
    return render(request, "admin/locked_out.html", context, status=429)
