"""The console's admin site: sign-in asks for a one-time code (issue 11).

- A user with a confirmed authenticator signs in only with its current code as well as the
  password; a missing or wrong code is refused like a wrong password (the same words, so the
  page does not tell whether the password was right) and counted by django-axes as a failed
  login (its failure row, its lockout).
- With ``PROXYHUB_REQUIRE_2FA`` a superuser without an authenticator is refused, told how to
  enrol (``manage.py totp_enrol``), and the refusal is counted the same way; a superuser session
  that was not verified with a code (one opened before the setting was switched on) no longer
  opens the console.
- Everyone else signs in as before: the code field stays empty.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import URLPattern, URLResolver, path

from .devices import totp_confirmed_devices, totp_token_match

WRONG = (
    "Please enter the correct %(username)s and password for a staff account, and the current "
    "one-time code if you enrolled an authenticator. Note that both fields may be case-sensitive."
)
ENROL_HOW = (
    "Superusers must sign in here with a one-time code (PROXYHUB_REQUIRE_2FA), and this account "
    "has no authenticator yet. To enrol one, run on the server: python manage.py totp_enrol "
    "USERNAME, scan the code it prints with an authenticator app, then sign in with the "
    "six-digit code it shows."
)


class ConsoleLoginForm(AdminAuthenticationForm):
    """The admin's login form plus the one-time code, checked after the password."""

    otp_token = forms.CharField(
        label="One-time code",
        required=False,
        max_length=8,
        strip=True,
        help_text="Six digits from your authenticator app, if you enrolled one.",
        widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "inputmode": "numeric"}),
    )

    # One message for a wrong password and a wrong code, so the page never confirms a password.
    error_messages = {
        **AdminAuthenticationForm.error_messages,
        "invalid_login": WRONG,
        "invalid_code": WRONG,
        "enrol_first": ENROL_HOW,
    }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()  # the password, through django-axes' backend first
        user = self.user_cache
        if user is None:
            return cleaned
        if totp_confirmed_devices(user=user):
            device = totp_token_match(user=user, token=cleaned.get("otp_token") or "")
            if device is None:
                self._refuse("invalid_code")
            # django-otp's user_logged_in receiver marks the session verified by this device.
            user.otp_device = device  # type: ignore[attr-defined]
        elif settings.PROXYHUB_REQUIRE_2FA and user.is_superuser:
            self._refuse("enrol_first")
        return cleaned

    def _refuse(self, code: str) -> None:
        """Count the refusal as a failed login (django-axes: its row, its lockout), then say
        why. The password is not passed on: it was right, and it stays in this form."""
        username = self.cleaned_data.get("username")
        user_login_failed.send(
            sender=__name__,
            credentials={"username": username},
            request=self.request,
        )
        self.user_cache = None
        raise ValidationError(
            self.error_messages[code],
            code=code,
            params={"username": self.username_field.verbose_name},
        )


def verified(user: Any) -> bool:
    """Whether this session's user signed in with a code (django-otp's middleware)."""
    is_verified = getattr(user, "is_verified", None)
    return bool(is_verified and is_verified())


class ConsoleAdminSite(admin.AdminSite):
    """``admin.site``: the login form above, and the signed-in user's enrolment page."""

    login_form = ConsoleLoginForm

    def has_permission(self, request: HttpRequest) -> bool:
        if not super().has_permission(request):
            return False
        user = request.user
        return not (settings.PROXYHUB_REQUIRE_2FA and user.is_superuser and not verified(user))

    def get_urls(self) -> list[URLResolver | URLPattern]:
        from .views import two_factor

        own = [
            path(
                "two-factor/",
                self.admin_view(lambda request: two_factor(self, request)),
                name="two_factor",
            )
        ]
        return own + super().get_urls()
