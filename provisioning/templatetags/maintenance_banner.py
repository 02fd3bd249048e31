"""``{% maintenance_banner %}``: every admin page says which maintenance switches are on (issue 14).

An operator who opens any page while a cluster or node is paused sees it, with who paused it,
since when and why, before wondering why nothing moves. Only signed-in staff see it: the reason
is an operator's free text, not for the sign-in page.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html, format_html_join

from provisioning.services.maintenance import maintenance_windows

register = template.Library()


@register.simple_tag(takes_context=True)
def maintenance_banner(context: dict[str, Any]) -> str:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_staff", False):
        return ""
    windows = maintenance_windows()
    if not windows:
        return ""
    items = format_html_join(
        "",
        '<li class="warning">Maintenance is on for {}: proxyhub writes nothing there '
        "(operations wait, reconcile and GC start nothing). {} — turned on by {} at {} UTC.</li>",
        ((w.target, w.reason, w.started_by, f"{w.started_at:%Y-%m-%d %H:%M}") for w in windows),
    )
    return format_html('<ul class="messagelist maintenance-banner">{}</ul>', items)
