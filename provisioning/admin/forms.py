"""Forms of the admin console: a proxy's spec, the bulk-create page and the catalogue inlines.

Cloud-init is accepted as an upload or pasted text and is never rendered back: the paste
widget drops its value when a form is shown again, the model keeps only a sealed copy, and a
page shows its size and keyed digest (DESIGN.md §8). Vendor-data is handled the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet

from provisioning import sealing
from provisioning.models import Cluster, MachineType, Proxy, Template
from provisioning.models.choices import DesiredState
from provisioning.models.proxy import PROXY_NAME
from provisioning.proxmox.config import CATALOGUE_MAX
from provisioning.services.credentials import credentials_file_problem
from provisioning.services.operations import (
    CLOUD_INIT_MAX_BYTES,
    numbered_names,
    validate_placement,
)
from provisioning.services.quotas import cluster_quota_problems

# One request writes the whole batch in one transaction; past this the page would time out.
BULK_MAX = 500
# Proxy names are DNS labels of at most 57 characters (DESIGN.md §2).
NAME_MAX = 57


class SecretTextarea(forms.Textarea):
    """A textarea that never renders its value, like ``PasswordInput(render_value=False)``:
    a form shown again after an error must not put the pasted cloud-init into the page."""

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        return super().get_context(name, None, attrs)


def cloud_init_file_field() -> forms.FileField:
    return forms.FileField(
        required=False,
        label="Cloud-init file",
        help_text="user-data, sent to the VM byte for byte (at most 1 MiB)",
    )


def cloud_init_text_field() -> forms.CharField:
    return forms.CharField(
        required=False,
        strip=False,
        label="or paste cloud-init",
        widget=SecretTextarea(attrs={"rows": 6, "cols": 80, "spellcheck": "false"}),
        help_text="never shown again once saved; after a form error, paste it again",
    )


def clean_cloud_init(cleaned: dict[str, Any]) -> bytes | None:
    """The cloud-init bytes from an upload or a paste, ``None`` when neither was given.

    Raises field errors that never quote the content.
    """
    upload = cleaned.get("cloud_init_file")
    text = cleaned.get("cloud_init_text") or ""
    if upload and text:
        raise ValidationError(
            {"cloud_init_text": "give the cloud-init as a file or as pasted text, not both"}
        )
    if upload:
        if upload.size > CLOUD_INIT_MAX_BYTES:
            raise ValidationError(
                {"cloud_init_file": f"is {upload.size} bytes; the limit is {CLOUD_INIT_MAX_BYTES}"}
            )
        data = upload.read()
        return bytes(data)
    if text:
        data = text.replace("\r\n", "\n").encode()  # browsers send CRLF line ends
        if len(data) > CLOUD_INIT_MAX_BYTES:
            raise ValidationError(
                {"cloud_init_text": f"is {len(data)} bytes; the limit is {CLOUD_INIT_MAX_BYTES}"}
            )
        return data
    return None


# Text inputs offer the catalogue's keys as suggestions (an HTML datalist), not as a dropdown:
# the keys differ per cluster, and the service's check names the valid ones for the cluster.
_SUGGESTIONS = 500
MACHINE_TYPE_INPUT = forms.TextInput(attrs={"list": "ph-machine-types", "autocomplete": "off"})
IMAGE_INPUT = forms.TextInput(attrs={"list": "ph-images", "autocomplete": "off"})
ZONE_INPUT = forms.TextInput(attrs={"list": "ph-nodes", "autocomplete": "off"})


def catalogue_suggestions() -> dict[str, list[str]]:
    """Every cluster's machine type keys, template keys and node names, for the datalists."""
    from provisioning.models import Node

    def keys(model: Any, field: str) -> list[str]:
        rows = model.objects.order_by(field).values_list(field, flat=True).distinct()
        return list(rows[:_SUGGESTIONS])

    return {
        "machine_types": keys(MachineType, "key"),
        "images": keys(Template, "key"),
        "nodes": keys(Node, "name"),
    }


def placement_errors(cluster: Cluster, *, zone: str, machine_type: str, image: str) -> None:
    """The service's catalogue checks (seed 000 entry 3), raised as the form's field errors."""
    validate_placement(cluster, zone=zone, machine_type=machine_type, image=image)


