"""The console's second factor (issue 11): TOTP for staff, required of superusers on demand.

Codes are computed with django-otp's own TOTP algorithm from the device's real key, as an
authenticator app would; nothing is mocked. A wrong or missing code is a failed login for
django-axes (its failure row, its lockout), and the page says no more than for a wrong password.
"""

from __future__ import annotations

import re
import time
from io import StringIO
from typing import Any

import pytest
from axes.models import AccessFailureLog
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-staple"
WRONG_WORDS = "Please enter the correct username and password for a staff account"
INLINE = (r"<script(?![^>]*\bsrc=)[^>]*>", r"<style\b", r"\sstyle=", r"\son[a-z]+=")


def current_code(device: TOTPDevice) -> str:
    """What the authenticator app shows now."""
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"


def another_code(device: TOTPDevice) -> str:
    return f"{(int(current_code(device)) + 500_000) % 1_000_000:06d}"


def _login(client: Client, username: str, code: str = "", password: str = PASSWORD) -> Any:
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "otp_token": code},
        REMOTE_ADDR="192.0.2.20",
    )


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def alice() -> User:
    """Staff with an enrolled authenticator."""
    user = User.objects.create_user("alice", password=PASSWORD, is_staff=True)
    TOTPDevice.objects.create(user=user, name="authenticator", confirmed=True)
    return user


def test_an_enrolled_user_signs_in_only_with_the_current_code(alice: User, settings: Any) -> None:
    # django-otp refuses every code for 2^(n-1) s after the n-th wrong one, so whether the right
    # code below lands inside that back-off depends on how fast this machine posts the wrong
    # ones. Which codes are taken is the question here; the back-off is django-otp's own and
    # the enrolment test below walks through it.
    settings.OTP_TOTP_THROTTLE_FACTOR = 0
    device = TOTPDevice.objects.get(user=alice)

    for code in ("", another_code(device), "not-a-code"):
        client = Client()
        refused = _login(client, "alice", code)
        assert refused.status_code == 200
        assert WRONG_WORDS in refused.content.decode()
        assert not _signed_in(client)

    client = Client()
    code = current_code(device)
    accepted = _login(client, "alice", code)
    assert accepted.status_code == 302
    assert _signed_in(client)
    assert client.session[DEVICE_ID_SESSION_KEY] == device.persistent_id
    assert client.get("/admin/").status_code == 200

    # A code is good once: the same one again is refused (the very code taken above, not the
    # current one: a 30 s step may have ended since, and the next step's code is a fresh one).
    replay = Client()
    assert _login(replay, "alice", code).status_code == 200
    assert not _signed_in(replay)


def test_each_refused_code_is_recorded_and_counts_towards_the_lockout(
    alice: User, settings: Any
) -> None:
    device = TOTPDevice.objects.get(user=alice)
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, "alice", another_code(device))
    assert AccessFailureLog.objects.filter(username="alice").count() == settings.AXES_FAILURE_LIMIT
    locked = _login(client, "alice", current_code(device))
    assert locked.status_code == 429
    assert "Too many failed logins" in locked.content.decode()
    assert not _signed_in(client)


def test_a_wrong_code_reads_like_a_wrong_password(alice: User) -> None:
    """The page never confirms that the password was right."""
    device = TOTPDevice.objects.get(user=alice)
    wrong_password = _login(Client(), "alice", current_code(device), password="wrong" * 3)
    wrong_code = _login(Client(), "alice", another_code(device))
    assert _errors(wrong_password) == _errors(wrong_code) != []


def _errors(response: Any) -> list[str]:
    return re.findall(r'<p class="errornote">\s*(.*?)\s*</p>', response.content.decode(), re.S)


def test_without_an_authenticator_the_code_is_not_asked(django_user_model: Any) -> None:
    django_user_model.objects.create_user("bob", password=PASSWORD, is_staff=True)
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    assert _login(Client(), "bob").status_code == 302
    assert _login(Client(), "root").status_code == 302


def test_required_2fa_refuses_a_superuser_without_an_authenticator(
    django_user_model: Any, settings: Any
) -> None:
    settings.PROXYHUB_REQUIRE_2FA = True
    django_user_model.objects.create_superuser("root", password=PASSWORD)
    django_user_model.objects.create_user("bob", password=PASSWORD, is_staff=True)

    client = Client()
    refused = _login(client, "root")
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "python manage.py totp_enrol USERNAME" in page
    assert not _signed_in(client)
    assert AccessFailureLog.objects.filter(username="root").count() == 1
    # Staff who are not superusers may still sign in without one.
    assert _login(Client(), "bob").status_code == 302

    # Enrolled from the shell, the superuser signs in with the code.
    out = StringIO()
    call_command("totp_enrol", "root", stdout=out)
    device = TOTPDevice.objects.get(user__username="root", confirmed=True)
    assert device.config_url in out.getvalue()
    client = Client()
    assert _login(client, "root", current_code(device)).status_code == 302
    assert client.get("/admin/").status_code == 200


