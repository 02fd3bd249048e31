"""Secrets at rest: cloud-init and vendor-data sealed with Fernet, never in the database in clear.

DESIGN.md §4 keeps a proxy's user-data byte for byte (a retry or a replace must rebuild the
same seed), while §8 says cloud-init content is never stored, logged or shown. Both hold when
the row keeps only a sealed copy, a keyed digest to detect edits and its length.

Keys come from ``PROXYHUB_SEALING_KEYS``: Fernet keys, newest first. The newest seals; every
key opens (``MultiFernet``), so a new key can be put in front while rows sealed under the
older ones stay readable until ``manage.py rotate_sealing_key`` re-seals them. Installs from
before that setting sealed with a key derived from ``PROXYHUB_SECRETS_KEY`` (or
``SECRET_KEY``); that derived key is kept last, to open only, so those rows stay readable
until they are re-sealed. With no sealing key configured at all (a development shell, never
production, whose settings refuse to start) the derived key seals too.

Digests are HMAC-SHA256 under a key derived from the newest sealing key for that purpose alone:
an unsalted SHA-256 would let anyone who can see it confirm a guessed cloud-init.

``cryptography`` is imported where a value is sealed or opened, not when this module is: the
models import this module, so every process would load it at start, and loading it costs about
7 MiB of memory. A Celery worker's parent never seals or opens anything, yet what it loads each
prefork pool process carries too (issue 12: the worker's memory). Keys are checked without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

# A Fernet key is 32 bytes in URL-safe base64 (the Fernet specification; cryptography's
# ``Fernet(key)`` checks exactly this and nothing more).
FERNET_KEY_BYTES = 32


class SealError(Exception):
    """The sealed value cannot be opened with any configured key."""


def parse_keys(value: str | Sequence[str], *, setting: str = "PROXYHUB_SEALING_KEYS") -> list[str]:
    """The Fernet keys of a comma-separated setting, newest first; each one checked.

    Raises ``ImproperlyConfigured`` naming the setting and the key's position, never its value.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    keys = [item.strip() for item in items if item.strip()]
    for position, key in enumerate(keys, start=1):
        if not is_fernet_key(key):
            raise ImproperlyConfigured(
                f"{setting}: key {position} is not a Fernet key (32 bytes, URL-safe base64); "
                "generate one with python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'"
            )
    return keys


def is_fernet_key(key: str) -> bool:
    """Whether ``key`` is a Fernet key, decoded as ``Fernet(key)`` decodes it."""
    try:
        return len(base64.urlsafe_b64decode(key.encode())) == FERNET_KEY_BYTES
    except (binascii.Error, ValueError):
        return False


def _configured() -> list[bytes]:
    return [k.encode() for k in parse_keys(getattr(settings, "PROXYHUB_SEALING_KEYS", []))]


def _legacy_key() -> bytes:
    """The key every row was sealed with before ``PROXYHUB_SEALING_KEYS`` existed."""
    secret = getattr(settings, "PROXYHUB_SECRETS_KEY", "") or settings.SECRET_KEY
    digest = hashlib.sha256(("proxyhub-cloud-init:" + secret).encode()).digest()
    return base64.urlsafe_b64encode(digest)


def _keys() -> list[bytes]:
    """Every key that opens, the sealing one first; the legacy key last, to open only."""
    keys = _configured()
    legacy = _legacy_key()
    return [*keys, legacy] if legacy not in keys else keys


def _derive(key: bytes, purpose: str) -> bytes:
    """A key for one purpose only: a digest or a browser token never reuses the sealing key."""
    return hmac.new(base64.urlsafe_b64decode(key), purpose.encode(), hashlib.sha256).digest()


def _fernets(keys: list[bytes]) -> MultiFernet:
    """A Fernet of ``keys``, the first sealing; this module's one import of ``cryptography``
    with ``_opened`` (see the module's text)."""
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(k) for k in keys])


def _opened(fernet: MultiFernet, token: bytes) -> bytes | None:
    """``token`` opened with ``fernet``, or None when none of its keys opens it."""
    from cryptography.fernet import InvalidToken

    try:
        return fernet.decrypt(bytes(token))
    except InvalidToken:
        return None


def seal(data: bytes) -> bytes:
    return _fernets(_keys()).encrypt(data)


def unseal(token: bytes) -> bytes:
    opened = _opened(_fernets(_keys()), token)
    if opened is None:
        raise SealError(
            "the sealed value cannot be opened with any key of PROXYHUB_SEALING_KEYS; put the "
            "key it was sealed with back into PROXYHUB_SEALING_KEYS (behind the newest), or "
            "enter the value again"
        )
    return opened


def is_current(token: bytes) -> bool:
    """Whether ``token`` is sealed under the newest key (``rotate_sealing_key`` skips it)."""
    return _opened(_fernets(_keys()[:1]), token) is not None


def digest(data: bytes) -> str:
    """HMAC-SHA256 of ``data`` under the newest key's digest key: 64 hex digits."""
    return digests(data)[0]


def digests(data: bytes) -> list[str]:
    """``data``'s digest under every configured key, newest first: a digest stored before the
    newest key was put in front still matches one of them."""
    return [
        hmac.new(_derive(k, "proxyhub-digest-v1"), data, hashlib.sha256).hexdigest()
        for k in _keys()
    ]


def _purpose_fernet(purpose: str) -> MultiFernet:
    """A Fernet keyed for ``purpose`` alone (derived from the newest key): what it seals opens
    with nothing else, and nothing sealed at rest opens with it."""
    return _fernets([base64.urlsafe_b64encode(_derive(_keys()[0], "proxyhub-purpose:" + purpose))])


def purpose_seal(purpose: str, data: bytes) -> bytes:
    """``data`` sealed for ``purpose`` alone (``sealed_tokens``)."""
    return _purpose_fernet(purpose).encrypt(data)


def purpose_open(purpose: str, token: bytes) -> bytes:
    """What ``purpose_seal`` sealed for ``purpose``; ``SealError`` when it does not open (the
    newest key changed since, or it was sealed for another purpose)."""
    opened = _opened(_purpose_fernet(purpose), token)
    if opened is None:
        raise SealError(f"the value was not sealed for {purpose} under the newest key")
    return opened
