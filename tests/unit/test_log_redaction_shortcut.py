"""``redact`` skips its regexes on text none of them can match (proxyhub/logging.py,
``_may_hold_secret``). The shortcut must never let a secret through: on any text, ``redact``
gives exactly what the four regexes give."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxyhub.logging import _PATTERNS, REDACTED, redact

# Pieces the patterns are made of, mixed with ordinary characters (ASCII and not), so that
# generated text often comes near a match, or makes one.
_PIECES = st.sampled_from(
    [
        "PVEAPIToken",
        "pveapitoken",
        "PVEAPITo\u212aen",  # the Kelvin sign: the regexes fold it into "k"
        "PVEAP\u0131Token",  # a dotless i: the regexes fold it into "i", str.lower does not
        "Bearer ",
        "bEaReR\t",
        "-----BEGIN ",
        "CERTIFICATE",
        "-----END CERTIFICATE-----",
        "-----",
        "root@pam",
        "proxyhub@pve",
        "!ci",
        "!sim",
        "=",
        ":",
        " ",
        "'",
        "\n",
        "abc-123",
        "UPID:pve1:0001:0002:65A1B2C3:qmclone:101:proxyhub@pve!sim:",
        REDACTED,
    ]
)
_TEXT = st.lists(
    st.one_of(_PIECES, st.text(alphabet=st.characters(codec="utf-8"), max_size=4)), max_size=12
).map("".join)


def _every_regex(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


@settings(max_examples=1500, deadline=None)
@given(_TEXT)
@example("PVEAP\u0131Token=abc-123")
@example("Authorization: bearer abc")
@example('{"upid": "UPID:pve1:1:2:3:qmclone:101:proxyhub@pve!sim:", "status": 200}')
@example("-----BEGIN PRIVATE KEY-----\nMIIE")
@example("token proxyhub@pve!sim = 0b7c3a52")
def test_the_shortcut_gives_what_every_regex_gives(text: str) -> None:
    assert redact(text) == _every_regex(text)


def test_a_line_with_nothing_secret_is_returned_as_it_came() -> None:
    line = '{"level": "INFO", "call": "node_tasks", "node": "pve1", "duration_ms": 3.2}'
    assert redact(line) is line
    # A UPID names its token's owner (user@realm!tokenid) with no "=": nothing to mask.
    upid = '{"upid": "UPID:pve1:1:2:3:qmclone:101:proxyhub@pve!sim:"}'
    assert redact(upid) == upid