class ProxyForm(forms.ModelForm):
    """Add and change a proxy. Saving goes through the services (``ProxyAdmin.save_model``):
    a new proxy is created with its ``create`` operation, and a changed placement or cloud-init
    replaces the VM."""

    # A quota refusal the service raised at the save (under the cluster's lock) after this
    # form's own check had found room: another declaration committed in between. The admin
    # shows the form again with it (``ProxyAdmin.changeform_view``) instead of an error page.
    refusal: ValidationError | None = None

    cloud_init_file = cloud_init_file_field()
    cloud_init_text = cloud_init_text_field()

    class Meta:
        model = Proxy
        fields = ["name", "cluster", "zone", "machine_type", "image"]
        help_texts = {
            "machine_type": "a machine type key of the cluster's catalogue",
            "image": "a template key of the cluster's catalogue",
        }
        widgets = {"machine_type": MACHINE_TYPE_INPUT, "image": IMAGE_INPUT, "zone": ZONE_INPUT}

    def clean(self) -> dict[str, Any]:
        # Django's own clean() returns cleaned_data; the stubs allow None because an override
        # may return None.
        cleaned = cast("dict[str, Any]", super().clean())
        self.cloud_init_bytes: bytes | None = None
        try:
            self.cloud_init_bytes = clean_cloud_init(cleaned)
        except ValidationError as err:
            self.add_error(None, err)
        cluster = cleaned.get("cluster") or (self.instance.cluster if self.instance.pk else None)
        placement = ("zone", "machine_type", "image")
        if cluster is not None and not any(f in self.errors for f in placement):
            try:
                placement_errors(
                    cluster,
                    zone=cleaned.get("zone") or "",
                    machine_type=cleaned.get("machine_type") or "",
                    image=cleaned.get("image") or "",
                )
            except ValidationError as err:
                self.add_error(None, err)
        if self.instance.pk and self.instance.desired_state == DesiredState.DELETED:
            raise ValidationError("the proxy is being deleted; it cannot be changed")
        if self.refusal is not None:
            self.add_error(None, self.refusal)
        elif cluster is not None and not self.errors:
            self._quota_errors(cluster, cleaned)
        return cleaned

    def _quota_errors(self, cluster: Cluster, cleaned: dict[str, Any]) -> None:
        """The cluster's quotas, checked before the save (the service checks again under the
        cluster's lock): a new proxy adds a proxy and a create, a changed spec a replace."""
        proxy = self.instance
        if not proxy.pk:
            problems = cluster_quota_problems(cluster=cluster, proxies=1, creates=1)
        elif self._replaces(proxy, cleaned):
            problems = cluster_quota_problems(
                cluster=cluster, proxies=0, creates=1, superseding=proxy
            )
        else:
            return
        for problem in problems:
            self.add_error(None, problem)

    def _replaces(self, proxy: Proxy, cleaned: dict[str, Any]) -> bool:
        placement = ("zone", "machine_type", "image")
        if any((cleaned.get(f) or "") != getattr(proxy, f) for f in placement):
            return True
        data = self.cloud_init_bytes
        return data is not None and (sealing.digest(data) if data else "") != (
            proxy.cloud_init_sha256
        )


class BulkCreateForm(forms.Form):
    """The bulk-create page: ``count`` proxies named ``<prefix>-1`` .. ``<prefix>-N`` (zero
    padded like ``proxies create --count``), all with one placement and one cloud-init."""

    count = forms.IntegerField(min_value=1, max_value=BULK_MAX, initial=3)
    # A field named like BaseForm.prefix (the HTML name prefix): the form metaclass moves fields
    # out of the class into base_fields, so the form's own prefix stays None at run time.
    prefix = forms.CharField(  # type: ignore[assignment]
        max_length=NAME_MAX,
        validators=[PROXY_NAME],
        help_text="the proxies are named PREFIX-1 .. PREFIX-N",
    )
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.order_by("name"))
    machine_type = forms.CharField(max_length=63, widget=MACHINE_TYPE_INPUT)
    image = forms.CharField(max_length=63, widget=IMAGE_INPUT)
    zone = forms.CharField(
        max_length=63,
        required=False,
        widget=ZONE_INPUT,
        help_text="a node of the cluster; blank: spread over the nodes",
    )
    cloud_init_file = cloud_init_file_field()
    cloud_init_text = cloud_init_text_field()

    def clean(self) -> dict[str, Any]:
        # Django's own clean() returns cleaned_data; the stubs allow None because an override
        # may return None.
        cleaned = cast("dict[str, Any]", super().clean())
        self.cloud_init_bytes = b""
        try:
            self.cloud_init_bytes = clean_cloud_init(cleaned) or b""
        except ValidationError as err:
            self.add_error(None, err)
        count, prefix, cluster = cleaned.get("count"), cleaned.get("prefix"), cleaned.get("cluster")
        if count and prefix:
            longest = numbered_names(prefix, count)[-1]
            if len(longest) > NAME_MAX:
                self.add_error(
                    "prefix",
                    f"{longest} is longer than {NAME_MAX} characters; shorten the prefix",
                )
        if cluster is not None and not any(
            f in self.errors for f in ("zone", "machine_type", "image")
        ):
            try:
                placement_errors(
                    cluster,
                    zone=cleaned.get("zone") or "",
                    machine_type=cleaned.get("machine_type") or "",
                    image=cleaned.get("image") or "",
                )
            except ValidationError as err:
                self.add_error(None, err)
        return cleaned

    def names(self) -> list[str]:
        return numbered_names(self.cleaned_data["prefix"], self.cleaned_data["count"])


