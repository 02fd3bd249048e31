"""Clusters: seed 000 entry 15's block with its nodes, templates and machine types inline.

Validation is the import's: the model's ``clean()`` applies ``ProxmoxConfig.problems`` to the
cluster's own fields, and the inline formsets (``forms.CatalogueFormSet``) apply the rules on
children (at least one, at most 128, unique keys, nothing a live proxy uses removed). The page
shows only the paths of the token and CA files, never what they hold.

The provider cache is keyed on ``Cluster.updated_at`` (``services.providers``), so saving a
child row through the inlines bumps it: the next step uses the edited catalogue.

The endpoint (url, token file, CA file, TLS verification) decides where the API token is sent,
so changing it needs ``provisioning.change_cluster_endpoint`` besides ``change_cluster``
(issue 11): without it those fields are read-only (a POSTed value is ignored) and no cluster can
be added. Saving a changed endpoint records the CA now in the CA file as the one trusted for the
url; the page shows its fingerprint, never the CA.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin, messages
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import ngettext

from provisioning.models import CircuitBreaker, Cluster, MachineType, Node, Proxy, Template
from provisioning.services.credentials import ca_fingerprint_now, cluster_trust_ca

from . import display, health, plans
from .common import CHANGE_ENDPOINT, CHECK, PROVISION, GuardedActionsMixin
from .forms import (
    TEMPLATE_FIELDS,
    ClusterForm,
    MachineTypeForm,
    MachineTypeFormSet,
    NodeFormSet,
    TemplateForm,
    TemplateFormSet,
)
from .maintenance import MAINTENANCE, maintenance_end_all, maintenance_start_page
from .template_build import template_build_page


class NodeInline(admin.TabularInline):
    model = Node
    formset = NodeFormSet
    fields = ("name", "position")
    extra = 0
    verbose_name_plural = "nodes (checked and placed in this order)"


class TemplateInline(admin.TabularInline):
    model = Template
    form = TemplateForm
    formset = TemplateFormSet
    fields = TEMPLATE_FIELDS
    extra = 0
    verbose_name_plural = "templates"


class MachineTypeInline(admin.TabularInline):
    model = MachineType
    form = MachineTypeForm
    formset = MachineTypeFormSet
    fields = ("key", "cores", "memory_mib", "disk_gib")
    extra = 0


def _count(model: type[Node] | type[Proxy], field: str = "cluster") -> Coalesce:
    rows = (
        model.objects.filter(**{field: OuterRef("pk")})
        .order_by()
        .values(field)
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))


# What decides where the API token is sent (issue 11).
ENDPOINT_FIELDS = ("url", "token_file", "ca_file", "insecure_skip_tls_verify")


@admin.register(Cluster)
class ClusterAdmin(GuardedActionsMixin):
    form = ClusterForm
    list_display = (
        "name",
        "url",
        "iso_storage",
        "vmid_range",
        "nodes_count",
        "proxies",
        "health_summary",
        "circuit_summary",
    )
    search_fields = ("name",)
    search_help_text = "Cluster name (part of it)"
    inlines = (NodeInline, TemplateInline, MachineTypeInline)
    actions = (
        "check_now",
        "preflight",
        "trust_ca",
        "build_template",
        "start_maintenance",
        "end_maintenance",
    )
    fieldsets = (
        (None, {"fields": ("name", "url")}),
        (
            "Credentials and TLS",
            {
                "fields": ("token_file", "ca_file", "insecure_skip_tls_verify", "ca_trust"),
                "description": "Paths only: the token and the CA stay in their files, which "
                "must be inside the credentials directory (PROXYHUB_CREDENTIALS_DIR). Changing "
                "these fields or the URL needs the “change cluster endpoint” permission.",
            },
        ),
        (
            "Placement",
            {
                "fields": (
                    "iso_storage",
                    "storage",
                    "bridge",
                    "vlan_tag",
                    "pool",
                    "vmid_min",
                    "vmid_max",
                )
            },
        ),
        (
            "Behaviour",
            {
                "fields": (
                    "request_timeout_seconds",
                    "install_guest_agent",
                    "drift_policy",
                    "vendor_data",
                    "clear_vendor_data",
                )
            },
        ),
        (
            "Quotas",
            {
                "fields": ("max_proxies", "max_concurrent_creates"),
                "description": "Blank is unlimited; 0 refuses every new proxy or create. A "
                "declaration over a limit is refused whole, naming the limit.",
            },
        ),
        ("Node health", {"fields": ("node_health",)}),
        (
            "Circuit breaker",
            {
                "fields": ("circuit_detail",),
                "description": "After repeated connection failures the cluster's steps are "
                "deferred without running, so an unreachable cluster holds no worker; one step "
                "probes it when the breaker's time is up.",
            },
        ),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )
    readonly_fields = ("ca_trust", "node_health", "circuit_detail", "created_at", "updated_at")

    def has_check_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CHECK)

    def has_provision_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PROVISION)

    def has_change_endpoint_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CHANGE_ENDPOINT)

    def has_maintenance_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(MAINTENANCE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A new cluster is a new endpoint.
        return super().has_add_permission(request) and self.has_change_endpoint_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Cluster | None = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        if not self.has_change_endpoint_permission(request):
            fields += ENDPOINT_FIELDS
        return fields

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        # Only someone allowed to change the endpoint has these fields in the form; a new or
        # changed endpoint trusts the CA as it is now (blank when none is there yet).
        if not change or set(form.changed_data) & set(ENDPOINT_FIELDS):
            obj.trust_ca(ca_fingerprint_now(ca_file=obj.ca_file))
        super().save_model(request, obj, form, change)

    @admin.display(description="CA fingerprint (SHA-256)")
    def ca_trust(self, obj: Cluster) -> str:
        if obj.ca_fingerprint:
            return obj.ca_fingerprint
        if obj.pk is None or not obj.ca_file:
            return "none (no CA file: the system's roots are used)" if obj.pk else "-"
        return "not recorded yet: the CA file is trusted as it is at the next save or preflight"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cluster]:
        qs = (
            super()
            .get_queryset(request)
            .select_related("circuit")
            .annotate(node_total=_count(Node), proxy_total=_count(Proxy))
        )
        if health.installed():
            node_health = apps.get_model("healthchecks", "NodeHealth")
            latest = node_health.objects.filter(latest=True)
            qs = qs.annotate(
                checked_total=_count_in(latest),
                ready_total=_count_in(latest.filter(ready=True)),
            )
        return qs

    @admin.display(description="circuit")
    def circuit_summary(self, obj: Cluster) -> SafeString | str:
        return display.circuit_badge(_breaker(obj))

    @admin.display(description="state")
    def circuit_detail(self, obj: Cluster) -> SafeString | str:
        return display.circuit_detail(_breaker(obj))

    @admin.display(description="VMIDs")
    def vmid_range(self, obj: Cluster) -> str:
        return f"{obj.vmid_min} to {obj.vmid_max}"

    @admin.display(description="nodes", ordering="node_total")
    def nodes_count(self, obj: Cluster) -> int:
        return getattr(obj, "node_total", 0)

    @admin.display(description="proxies", ordering="proxy_total")
    def proxies(self, obj: Cluster) -> int:
        return getattr(obj, "proxy_total", 0)

    @admin.display(description="health")
    def health_summary(self, obj: Cluster) -> SafeString | str:
        checked = getattr(obj, "checked_total", None)
        if checked is None:
            return ""
        if not checked:
            return "not checked yet"
        ready = obj.ready_total  # type: ignore[attr-defined]
        tone = "ok" if ready == checked else ("bad" if ready == 0 else "warn")
        return display.badge(f"{ready} of {checked} nodes ready", tone)

    @admin.display(description="latest check per node")
    def node_health(self, obj: Cluster) -> SafeString | str:
        if obj.pk is None:
            return "checked once the cluster is saved"
        rows = health.latest_for_cluster(obj)
        if rows is None:
            return "health checks are not installed"
        by_node = {row.node: row for row in rows}
        nodes = list(obj.nodes.order_by("position", "name").values_list("name", flat=True))
        if not by_node:
            return "not checked yet; use the “Check nodes now” action"
        now = timezone.now()
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    node,
                    display.badge("ready", "ok")
                    if by_node.get(node) and by_node[node].ready
                    else display.badge("not ready", "bad")
                    if by_node.get(node)
                    else display.badge("unchecked", "idle"),
                    by_node[node].reason if node in by_node else "",
                    by_node[node].message if node in by_node else "",
                    f"{display.age(by_node[node].checked_at, now)} ago" if node in by_node else "",
                )
                for node in nodes
            ),
        )
        return format_html(
            '<table class="ph-health"><thead><tr><th>node</th><th>ready</th><th>reason</th>'
            "<th>message</th><th>checked</th></tr></thead><tbody>{}</tbody></table>",
            body,
        )

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        # Children saved after the cluster row: move updated_at past them (module docstring).
        Cluster.objects.filter(pk=form.instance.pk).update(updated_at=timezone.now())

    # --- actions -------------------------------------------------------------------------------

    @admin.action(permissions=["check"], description="Check nodes now")
    def check_now(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        """Ask for a health round now instead of at the next Beat tick (seed 000 entry 16)."""
        clusters = list(queryset)
        if not health.request_check_round():
            self.message_user(
                request,
                "Node health checks are not available: the healthchecks app or its task is "
                "not installed.",
                messages.ERROR,
            )
            return
        for cluster in clusters:
            self.log_change(request, cluster, "Requested a node health check.")
        self.message_user(
            request,
            ngettext(
                "Requested a node health check covering %(count)d cluster; the results appear "
                "on its page within a minute.",
                "Requested a node health check covering %(count)d clusters; the results appear "
                "on their pages within a minute.",
                len(clusters),
            )
            % {"count": len(clusters)},
            messages.SUCCESS,
        )

    @admin.action(permissions=["change_endpoint"], description="Trust the current CA file")
    def trust_ca(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        """Record the CA now in each cluster's CA file as trusted for its url, after a rotation
        the transport refused (issue 11)."""
        trusted = 0
        for cluster in queryset:
            fingerprint = cluster_trust_ca(cluster=cluster)
            if fingerprint:
                trusted += 1
                self.log_change(request, cluster, f"Trusted the CA with SHA-256 {fingerprint}.")
            else:
                self.message_user(
                    request,
                    f"{cluster.name}: no CA to trust (no CA file, or it is missing or holds "
                    "no certificate).",
                    messages.WARNING,
                )
        if trusted:
            self.message_user(
                request,
                ngettext(
                    "Trusted the current CA file of %(count)d cluster.",
                    "Trusted the current CA files of %(count)d clusters.",
                    trusted,
                )
                % {"count": trusted},
                messages.SUCCESS,
            )

    @admin.action(permissions=["provision"], description="Build a template from a cloud image")
    def build_template(
        self, request: HttpRequest, queryset: QuerySet[Cluster]
    ) -> TemplateResponse | None:
        """Issue 14: the same build as ``manage.py templates build``, through the journal."""
        return template_build_page(self, request, queryset)

    @admin.action(permissions=["maintenance"], description="Start maintenance…")
    def start_maintenance(
        self, request: HttpRequest, queryset: QuerySet[Cluster]
    ) -> TemplateResponse | None:
        """Issue 14: proxyhub writes nothing to the cluster or the node until it is ended."""
        return maintenance_start_page(self, request, queryset)

    @admin.action(permissions=["maintenance"], description="End maintenance")
    def end_maintenance(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        maintenance_end_all(self, request, queryset)

    @admin.action(permissions=["check"], description="Preflight (read-only checks in Proxmox)")
    def preflight(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> TemplateResponse:
        return plans.cluster_preflight_page(self, request, queryset)


def _count_in(rows: QuerySet) -> Coalesce:
    counted = (
        rows.filter(cluster=OuterRef("pk"))
        .order_by()
        .values("cluster")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def _breaker(cluster: Cluster) -> CircuitBreaker | None:
    """The cluster's breaker, or None when it never failed (no row)."""
    try:
        return cluster.circuit
    except ObjectDoesNotExist:
        return None
