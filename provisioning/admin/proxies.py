"""The proxy list and change page: where an operator runs the fleet.

Saving never writes a proxy row directly: a new proxy goes through ``proxy_create`` (its
``create`` operation is sent after commit), and a changed placement or cloud-init through
``proxy_update``, which replaces the VM. Deleting goes through the VM delete flow: Django's
``delete_selected`` is not offered, and the change page's delete button leads to the same
confirmation as the "Delete selected proxies and their VMs" action, since dropping the row
alone would leak the VM.
"""

from __future__ import annotations

import contextlib
import ipaddress
import uuid
from collections.abc import Sequence
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from provisioning.models import Operation, Proxy
from provisioning.models.choices import RequestedVia
from provisioning.services import operations
from provisioning.services.quotas import QuotaExceeded

from . import actions, changelist, display, views
from .common import (
    CHECK,
    DELETE_VM,
    POWER,
    PROVISION,
    GuardedActionsMixin,
    confirmation,
    confirmed,
)
from .forms import ProxyForm, catalogue_suggestions

# The change page lists this many of the proxy's operations, newest first, and links the rest.
OPERATIONS_SHOWN = 20


# The change page's "Observed" section: what Proxmox was last seen to hold.
OBSERVED = (
    "phase_badge",
    "desired_state",
    "desired_power",
    "provider_id",
    "vmid_shown",
    "node",
    "address",
    "console_link",
    "vm_created",
    "smbios_uuid",
    "vmgenid",
    "observed_at",
    "last_error",
    "last_error_class",
)
# Issue 14: what the VM was built with, and what differs from it at the last config read.
DRIFT = ("drift_table", "vm_spec_shown", "drift_checked_at")


# The request attribute that carries a quota refusal from the save back to the form.
_REFUSAL = "_proxyhub_quota_refusal"


