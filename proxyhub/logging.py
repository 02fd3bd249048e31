"""JSON log lines on stdout, with secrets scrubbed on the way out.

Every process (web, workers, Beat) logs through Django's ``LOGGING`` (settings), which puts
``JsonFormatter`` and ``RedactSecretsFilter`` on the one stdout handler. The provider logs
structured fields with ``extra=`` (seed 000 entry 20: call, node, vmid, upid, duration, HTTP
status); they become top-level keys of the JSON object.

The provider already keeps the token secret out of its messages (seed 000 entry 20). The
redaction here is defence in depth: an ``Authorization`` header or a ``USER@REALM!TOKENID=SECRET``
string that reaches a log line anyway, through an exception text or a library's debug output,
is masked before it is written.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from celery import current_task

REDACTED = "[REDACTED]"

# Characters that end a secret: whitespace, quotes and the punctuation that surrounds values in
# headers, reprs, query strings and JSON. A secret already replaced is not replaced again.
_VALUE_CHARS = r"(?!\[REDACTED\])[^\s'\",;&<>)\]}]+"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # The Authorization header Proxmox expects: PVEAPIToken=USER@REALM!TOKENID=SECRET
    # (pve-reference README, "Authentication"). The whole value goes.
    (re.compile(r"(PVEAPIToken\s*[=:]\s*)" + _VALUE_CHARS, re.IGNORECASE), r"\1" + REDACTED),
    # The bare token string, as in a token file or a URL: keep USER@REALM!TOKENID, which
    # identifies the token without granting anything (the checker reports it as tokenID).
    (
        re.compile(r"([^\s@:'\"=/]+@[A-Za-z0-9.\-_]+![A-Za-z0-9.\-_]+)\s*=\s*" + _VALUE_CHARS),
        r"\1=" + REDACTED,
    ),
    # /metrics' optional bearer token and any other bearer credential.
    (re.compile(r"(\bBearer\s+)" + _VALUE_CHARS, re.IGNORECASE), r"\1" + REDACTED),
    # PEM blocks: a CA bundle's or a key's content, wherever it is quoted (an unterminated block,
    # cut by a repr or a length limit, goes to the end of the text).
    (
        re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----.*?(?:-----END \1-----|\Z)", re.DOTALL),
        r"-----BEGIN \1-----" + REDACTED,
    ),
)

# Names (of extra= keys, form fields, dict keys, local variables) whose whole value is a secret
# or may hold one: the Proxmox token and its file, passwords, cloud-init user-data and
# vendor-data, CA content, cookies and session ids. Compared with case, "-" and "_" dropped, so
# cloud_init, cloud-init, cloudInit and cloud_init_file all match "cloudinit".
_SENSITIVE_NAME = re.compile(
    r"^cloudinit|userdata|vendordata|token|secret|passw|passphrase|^pass$|authorization|cookie"
    r"|sessionid|privatekey|apikey|^ca$|^cafile|^capem|^cacert|^cabundle|sealed"
)


def is_sensitive_name(name: str) -> bool:
    """Whether a value called ``name`` is masked whole wherever it is reported or logged."""
    return bool(_SENSITIVE_NAME.search(name.lower().replace("-", "").replace("_", "")))


# Attributes every LogRecord has; anything else on a record came from extra=.
_RECORD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def redact(text: str) -> str:
    """``text`` with API tokens, Authorization header values and bearer tokens masked."""
    if not _may_hold_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _may_hold_secret(text: str) -> bool:
    """False only when no pattern of ``_PATTERNS`` can match ``text``: each needs a literal
    (``PVEAPIToken``, ``@`` with ``!`` and ``=``, ``Bearer``, ``-----BEGIN ``), and ASCII text
    without them needs no regex at all. Every log line and every string field goes through
    ``redact``: the four regexes took about 80 µs on a Proxmox call's JSON line, and redaction
    was a third of the worker's time in logging (py-spy of issue 12's makespan).

    Text that is not ASCII always takes the regexes: their case-insensitive matching folds some
    other letters into ASCII ones (the dotless i, U+0131, matches ``i``), which ``str.lower``
    does not (tests/unit/test_log_redaction_shortcut.py)."""
    if not text.isascii():
        return True
    if "@" in text and "!" in text and "=" in text:
        return True
    if "-----BEGIN " in text:
        return True
    lowered = text.lower()
    return "pveapitoken" in lowered or "bearer" in lowered


def redact_value(key: str, value: Any) -> Any:
    """``value`` with secrets masked: all of it when ``key`` names a secret
    (``is_sensitive_name``), binary data by its size only (an upload body, an ISO image, raw
    cloud-init), else token strings inside it, through dicts (by their keys), lists and tuples.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if key and is_sensitive_name(key) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value("", v) for v in value]
    return value


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller passed with ``extra=``."""
    return {
        k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS and not k.startswith("_")
    }


class RedactSecretsFilter(logging.Filter):
    """Masks secrets in the message, the ``extra=`` fields and the exception text of a record.

    It rewrites the record in place (the message is rendered once and its arguments dropped), so
    every handler after it, whatever its formatter, sees only the masked text. It never drops a
    record and never raises: a logging call must not fail because of redaction.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad %-format; keep the template, the handler reports the error
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        for key, value in extra_fields(record).items():
            setattr(record, key, redact_value(key, value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        # Upload bodies and ISO images are never logged, only their size.
        return f"<{len(value)} bytes>"
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, then the ``extra=``
    fields, the Celery task id and name inside a task, and ``exc`` with the traceback.

    Keys a caller passes in ``extra=`` never overwrite the four base keys. Values JSON cannot
    encode are written as text (bytes only by their length). The finished line goes through
    ``redact`` once more, so the formatter is safe even on a handler without the filter.
    """

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if current_task:
            payload["task_id"] = current_task.request.id
            payload["task_name"] = current_task.name
        for key, value in extra_fields(record).items():
            payload.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exc"] = record.exc_text
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        line = json.dumps(payload, default=_json_default, ensure_ascii=False)
        return redact(line)