class BulkConfirmForm(forms.Form):
    """The confirm POST of the bulk-create page: the previewed values, and the cloud-init as
    a short-lived token bound to this purpose and user (``provisioning.sealed_tokens``), so the
    content never travels in the page."""

    count = forms.IntegerField(min_value=1, max_value=BULK_MAX, widget=forms.HiddenInput)
    # A field, not BaseForm.prefix (see BulkCreateForm).
    prefix = forms.CharField(  # type: ignore[assignment]
        max_length=NAME_MAX, validators=[PROXY_NAME], widget=forms.HiddenInput
    )
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.order_by("name"), widget=forms.HiddenInput
    )
    machine_type = forms.CharField(max_length=63, widget=forms.HiddenInput)
    image = forms.CharField(max_length=63, widget=forms.HiddenInput)
    zone = forms.CharField(max_length=63, required=False, widget=forms.HiddenInput)
    cloud_init_token = forms.CharField(widget=forms.HiddenInput)
    # Issue 14: the plan set's hash and the shown plan, signed for the user, so the commit
    # writes only that plan and a change since the preview is refused naming what changed.
    plan_hash = forms.RegexField(regex=r"^[0-9a-f]{64}$", widget=forms.HiddenInput)
    plan_shown = forms.CharField(widget=forms.HiddenInput)


# --- the catalogue ----------------------------------------------------------------------------

# Wide for URLs and paths; the width is in admin.css (the CSP allows no style attribute).
_WIDE = forms.TextInput(attrs={"class": "vTextField ph-wide"})


class ClusterForm(forms.ModelForm):
    """The cluster's own fields, labelled with the catalogue's words; validation is the model's
    ``clean()`` (``ProxmoxConfig.problems``, seed 000 entry 15).

    Vendor-data is sealed at rest and treated like cloud-init: the form never renders it (not
    even after an error), a blank box keeps what is stored, and a tick clears it.
    """

    vendor_data = forms.CharField(
        required=False,
        strip=False,
        label="Vendor-data",
        widget=SecretTextarea(attrs={"rows": 6, "cols": 80, "spellcheck": "false"}),
        help_text="extra vendor-data for every new VM; never shown again once saved, "
        "leave blank to keep what is stored",
    )
    clear_vendor_data = forms.BooleanField(required=False, label="Clear the stored vendor-data")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stored = len(self.instance.vendor_data_sealed or b"") if self.instance.pk else 0
        if stored:
            self.fields["vendor_data"].help_text += " (vendor-data is stored, sealed)"

    def clean(self) -> dict[str, Any]:
        cleaned = cast(dict[str, Any], super().clean())
        text = (cleaned.get("vendor_data") or "").replace("\r\n", "\n")
        if text and cleaned.get("clear_vendor_data"):
            self.add_error("vendor_data", "give new vendor-data or tick clear, not both")
        elif cleaned.get("clear_vendor_data"):
            self.instance.vendor_data = ""
        elif text:
            self.instance.vendor_data = text
        return cleaned

    class Meta:
        model = Cluster
        fields = "__all__"
        labels = {
            "url": "URL",
            "token_file": "Token file",
            "ca_file": "CA file",
            "insecure_skip_tls_verify": "Skip TLS verification (insecure)",
            "iso_storage": "ISO storage",
            "vlan_tag": "VLAN tag",
            "vmid_min": "Lowest VMID",
            "vmid_max": "Highest VMID",
            "request_timeout_seconds": "Request timeout (seconds)",
            "max_proxies": "Max proxies (maxProxies)",
            "max_concurrent_creates": "Max concurrent creates (maxConcurrentCreates)",
        }
        widgets = {"url": _WIDE, "token_file": _WIDE, "ca_file": _WIDE}

    # Issue 11: only files inside PROXYHUB_CREDENTIALS_DIR (present only when the user may
    # change the endpoint; otherwise the fields are read-only and not in the form).
    def clean_token_file(self) -> str:
        return self._credentials_file("token_file")

    def clean_ca_file(self) -> str:
        return self._credentials_file("ca_file")

    def _credentials_file(self, field: str) -> str:
        value: str = self.cleaned_data.get(field) or ""
        problem = credentials_file_problem(field=field, path=value)
        if problem:
            raise ValidationError(problem)
        return value


