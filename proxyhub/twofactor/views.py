"""``/admin/two-factor/``: the signed-in user enrols (or replaces) their own authenticator.

Only ever the requesting user's device: its key and QR code are shown to its owner while it is
unconfirmed, never once confirmed and never to anybody else. Confirming needs a current code,
and verifies this session, so the user stays signed in once they enrolled.
"""

from __future__ import annotations

import base64
from typing import Any

import qrcode
import qrcode.image.svg
from django import forms
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

from .devices import totp_confirmed_devices, totp_enrolment_confirm, totp_enrolment_start


class ConfirmForm(forms.Form):
    otp_token = forms.CharField(
        label="Code from your authenticator",
        max_length=8,
        strip=True,
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )


def qr_data_uri(text: str) -> str:
    """``text`` as a QR code in an SVG ``data:`` URI: an image the Content-Security-Policy allows
    (img-src data:), no script and no inline style."""
    image = qrcode.make(text, image_factory=qrcode.image.svg.SvgPathImage, box_size=8)
    return "data:image/svg+xml;base64," + base64.b64encode(image.to_string()).decode()


def two_factor(site: AdminSite, request: HttpRequest) -> HttpResponse:
    user = request.user
    here = reverse("admin:two_factor", current_app=site.name)
    form = ConfirmForm()
    if request.method == "POST":
        if request.POST.get("action") == "replace":
            totp_enrolment_start(user=user)
            return HttpResponseRedirect(here)
        form = ConfirmForm(request.POST)
        if form.is_valid():
            device = totp_enrolment_confirm(user=user, token=form.cleaned_data["otp_token"])
            if device is not None:
                otp_login(request, device)
                messages.success(
                    request, "Your authenticator is enrolled: sign-in now asks for its code."
                )
                return HttpResponseRedirect(here)
            form.add_error(
                "otp_token",
                "That is not the current code of the key shown here. Check the authenticator "
                "entry you just added and the device's clock, then enter its newest code.",
            )
    confirmed = totp_confirmed_devices(user=user)
    pending: TOTPDevice | None = (
        TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-pk").first()
    )
    if pending is None and not confirmed:
        pending = totp_enrolment_start(user=user)
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Two-factor sign-in",
        "confirmed": confirmed[0] if confirmed else None,
        "pending": pending,
        "form": form,
    }
    if pending is not None:
        uri = pending.config_url
        context["provisioning_uri"] = uri
        context["qr"] = qr_data_uri(uri)
        context["secret"] = base64.b32encode(pending.bin_key).decode()
    return TemplateResponse(request, "admin/two_factor.html", context)
