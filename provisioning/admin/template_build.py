"""The cluster's "Build a template" action (issue 14): a form, then the build in the journal.

The page asks for what ``manage.py templates build`` takes; posted back, it starts the builds
through ``services.template_builds`` with no Proxmox call in the web request (the builds' first
step judges the node's storages and the VMID, before any download). A refused input is shown on
its field and nothing is written.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from provisioning.models import Cluster
from provisioning.models.choices import RequestedVia
from provisioning.proxmox.build_inputs import DISK_DEVICES, InputProblem
from provisioning.services.template_builds import BuildSpec, template_build_start

from .action_form import action_form_page, only_one, posted


class TemplateBuildForm(forms.Form):
    key = forms.CharField(max_length=63, help_text="the catalogue's image key")
    node = forms.CharField(max_length=63, help_text="the node that downloads and builds")
    image_url = forms.CharField(max_length=2048, label="Image URL", help_text="http(s)://…")
    checksum = forms.CharField(max_length=140, help_text="ALGORITHM:HEX, e.g. sha256:…")
    vmid = forms.IntegerField(label="VMID", min_value=100)
    storage = forms.CharField(max_length=64, help_text="storage for the disk (images)")
    template_version = forms.CharField(max_length=128)
    guest_user = forms.CharField(max_length=32, help_text="the image's default user, not root")
    bridge = forms.CharField(max_length=64, required=False)
    image_storage = forms.CharField(
        max_length=64, required=False, help_text="blank: a storage on the node that accepts it"
    )
    disk_device = forms.ChoiceField(choices=[(d, d) for d in DISK_DEVICES], initial="scsi0")
    disk_gib = forms.IntegerField(label="Disk GiB", initial=8, min_value=4, max_value=4096)
    all_nodes = forms.BooleanField(
        required=False, help_text="local storage: one copy per node at VMID, VMID+1, …"
    )


def template_build_page(
    model_admin: admin.ModelAdmin[Cluster], request: HttpRequest, queryset: QuerySet[Cluster]
) -> TemplateResponse | None:
    cluster = only_one(model_admin, request, queryset)
    if cluster is None:
        return None
    form = TemplateBuildForm(posted(request))
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        spec = BuildSpec(**{k: data[k] for k in data})
        try:
            ops = template_build_start(
                cluster=cluster, spec=spec, user=request.user, via=RequestedVia.ADMIN,
                preflight=False,
            )  # fmt: skip
        except InputProblem as err:
            field = err.field.replace("-", "_")
            message = str(err).split(": ", 1)[1]
            form.add_error(field if field in form.fields else None, message)
        else:
            model_admin.log_change(request, cluster, f"Started a template build of {spec.key}.")
            model_admin.message_user(
                request,
                ngettext(
                    "Started %(count)d template build of %(key)s; the journal shows it.",
                    "Started %(count)d template builds of %(key)s; the journal shows them.",
                    len(ops),
                )
                % {"count": len(ops), "key": spec.key},
                messages.SUCCESS,
            )
            return None
    return action_form_page(
        model_admin,
        request,
        target=cluster,
        form=form,
        action="build_template",
        title=f"Build a template on {cluster.name}",
        intro="The node downloads the image and checks its checksum; a VM is created with "
        "its disk imported, the agent on and a serial console, then converted to a template "
        "and registered in this cluster's catalogue.",
        submit="Build",
    )
