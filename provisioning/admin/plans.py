"""Plan preview and preflight pages (seed 003), over ``provisioning.services.plans``.

The preview makes no Proxmox call. The preflight makes only GET requests, each run bounded by
its own deadline, and this page bounds the whole request on top: at most ``PREFLIGHT_MAX``
runs and ``PAGE_SECONDS`` in all; what is left over is listed as not checked. Neither writes
anything or opens an operation: seed 003's preview and preflight "do not save a definition,
enqueue a job or persist a plan".

A cluster's preflight checks what a first proxy on it would meet: every template on every node
(up to the same bounds), each through an unsaved proxy built in memory with the cluster's first
machine type, so the checks are exactly a proxy's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.template.response import TemplateResponse

from provisioning.models import Cluster, Proxy
from provisioning.proxmox.errors import ClassifiedError, classify
from provisioning.proxmox.preflight import PREFLIGHT_BUDGET
from provisioning.proxmox.preflight_checks import Check
from provisioning.services import plans

from . import display
from .common import page

PREVIEW_MAX = 50
PREFLIGHT_MAX = 12
PAGE_SECONDS = 30.0

STATUS_TONE = {"passed": "ok", "failed": "bad", "unknown": "warn"}


@dataclass
class PreviewRow:
    proxy: Proxy
    plan: dict[str, Any] | None = None
    error: str = ""


@dataclass
class PreflightRow:
    """One preflight run: a proxy, or a cluster's template on a node."""

    label: str
    plan_hash: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    error: str = ""
    skipped: bool = False


def _problem(err: BaseException) -> str:
    """A catalogue problem as the operator fixes it; anything else by its class only."""
    if isinstance(err, ValidationError):
        return "; ".join(err.messages)
    if isinstance(err, ClassifiedError):
        return str(err)
    return str(classify("preflight", err))


def preview_page(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Iterable[Proxy]
) -> TemplateResponse:
    proxies = list(queryset)
    rows: list[PreviewRow] = []
    for proxy in proxies[:PREVIEW_MAX]:
        try:
            rows.append(PreviewRow(proxy, plan=plans.plan_preview(proxy).as_dict()))
        except (ClassifiedError, ValidationError, ValueError) as err:
            rows.append(PreviewRow(proxy, error=_problem(err)))
    return page(
        modeladmin,
        request,
        "admin/provisioning/proxy/plan_preview.html",
        title="Plan preview",
        rows=rows,
        left_out=max(0, len(proxies) - PREVIEW_MAX),
    )


def _checks(checks: list[Check]) -> list[dict[str, Any]]:
    return [
        {
            "code": c.code,
            "status": c.status,
            "badge": display.badge(c.status, STATUS_TONE.get(c.status, "idle")),
            "message": c.message,
        }
        for c in checks
    ]


class _Budget:
    """The page's own bound over all its runs (module docstring)."""

    def __init__(self) -> None:
        self.ends = time.monotonic() + PAGE_SECONDS
        self.runs = 0

    def next_seconds(self) -> float | None:
        left = self.ends - time.monotonic()
        if self.runs >= PREFLIGHT_MAX or left < 1.0:
            return None
        self.runs += 1
        return min(PREFLIGHT_BUDGET, left)


def _run(label: str, proxy: Proxy, budget: _Budget) -> PreflightRow:
    seconds = budget.next_seconds()
    if seconds is None:
        return PreflightRow(label, skipped=True)
    try:
        report = plans.preflight_proxy(proxy, deadline_seconds=seconds)
    except Exception as err:  # catalogue problems, a provider that cannot be built
        return PreflightRow(label, error=_problem(err))
    return PreflightRow(
        label, plan_hash=report.plan_hash, checks=_checks(report.checks), counts=report.counts()
    )


def preflight_page(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Iterable[Proxy]
) -> TemplateResponse:
    budget = _Budget()
    rows = [_run(proxy.name, proxy, budget) for proxy in queryset]
    return _preflight_response(modeladmin, request, rows, "Preflight")


def cluster_preflight_page(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Iterable[Cluster]
) -> TemplateResponse:
    budget = _Budget()
    rows: list[PreflightRow] = []
    for cluster in queryset:
        nodes = list(cluster.nodes.order_by("position", "name").values_list("name", flat=True))
        images = list(cluster.templates.order_by("key").values_list("key", flat=True))
        machine = cluster.machine_types.order_by("key").values_list("key", flat=True).first()
        if not (nodes and images and machine):
            rows.append(
                PreflightRow(
                    cluster.name,
                    error="the cluster needs at least one node, template and machine type",
                )
            )
            continue
        for image in images:
            for node in nodes:
                probe = Proxy(
                    name="preflight",
                    cluster=cluster,
                    zone=node,
                    machine_type=machine,
                    image=image,
                )
                rows.append(_run(f"{cluster.name}: {image} on {node} ({machine})", probe, budget))
    return _preflight_response(modeladmin, request, rows, "Cluster preflight")


def _preflight_response(
    modeladmin: admin.ModelAdmin, request: HttpRequest, rows: list[PreflightRow], title: str
) -> TemplateResponse:
    return page(
        modeladmin,
        request,
        "admin/provisioning/preflight.html",
        title=title,
        rows=rows,
        skipped=sum(1 for r in rows if r.skipped),
        preflight_max=PREFLIGHT_MAX,
        page_seconds=int(PAGE_SECONDS),
    )
