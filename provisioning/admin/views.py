"""The bulk-create page: count, prefix, placement and cloud-init; the names before the write.

Two steps, two URLs. ``bulk-create/`` shows the form (GET) and, on POST, the preview: the exact
names it will create, the placement and the cloud-init's size and keyed digest, and the plan
set's hash (issue 14). Nothing is written there. ``bulk-create/confirm/`` is the only
state-changing URL: POST only (405 to GET), CSRF protected by ``admin_view``, and it writes
every proxy through ``plan_confirmation.commit`` in one transaction, each with its ``create``
operation sent after commit, only when the plan is still the one shown (the hash and the signed
shown plan ride along as hidden fields); otherwise it refuses naming what changed and writes
nothing.

The preview carries the cloud-init to the confirm as a token (``provisioning.sealed_tokens``):
encrypted under a key derived for this purpose only, signed with the requesting user's id and
refused after ``PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS``. The page never holds the content, a
client cannot swap it for other bytes, and another user or a late replay gets nothing.
"""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.utils.translation import ngettext
from django.views import View
from django.views.decorators.http import require_POST

from provisioning import sealed_tokens, sealing
from provisioning.models import Proxy
from provisioning.models.choices import RequestedVia
from provisioning.proxmox.errors import ClassifiedError
from provisioning.services import operations, plan_confirmation, quotas
from provisioning.services.operations import numbered_names

from .common import PROVISION
from .forms import BulkConfirmForm, BulkCreateForm, catalogue_suggestions

TEMPLATE = "admin/provisioning/proxy/bulk_create.html"
# The token's purpose: a token made for anything else never opens here, nor this one there.
BULK_PURPOSE = "bulk-create-cloud-init"
# The preview lists every name up to this many, then the first and last few.
NAMES_SHOWN = 60


class _BulkView(View):
    model_admin: admin.ModelAdmin | None = None

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.has_perm(PROVISION):
            raise PermissionDenied
        return super().dispatch(request, *args, **kwargs)

    def render(self, request: HttpRequest, **context: Any) -> TemplateResponse:
        assert self.model_admin is not None
        site = self.model_admin.admin_site
        request.current_app = site.name
        return TemplateResponse(
            request,
            TEMPLATE,
            {
                **site.each_context(request),
                "opts": Proxy._meta,
                "title": "Create proxies in bulk",
                "subtitle": None,
                "confirm_url": reverse("admin:provisioning_proxy_bulk_confirm"),
                "suggestions": catalogue_suggestions(),
                **context,
            },
        )


class BulkCreateView(_BulkView):
    http_method_names = ["get", "post"]

    def get(self, request: HttpRequest) -> HttpResponse:
        return self.render(request, form=BulkCreateForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        """The preview: validate, list the names, write nothing."""
        form = BulkCreateForm(request.POST, request.FILES)
        if not form.is_valid():
            return self.render(request, form=form)
        names = form.names()
        taken = sorted(Proxy.objects.filter(name__in=names).values_list("name", flat=True))
        if taken:
            form.add_error("prefix", f"proxies already exist: {_shown(taken)}")
            return self.render(request, form=form)
        data = form.cleaned_data
        # The quotas, at the preview already; the confirm checks them again under lock.
        try:
            quotas.bulk_create_admit(user=request.user, count=len(names))
        except ValidationError as err:
            form.add_error("count", err)
            return self.render(request, form=form)
        problems = quotas.cluster_quota_problems(
            cluster=data["cluster"], proxies=len(names), creates=len(names)
        )
        if problems:
            for problem in problems:
                form.add_error("cluster", problem)
            return self.render(request, form=form)
        cloud_init = form.cloud_init_bytes
        try:
            plan_set = plan_confirmation.plan_set_for(_specs(names, data, cloud_init))
        except (ClassifiedError, ValueError) as err:
            form.add_error(None, f"the plan cannot be made: {err}")
            return self.render(request, form=form)
        confirm = BulkConfirmForm(
            initial={
                "count": data["count"],
                "prefix": data["prefix"],
                "cluster": data["cluster"].pk,
                "machine_type": data["machine_type"],
                "image": data["image"],
                "zone": data["zone"],
                "cloud_init_token": sealed_tokens.token_dumps(
                    cloud_init, purpose=BULK_PURPOSE, user_id=_user_id(request)
                ),
                "plan_hash": plan_set.plan_hash,
                "plan_shown": plan_confirmation.sign_shown(
                    plan_set.document, user_id=_user_id(request)
                ),
            }
        )
        return self.render(
            request,
            form=None,
            first_plan=plan_set.plans[0][1].as_dict(),
            plan_hash=plan_set.plan_hash,
            plan_nodes=plan_set.nodes(),
            confirm=confirm,
            names=names if len(names) <= NAMES_SHOWN else None,
            names_head=names[:5],
            names_tail=names[-5:],
            count=len(names),
            placement=data,
            cloud_init_size=len(cloud_init),
            cloud_init_sha256=sealing.digest(cloud_init) if cloud_init else "",
        )


@method_decorator(require_POST, name="dispatch")
class BulkConfirmView(_BulkView):
    http_method_names = ["post"]

    def post(self, request: HttpRequest) -> HttpResponse:
        back = reverse("admin:provisioning_proxy_bulk_create")
        form = BulkConfirmForm(request.POST)
        if not form.is_valid():
            messages.error(request, "The confirmation was incomplete; fill in the form again.")
            return HttpResponseRedirect(back)
        data = form.cleaned_data
        try:
            cloud_init = sealed_tokens.token_loads(
                data["cloud_init_token"],
                purpose=BULK_PURPOSE,
                user_id=_user_id(request),
                max_age=settings.PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS,
            )
        except sealed_tokens.TokenRefused as err:
            messages.error(
                request,
                f"Nothing was created: the confirmation cannot be used ({err}); "
                "fill in the form and upload the cloud-init again.",
            )
            return HttpResponseRedirect(back)
        names = numbered_names(data["prefix"], data["count"])
        try:
            shown = plan_confirmation.load_shown(data["plan_shown"], user_id=_user_id(request))
            plan_confirmation.commit(
                _specs(names, data, cloud_init),
                plan_hash=data["plan_hash"],
                shown=shown,
                user=request.user,
                via=RequestedVia.ADMIN,
            )
        except (ClassifiedError, ValueError) as err:
            messages.error(request, f"Nothing was created: the plan cannot be made: {err}")
            return HttpResponseRedirect(back)
        except ValidationError as err:
            messages.error(request, "Nothing was created: " + "; ".join(err.messages))
            return HttpResponseRedirect(back)
        messages.success(
            request,
            ngettext(
                "Creating %(count)d proxy: %(names)s.",
                "Creating %(count)d proxies: %(names)s.",
                len(names),
            )
            % {"count": len(names), "names": _shown(names)},
        )
        return HttpResponseRedirect(reverse("admin:provisioning_proxy_changelist"))


def _specs(names: list[str], data: dict[str, Any], cloud_init: bytes) -> list[operations.ProxySpec]:
    return [
        operations.ProxySpec(
            name=name,
            cluster=data["cluster"],
            machine_type=data["machine_type"],
            image=data["image"],
            zone=data["zone"] or "",
            cloud_init=cloud_init,
        )
        for name in names
    ]


def _shown(names: list[str], shown: int = 10) -> str:
    rest = len(names) - shown
    text = ", ".join(names[:shown])
    return f"{text} and {rest} more" if rest > 0 else text


def _user_id(request: HttpRequest) -> int:
    """The signed-in user's id; ``_BulkView.dispatch`` has let only users with a permission in."""
    return cast(int, request.user.pk)
