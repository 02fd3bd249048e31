"""Services over a user's TOTP devices (django-otp's ``TOTPDevice``).

A device is ``confirmed`` once its owner proved their authenticator holds its key by entering a
current code; only confirmed devices are asked for at sign-in. A key is shown only to its owner:
on the enrolment page while unconfirmed, or printed once by ``totp_enrol`` on the server.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice

log = logging.getLogger(__name__)

# The name shown in the device list; one authenticator per user.
DEVICE_NAME = "authenticator"


def totp_confirmed_devices(*, user: Any) -> list[TOTPDevice]:
    """The user's devices that sign-in asks a code of."""
    if user is None or not getattr(user, "pk", None):
        return []
    return list(TOTPDevice.objects.devices_for_user(user, confirmed=True))


def totp_token_match(*, user: Any, token: str) -> TOTPDevice | None:
    """The confirmed device of ``user`` that accepts ``token`` now, or None.

    Each device's own checks apply: the code of this 30-second step or a neighbouring one, never
    a code already used (replay), and django-otp's back-off after failures.
    """
    token = token.strip()
    if not token.isdigit():
        return None
    with transaction.atomic():
        for device in TOTPDevice.objects.devices_for_user(user, confirmed=True).select_for_update():
            if device.verify_token(token):
                return device
    return None


def totp_enrolment_start(*, user: Any) -> TOTPDevice:
    """The user's unconfirmed device, created with a fresh random key when there is none."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-pk").first()
    if device is None:
        device = TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=False)
    return device


def totp_enrolment_confirm(*, user: Any, token: str) -> TOTPDevice | None:
    """Confirm the user's pending device if ``token`` is its current code; other devices of the
    user are removed (one authenticator each). None when the code is wrong."""
    token = token.strip()
    with transaction.atomic():
        device = (
            TOTPDevice.objects.select_for_update()
            .filter(user=user, confirmed=False)
            .order_by("-pk")
            .first()
        )
        if device is None or not token.isdigit() or not device.verify_token(token):
            return None
        TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()
        device.confirmed = True
        device.save(update_fields=["confirmed"])
    log.info("totp device confirmed", extra={"user_id": user.pk})
    return device


def totp_enrol(*, user: Any, replace: bool) -> TOTPDevice:
    """A confirmed device for ``user`` with a fresh key (``manage.py totp_enrol``): the operator
    at the server's shell is trusted to hand its key to the user at once.

    Raises ValueError when the user already has a confirmed device and ``replace`` is false.
    """
    with transaction.atomic():
        existing = TOTPDevice.objects.select_for_update().filter(user=user)
        if not replace and existing.filter(confirmed=True).exists():
            raise ValueError(
                f"user {user.get_username()!r} already has a confirmed authenticator; "
                "pass --replace to give them a new key (the old one stops working)"
            )
        existing.delete()
        device = TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=True)
    log.info("totp device enrolled by command", extra={"user_id": user.pk})
    return device
