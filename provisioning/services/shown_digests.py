"""The config digests a confirmation page showed, carried to its confirm POST (issue 14).

Seed 001 makes the VM's config digest a confirmation condition. A power or replace page shows
each target's digest; the digests travel back in one hidden field, signed with
``django.core.signing`` and salted with the action, naming the user, refused once older than
``PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS``: a forged or replayed form cannot claim it was shown
another digest, and a start page's digests do not confirm a replace.

``record_digests`` keeps the digests a page read on the proxies (``Proxy.config_digest``), the
last one the service saw of each VM.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError

from provisioning.models import Proxy

FIELD = "shown_digests"


def _salt(action: str) -> str:
    return f"proxyhub.shown-digests.{action}"


def sign_digests(digests: Mapping[int, str], *, action: str, user_id: int) -> str:
    """``digests`` (proxy id → config digest shown) signed for ``action`` and ``user_id``."""
    return signing.dumps(
        {"u": user_id, "d": {str(pk): d for pk, d in digests.items()}}, salt=_salt(action)
    )


def load_digests(token: str, *, action: str, user_id: int) -> dict[int, str]:
    """The digests ``sign_digests`` signed for the same action and user; ``ValidationError``
    naming the field otherwise."""
    try:
        payload = signing.loads(
            token, salt=_salt(action), max_age=settings.PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS
        )
    except signing.SignatureExpired:
        raise ValidationError({FIELD: "the confirmation page is too old; open it again"}) from None
    except signing.BadSignature:
        raise ValidationError(
            {FIELD: "the digests shown were altered or made for another action"}
        ) from None
    if not isinstance(payload, dict) or payload.get("u") != user_id:
        raise ValidationError({FIELD: "the confirmation page was made for another user"})
    shown = payload.get("d")
    if not isinstance(shown, dict):
        raise ValidationError({FIELD: "the digests shown were altered"})
    return {int(pk): str(d) for pk, d in shown.items()}


def record_digests(digests: Mapping[int, str]) -> None:
    """Keep what was read as each proxy's last seen config digest."""
    for pk, digest in digests.items():
        Proxy.objects.filter(pk=pk).exclude(config_digest=digest).update(config_digest=digest)
