"""Console sign-in (issue 11): login throttling with django-axes (wrong passwords in a row lock
one username from one address out for a while, even with the right password; the page says so;
each failure is a row an administrator can see; another address is not locked out), and the
minimum password length."""

from __future__ import annotations

from typing import Any

import pytest
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-staple"


def _login(client: Client, password: str, address: str = "192.0.2.10") -> Any:
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": password},
        REMOTE_ADDR=address,
    )


@pytest.fixture
def operator() -> User:
    return User.objects.create_user("operator", password=PASSWORD, is_staff=True)


def test_the_failure_limit_locks_the_right_password_out_with_a_clear_page(
    operator: User, settings: Any
) -> None:
    client = Client()
    limit = settings.AXES_FAILURE_LIMIT
    for _ in range(limit - 1):
        assert _login(client, "wrong").status_code == 200  # the form again, with its error
    assert _login(client, PASSWORD).status_code == 302  # under the limit: in, count reset
    client.logout()
    for _ in range(limit):
        _login(client, "wrong")
    locked = _login(client, PASSWORD)
    assert locked.status_code == 429
    page = locked.content.decode()
    assert "Too many failed logins" in page and "15 minutes" in page
    assert "operator" not in page and PASSWORD not in page
    assert "_auth_user_id" not in client.session
    # Recorded for the admin: the attempts and each failure, with the address.
    attempt = AccessAttempt.objects.get(username="operator")
    assert attempt.failures_since_start >= limit and attempt.ip_address == "192.0.2.10"
    assert AccessFailureLog.objects.filter(username="operator").count() >= limit
    # The same username from another address still logs in: a stranger cannot lock it out.
    assert _login(Client(), PASSWORD, address="198.51.100.7").status_code == 302


def test_lockout_ends_after_its_cool_off(operator: User, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, "wrong")
    assert _login(client, PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert _login(client, PASSWORD).status_code == 302


def test_a_console_password_needs_twelve_characters() -> None:
    """Issue 11: the accounts of a console that can destroy VMs need passwords of 12 or more
    characters; the refusal says how many."""
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        validate_password("Tr0ub4dor&3")  # 11 characters
    assert "at least 12 characters" in " ".join(caught.value.messages)
    validate_password("Tr0ub4dor&3x")  # 12: accepted
