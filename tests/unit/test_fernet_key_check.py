"""The sealing keys are checked without cryptography (a worker's parent never loads it, issue
12): the check must accept and refuse exactly what ``Fernet(key)`` accepts and refuses."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from provisioning.sealing import is_fernet_key


def _fernet_accepts(key: str) -> bool:
    try:
        Fernet(key.encode())
    except (ValueError, TypeError):
        return False
    return True


# Keys near the real shape: URL-safe base64 of about 32 bytes, with or without padding, mixed
# with characters base64 ignores or refuses; and any short text.
_near_keys = st.binary(min_size=28, max_size=36).map(
    lambda raw: base64.urlsafe_b64encode(raw).decode()
)
_mangled = st.tuples(_near_keys, st.integers(0, 44), st.sampled_from(["", "=", "+", "/", " ", "é"]))


@given(st.one_of(_near_keys, st.text(max_size=60)))
def test_the_key_check_agrees_with_fernet(key: str) -> None:
    assert is_fernet_key(key) == _fernet_accepts(key)


@given(_mangled)
def test_the_key_check_agrees_with_fernet_on_mangled_keys(case: tuple[str, int, str]) -> None:
    key, at, extra = case
    mangled = key[:at] + extra + key[at + 1 :]
    assert is_fernet_key(mangled) == _fernet_accepts(mangled)


def test_a_generated_key_passes_and_a_short_one_does_not() -> None:
    assert is_fernet_key(Fernet.generate_key().decode())
    assert not is_fernet_key(base64.urlsafe_b64encode(b"k" * 31).decode())
    assert not is_fernet_key("not base64 at all!")