def test_required_2fa_closes_an_unverified_superuser_session(
    django_user_model: Any, settings: Any
) -> None:
    root = django_user_model.objects.create_superuser("root", password=PASSWORD)
    client = Client()
    client.force_login(root)  # signed in before the requirement was switched on
    assert client.get("/admin/").status_code == 200
    settings.PROXYHUB_REQUIRE_2FA = True
    response = client.get("/admin/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_enrol_their_own_authenticator_in_the_console(django_user_model: Any) -> None:
    carol = django_user_model.objects.create_user("carol", password=PASSWORD, is_staff=True)
    dave = django_user_model.objects.create_user("dave", password=PASSWORD, is_staff=True)
    client = Client()
    client.force_login(carol)

    page = client.get("/admin/two-factor/")
    assert page.status_code == 200
    text = page.content.decode()
    pending = TOTPDevice.objects.get(user=carol, confirmed=False)
    secret = re.search(r"secret=([A-Z2-7]+)", pending.config_url).group(1)
    assert 'src="data:image/svg+xml;base64,' in text and secret in text
    assert "no-cache" in page["Cache-Control"]
    assert [m for pattern in INLINE for m in re.findall(pattern, text)] == []

    # Another user's page shows their own key, never carol's.
    other = Client()
    other.force_login(dave)
    assert secret not in other.get("/admin/two-factor/").content.decode()

    wrong = client.post("/admin/two-factor/", {"otp_token": another_code(pending)})
    assert wrong.status_code == 200 and "not the current code" in wrong.content.decode()
    pending.refresh_from_db()
    assert pending.confirmed is False

    # django-otp backs off one second after a wrong code; a person retyping takes longer.
    time.sleep(1.1)
    done = client.post("/admin/two-factor/", {"otp_token": current_code(pending)})
    assert done.status_code == 302
    pending.refresh_from_db()
    assert pending.confirmed is True
    assert client.session[DEVICE_ID_SESSION_KEY] == pending.persistent_id
    # Once confirmed, the key is shown no more.
    assert secret not in client.get("/admin/two-factor/").content.decode()
    # And sign-in now asks carol for its code.
    assert _login(Client(), "carol").status_code == 200


def test_the_login_page_asks_for_the_code_without_inline_script_or_style() -> None:
    page = Client().get("/admin/login/")
    text = page.content.decode()
    assert 'name="otp_token"' in text and 'autocomplete="one-time-code"' in text
    assert [m for pattern in INLINE for m in re.findall(pattern, text)] == []


def test_no_admin_page_shows_a_device_key(alice: User, django_user_model: Any) -> None:
    device = TOTPDevice.objects.get(user=alice)
    root = django_user_model.objects.create_superuser("root", password=PASSWORD)
    client = Client()
    client.force_login(root)
    base = "/admin/otp_totp/totpdevice/"
    for path in (base, f"{base}{device.pk}/change/"):
        response = client.get(path)
        assert response.status_code == 200
        text = response.content.decode()
        assert "alice" in text
        assert device.key not in text and "otpauth://" not in text
    # django-otp's own QR view is gone: the admin treats the path as an unknown object.
    qr = client.get(f"{base}{device.pk}/qrcode/", follow=True)
    assert qr["Content-Type"].startswith("text/html")
    assert device.key not in qr.content.decode()
    assert client.get(f"{base}add/").status_code == 403


def test_totp_enrol_refuses_to_replace_silently_and_names_unknown_users(alice: User) -> None:
    with pytest.raises(CommandError, match="already has a confirmed authenticator"):
        call_command("totp_enrol", "alice", stdout=StringIO())
    with pytest.raises(CommandError, match="username: no user 'nobody'"):
        call_command("totp_enrol", "nobody", stdout=StringIO())
    old = TOTPDevice.objects.get(user=alice)
    call_command("totp_enrol", "alice", "--replace", stdout=StringIO())
    (new,) = TOTPDevice.objects.filter(user=alice)
    assert new.pk != old.pk and new.key != old.key and new.confirmed
