"""Secrets that travel through a browser and back: purpose-bound, user-bound, short-lived.

The bulk-create preview hands the cloud-init to its confirm POST. The at-rest seal must not do
that job: a copy of it would open with the database's key, for anyone, for ever. A token here
is the content encrypted with a key derived for its purpose alone (``sealing.purpose_seal``),
wrapped in a ``django.core.signing`` signature salted with the purpose, naming the user it was
made for, and refused once older than its max age. The page holds it, never the content.
"""

from __future__ import annotations

from django.core import signing

from provisioning import sealing


class TokenRefused(Exception):
    """The token cannot be used; the message says why and never quotes the token."""


class TokenExpired(TokenRefused):
    pass


class TokenInvalid(TokenRefused):
    pass


class TokenWrongUser(TokenRefused):
    pass


def _salt(purpose: str) -> str:
    return f"proxyhub.sealed-token.{purpose}"


def token_dumps(data: bytes, *, purpose: str, user_id: int) -> str:
    """``data`` sealed for ``purpose`` and for ``user_id``, as URL-safe text."""
    sealed = sealing.purpose_seal(purpose, data).decode("ascii")
    return signing.dumps({"u": user_id, "d": sealed}, salt=_salt(purpose), compress=False)


def token_loads(token: str, *, purpose: str, user_id: int, max_age: int) -> bytes:
    """The bytes of a token made by ``token_dumps`` for the same purpose and user, at most
    ``max_age`` seconds ago. Raises ``TokenExpired``, ``TokenWrongUser`` or ``TokenInvalid``."""
    try:
        payload = signing.loads(token, salt=_salt(purpose), max_age=max_age)
    except signing.SignatureExpired:
        raise TokenExpired(f"it is older than {max_age} seconds") from None
    except signing.BadSignature:
        raise TokenInvalid("it was changed or made for something else") from None
    if not isinstance(payload, dict) or payload.get("u") != user_id:
        raise TokenWrongUser("it was made for another user")
    try:
        return sealing.purpose_open(purpose, str(payload["d"]).encode("ascii"))
    except (sealing.SealError, KeyError, ValueError):
        # The signature held but the content does not open: the sealing key changed since.
        raise TokenInvalid("it was sealed under a key this server no longer has") from None