@admin.register(Proxy)
class ProxyAdmin(GuardedActionsMixin):
    form = ProxyForm
    list_display = (
        "name",
        "cluster",
        "node",
        "vmid",
        "phase_badge",
        "ip",
        "error_short",
        "drift_short",
        "age",
    )
    list_select_related = ("cluster",)
    # Filters whose choices cost no scan of the proxy table (changelist.py says why).
    list_filter = (
        "phase",
        "last_error_class",
        ("cluster", changelist.ClusterFilter),
        ("node", changelist.CatalogueValuesFilter),
        ("machine_type", changelist.CatalogueValuesFilter),
        ("image", changelist.CatalogueValuesFilter),
        changelist.DriftFilter,
    )
    search_fields = ("name",)
    search_help_text = (
        "Name (part of it), or exactly a UID, a VMID, or an address (or its start, like 10.0.3.)"
    )
    autocomplete_fields = ("cluster",)
    ordering = ("name",)
    list_per_page = 100
    # A filtered list is counted once (the paginator's count), not a second time for the total
    # of the whole table beside it: at 100,000 proxies each count is a full scan.
    show_full_result_count = False
    # The unfiltered count of a big table is PostgreSQL's estimate, shown as one.
    paginator = changelist.EstimatedCountPaginator
    refused_actions = ("delete_selected",)
    actions = (
        actions.provision,
        actions.replace,
        actions.accept_vm,
        actions.start,
        actions.shutdown,
        actions.reboot,
        actions.delete_vms,
        actions.preview_plan,
        actions.preflight,
    )

    add_fieldsets = (
        (None, {"fields": ("name", "cluster")}),
        ("Placement", {"fields": ("zone", "machine_type", "image")}),
        ("Cloud-init", {"fields": ("cloud_init_file", "cloud_init_text")}),
    )
    change_fieldsets = (
        ("Spec", {"fields": ("name", "uid_shown", "cluster", "zone", "machine_type", "image")}),
        (
            "Cloud-init",
            {
                "fields": ("cloud_init_summary", "cloud_init_file", "cloud_init_text"),
                "description": "Uploading or pasting new cloud-init replaces the VM.",
            },
        ),
        ("Observed", {"fields": OBSERVED}),
        (
            "Drift",
            {
                "fields": DRIFT,
                "description": "The VM's cores, memory and net0 against what it was built "
                "with; the cluster's drift policy says whether reconcile repairs them.",
            },
        ),
        ("Operations", {"fields": ("operations_list",)}),
    )
    # Shown, never edited: what proxyhub and Proxmox report, and the proxy's identity.
    observed_fields = ("uid_shown", "cloud_init_summary", *OBSERVED, *DRIFT, "operations_list")

    # --- permissions: the custom ones of Proxy's Meta -----------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PROVISION)

    def has_change_permission(self, request: HttpRequest, obj: Proxy | None = None) -> bool:
        # A change replaces the VM: it is provisioning.
        return request.user.has_perm(PROVISION)

    def has_delete_permission(self, request: HttpRequest, obj: Proxy | None = None) -> bool:
        return request.user.has_perm(DELETE_VM)

    def has_provision_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PROVISION)

    def has_delete_vm_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(DELETE_VM)

    def has_power_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(POWER)

    def has_check_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CHECK)

    # --- the list ------------------------------------------------------------------------------

    def action_checkbox(self, obj: Proxy) -> SafeString:
        """Django's row checkbox, the same markup written directly: Django renders it through
        the form renderer's template, a quarter of the list's render time at 100 rows."""
        return changelist.action_checkbox(obj)

    @admin.display(description="phase", ordering="phase")
    def phase_badge(self, obj: Proxy) -> SafeString:
        return display.phase_badge(obj.phase)

    @admin.display(description="last error")
    def error_short(self, obj: Proxy) -> SafeString | str:
        return display.short_error(obj.last_error)

    @admin.display(description="drift")
    def drift_short(self, obj: Proxy) -> str:
        return display.drift_line(obj.drift)

    @admin.display(description="what differs")
    def drift_table(self, obj: Proxy) -> SafeString | str:
        return display.drift_table(obj.drift)

    @admin.display(description="built with")
    def vm_spec_shown(self, obj: Proxy) -> str:
        return display.vm_spec_line(obj.vm_spec)

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Proxy) -> str:
        return display.age(obj.created_at)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Proxy], search_term: str
    ) -> tuple[QuerySet[Proxy], bool]:
        """Name by substring; UID, VMID and address by value. A term that is not a valid UUID,
        number or address is not compared with those columns, so PostgreSQL never sees
        ``uid = 'web'``."""
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(name__icontains=term)
        with contextlib.suppress(ValueError):
            match |= Q(uid=uuid.UUID(term))
        if term.isdigit() and len(term) <= 9:
            match |= Q(vmid=int(term))
        if _looks_like_address(term):
            try:
                match |= Q(ip=str(ipaddress.ip_address(term)))
            except ValueError:
                match |= Q(ip__startswith=term)
        return queryset.filter(match), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # One query over the clusters answers both banners and the cluster filter.
        banners = changelist.banners(request)
        extra = {
            "clusters_without_ready_node": banners.without_ready_node,
            "clusters_unreachable": banners.unreachable,
            "can_bulk_create": self.has_add_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    # --- the change page -----------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Proxy | None = None) -> Any:
        if obj is None:
            return self.add_fieldsets
        if not self.has_change_permission(request, obj):
            # Viewers see the same page without the upload fields.
            return [
                (title, {**opts, "fields": _without_upload(opts["fields"])})
                for title, opts in self.change_fieldsets
            ]
        return self.change_fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Proxy | None = None) -> Any:
        if obj is None:
            return ()
        return ("name", "cluster", *self.observed_fields)

    def get_form(
        self, request: HttpRequest, obj: Proxy | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is not None:
            # A proxy keeps its name and cluster (its VM name and UID hang on them); the rest of
            # its spec is editable, and the form's fields must not list read-only ones.
            kwargs["fields"] = ["zone", "machine_type", "image"]
        form = super().get_form(request, obj, change, **kwargs)
        refusal = getattr(request, _REFUSAL, None)
        if refusal is not None:
            form = type(form.__name__, (form,), {"refusal": refusal})
        return form

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The form checks the cluster's quotas, then the service checks them again under the
        cluster's lock at the save. A declaration committed between the two is refused there,
        and the whole save rolled back; the operator gets the form back with the limit named
        (the view run again with the refusal as the form's error), not an error page."""
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except QuotaExceeded as refusal:
            setattr(request, _REFUSAL, refusal)
            return super().changeform_view(request, object_id, form_url, extra_context)

    @admin.display(description="UID")
    def uid_shown(self, obj: Proxy) -> str:
        return str(obj.uid)

    @admin.display(description="VMID")
    def vmid_shown(self, obj: Proxy) -> str:
        return str(obj.vmid) if obj.vmid is not None else "none yet"

    @admin.display(description="address")
    def address(self, obj: Proxy) -> str:
        return obj.ip or "none yet"

    @admin.display(description="VM created at")
    def vm_created(self, obj: Proxy) -> str:
        if obj.vm_created_at is None:
            return ""
        return timezone.localtime(obj.vm_created_at).strftime("%Y-%m-%d %H:%M:%S %Z")

    @admin.display(description="cloud-init")
    def cloud_init_summary(self, obj: Proxy) -> str:
        if not obj.cloud_init_bytes:
            return "none"
        return f"{obj.cloud_init_bytes} bytes, HMAC-SHA256 {obj.cloud_init_sha256}"

    @admin.display(description="Proxmox console")
    def console_link(self, obj: Proxy) -> SafeString | str:
        url = display.console_url(obj)
        if not url:
            return "no VM yet"
        return format_html(
            '<a href="{}" target="_blank" rel="noopener noreferrer">{}</a>',
            url,
            f"open the console of VM {obj.vmid} on {obj.node}",
        )

    @admin.display(description="operations (newest first)")
    def operations_list(self, obj: Proxy) -> SafeString | str:
        ops = list(
            Operation.objects.filter(proxy=obj)
            .select_related("requested_by")
            .order_by("-created_at")[: OPERATIONS_SHOWN + 1]
        )
        if not ops:
            return "none"
        rows = format_html_join(
            "",
            "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    reverse("admin:provisioning_operation_change", args=[op.pk]),
                    op.kind,
                    display.operation_state_badge(op),
                    op.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    display.requested_by(op),
                    display.short_error(op.last_error),
                )
                for op in ops[:OPERATIONS_SHOWN]
            ),
        )
        more = ""
        if len(ops) > OPERATIONS_SHOWN:
            url = reverse("admin:provisioning_operation_changelist") + f"?proxy__id__exact={obj.pk}"
            more = format_html('<p><a href="{}">all operations of {}</a></p>', url, obj.name)
        return format_html(
            '<table class="ph-ops"><thead><tr><th>kind</th><th>state</th><th>created</th>'
            "<th>requested by</th><th>error</th></tr></thead><tbody>{}</tbody></table>{}",
            rows,
            more,
        )

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"suggestions": catalogue_suggestions(), **(extra_context or {})}
        return super().add_view(request, form_url, extra)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        proxy = self.get_object(request, unquote(object_id))
        extra = dict(extra_context or {})
        if proxy is not None:
            extra["suggestions"] = catalogue_suggestions()
            extra["console_url"] = display.console_url(proxy)
            extra["proxy_actions"] = [
                (name, actions.SHORT_LABELS.get(name, name)) for name in self.get_actions(request)
            ]
        return super().change_view(request, object_id, form_url, extra)

    def save_model(self, request: HttpRequest, obj: Proxy, form: ProxyForm, change: bool) -> None:
        """Through the services, never a bare save (see the module docstring)."""
        cloud_init = form.cloud_init_bytes
        if not change:
            spec = operations.ProxySpec(
                name=obj.name,
                cluster=obj.cluster,
                machine_type=obj.machine_type,
                image=obj.image,
                zone=obj.zone,
                cloud_init=cloud_init or b"",
            )
            op = operations.proxy_create(spec=spec, user=request.user, via=RequestedVia.ADMIN)
            assert op.proxy is not None
            obj.pk = op.proxy.pk
            obj.uid = op.proxy.uid
            return
        replacing = operations.proxy_update(
            proxy=obj,
            zone=obj.zone,
            machine_type=obj.machine_type,
            image=obj.image,
            cloud_init=cloud_init,
            user=request.user,
            via=RequestedVia.ADMIN,
        )
        if replacing is not None:
            self.message_user(
                request,
                f"The spec of {obj.name} changed: its VM is being replaced.",
                messages.WARNING,
            )

    # --- delete: the VM flow -------------------------------------------------------------------

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The change page's delete button: the same confirmation as the action, then a
        journalled delete of the VM, its disks and its seed ISO."""
        proxy = self.get_object(request, unquote(object_id))
        if proxy is None:
            # The admin's own "does not exist" redirect, as change_view uses it; it is private,
            # so django-stubs does not declare it.
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.opts, object_id
            )
        if not self.has_delete_permission(request, proxy):
            raise PermissionDenied
        if confirmed(request):
            actions.request_deletes(self, request, [proxy])
            return HttpResponseRedirect(reverse("admin:provisioning_proxy_changelist"))
        return confirmation(
            self,
            request,
            [proxy],
            action="",
            title=f"Delete {proxy.name} and its VM?",
            intro=actions.DELETE_INTRO,
            columns=actions.DELETE_COLUMNS,
            rows=actions.delete_rows([proxy]),
            submit="Yes, delete it",
            submit_count=1,
        )

    def delete_model(self, request: HttpRequest, obj: Proxy) -> None:
        operations.proxy_request_delete(proxy=obj, user=request.user, via=RequestedVia.ADMIN)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Proxy]) -> None:
        for proxy in queryset:
            self.delete_model(request, proxy)

    # --- the bulk-create page ------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "bulk-create/",
                self.admin_site.admin_view(views.BulkCreateView.as_view(model_admin=self)),
                name="provisioning_proxy_bulk_create",
            ),
            path(
                "bulk-create/confirm/",
                self.admin_site.admin_view(views.BulkConfirmView.as_view(model_admin=self)),
                name="provisioning_proxy_bulk_confirm",
            ),
        ]
        return own + super().get_urls()


def _without_upload(fields: Sequence[str]) -> tuple[str, ...]:
    return tuple(f for f in fields if f not in ("cloud_init_file", "cloud_init_text"))


def _looks_like_address(term: str) -> bool:
    allowed = set("0123456789abcdefABCDEF.:")
    return ("." in term or ":" in term) and all(c in allowed for c in term)
