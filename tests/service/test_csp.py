"""The Content-Security-Policy (issue 11, django-csp): on every page, strict, and nothing in
proxyhub's own templates that it would refuse. The browser suite checks the rendered pages
(tests/e2e/test_admin_browser.py fails on any violation Chromium reports)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from pump import Pump, Sim, proxy_spec

from provisioning.services import operations

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@pytest.mark.parametrize(
    "path", ["/admin/login/", "/admin/", "/admin/provisioning/proxy/", "/healthz"]
)
def test_every_response_carries_a_strict_policy(path: str) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("csp", "csp@example.com", "x" * 16))
    response = client.get(path)
    policy = response.headers["Content-Security-Policy"]
    directives = dict(
        (part.split()[0], part.split()[1:]) for part in policy.split(";") if part.strip()
    )
    assert directives["default-src"] == ["'self'"]
    assert directives["script-src"] == ["'self'"] and directives["style-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"]
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_proxyhubs_templates_have_no_inline_script_or_style() -> None:
    """What the policy would refuse, caught before a browser sees it: a <script> without src,
    a <style> element, a style="" attribute or an on...="" handler."""
    found = []
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        for pattern in (r"<script(?![^>]*\bsrc=)[^>]*>", r"<style\b", r"\sstyle=", r"\son[a-z]+="):
            found += [f"{template.relative_to(TEMPLATES)}: {m}" for m in re.findall(pattern, text)]
    assert found == []


def test_no_admin_page_of_proxyhub_renders_inline_script_or_style(sim: Sim, pump: Pump) -> None:
    """Rendered, not just the templates: widgets and admin code add attributes too. Every list,
    add and change page of proxyhub's models, with a proxy and its operation present."""
    from django.contrib import admin

    pump.call(operations.proxy_create, spec=proxy_spec(sim, "csp"))
    pump.run()
    client = Client()
    client.force_login(User.objects.create_superuser("csp", "csp@example.com", "x" * 16))
    pages = []
    for model in admin.site._registry:
        app = model._meta.app_label
        if app not in ("provisioning", "healthchecks"):
            continue
        base = f"/admin/{app}/{model._meta.model_name}/"
        pages.append(base)
        pages.append(base + "add/")
        first = model.objects.order_by("pk").first()
        if first is not None:
            pages.append(f"{base}{first.pk}/change/")
    found = []
    for page in pages:
        response = client.get(page)
        if response.status_code != 200:
            continue  # an add page the model does not offer
        text = response.content.decode()
        for pattern in (r"<script(?![^>]*\bsrc=)[^>]*>", r"<style\b", r"\sstyle=", r"\son[a-z]+="):
            found += [f"{page}: {m}" for m in re.findall(pattern, text)]
    assert len(pages) > 10 and found == []