class MachineTypeForm(forms.ModelForm):
    class Meta:
        model = MachineType
        fields = ["key", "cores", "memory_mib", "disk_gib"]
        labels = {"memory_mib": "Memory (MiB)", "disk_gib": "Disk (GiB)"}


# A template row's fields in the cluster page's inline: the key, the VMID, seed 003's
# declaration, the per-node copies and the cloud-init readiness flag (issue 14).
TEMPLATE_FIELDS = (
    "key",
    "vmid",
    "template_version",
    "disk_device",
    "source_disk_gib",
    "guest_user",
    "copies",
    "wait_for_cloud_init",
)


class TemplateForm(forms.ModelForm):
    class Meta:
        model = Template
        fields = TEMPLATE_FIELDS
        labels = {"key": "Image key", "vmid": "Template VMID"}


class CatalogueFormSet(BaseInlineFormSet):
    """Seed 000 entry 15's rules for a cluster's children, as the import applies them: at least
    one entry, at most ``CATALOGUE_MAX``, unique keys, and nothing a live proxy still uses may be
    removed or renamed (``services.catalogue``). ``key_field`` names the key column,
    ``proxy_field`` the proxy field that refers to it, ``what`` the entry in messages."""

    key_field = "key"
    proxy_field = ""
    what = "entry"
    what_plural = "entries"

    def clean(self) -> None:
        # Our checks first: their messages say more than Django's "duplicate values" one.
        if not any(self.errors):
            self._catalogue_rules()
        super().clean()

    def _catalogue_rules(self) -> None:
        kept: list[str] = []
        removed: list[str] = []
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or not form.cleaned_data:
                continue
            key = form.cleaned_data.get(self.key_field)
            old = form.initial.get(self.key_field) if form.instance.pk else None
            # BaseFormSet's own "is this form ticked for deletion"; private, so the stubs
            # do not declare it.
            if self._should_delete_form(form):  # type: ignore[attr-defined]
                if old:
                    removed.append(old)
                continue
            if old and key != old:
                removed.append(old)
            if key:
                kept.append(key)
        if not kept:
            raise ValidationError(f"a cluster needs at least one {self.what}")
        if len(kept) > CATALOGUE_MAX:
            raise ValidationError(
                f"a cluster holds at most {CATALOGUE_MAX} {self.what_plural}, got {len(kept)}"
            )
        twice = sorted(k for k, n in Counter(kept).items() if n > 1)
        if twice:
            raise ValidationError(f"{self.what} given twice: {', '.join(twice)}")
        gone = sorted(set(removed) - set(kept))
        if gone and self.instance.pk:
            self._refuse_removal_in_use(gone)

    def _refuse_removal_in_use(self, gone: list[str]) -> None:
        live = Proxy.objects.filter(
            cluster=self.instance,
            desired_state=DesiredState.PRESENT,
            **{f"{self.proxy_field}__in": gone},
        )
        users: dict[str, list[str]] = {}
        for name, value in live.values_list("name", self.proxy_field).order_by("name")[:200]:
            users.setdefault(value, []).append(name)
        if users:
            raise ValidationError(
                [
                    f'{self.what} "{value}" is still used by {_some(names)}; delete or move '
                    "those proxies first"
                    for value, names in sorted(users.items())
                ]
            )


def _some(names: list[str], shown: int = 10) -> str:
    rest = len(names) - shown
    text = ", ".join(names[:shown])
    return f"{text} and {rest} more" if rest > 0 else text


class NodeFormSet(CatalogueFormSet):
    key_field = "name"
    proxy_field = "zone"
    what = "node"
    what_plural = "nodes"


class TemplateFormSet(CatalogueFormSet):
    proxy_field = "image"
    what = "template"
    what_plural = "templates"


class MachineTypeFormSet(CatalogueFormSet):
    proxy_field = "machine_type"
    what = "machine type"
    what_plural = "machine types"
