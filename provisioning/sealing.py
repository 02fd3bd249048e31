"""Cloud-init at rest: sealed with Fernet so its content never sits in the database in clear.

DESIGN.md §4 keeps a proxy's user-data byte for byte (a retry or a replace must rebuild the
same seed), while §8 says cloud-init content is never stored, logged or shown. Both hold when
the row keeps only a sealed copy, a SHA-256 to detect edits and its length. The key comes from
``PROXYHUB_SECRETS_KEY`` (or, when unset, from ``SECRET_KEY``); losing it means re-entering
the cloud-init of existing proxies, never leaking it.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class SealError(Exception):
    """The sealed value cannot be opened with the configured key."""


def _fernet() -> Fernet:
    secret = getattr(settings, "PROXYHUB_SECRETS_KEY", "") or settings.SECRET_KEY
    digest = hashlib.sha256(("proxyhub-cloud-init:" + secret).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(data: bytes) -> bytes:
    return _fernet().encrypt(data)


def unseal(token: bytes) -> bytes:
    try:
        return _fernet().decrypt(bytes(token))
    except InvalidToken as err:
        raise SealError(
            "the stored cloud-init cannot be opened: PROXYHUB_SECRETS_KEY (or SECRET_KEY) changed; "
            "set the old key back or edit the proxy's cloud-init again"
        ) from err


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
