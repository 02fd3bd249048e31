"""What Django's error reports (the DEBUG page, mail_admins, the text traceback) may show.

Django's ``SafeExceptionReporterFilter`` hides settings whose names look secret (API, AUTH, TOKEN,
KEY, SECRET, PASS, ...), but not ``CELERY_BROKER_URL`` (a Redis URL can carry a password); it
shows every local variable of every frame unless the function was decorated with
``sensitive_variables``, and every POST parameter unless the view was decorated with
``sensitive_post_parameters``, and with DEBUG on it cleanses nothing at all. proxyhub's admin
forms carry cloud-init user-data, vendor-data, CA content and passwords, and its code handles
Proxmox tokens in many places, so here, with DEBUG on or off:

* POST parameters, local variables and nested dict keys named like a secret
  (``proxyhub.logging.is_sensitive_name``: ``cloud_init*``, ``user-data``, ``*token*``,
  ``*secret*``, ``*password*``, ``vendorData``, ``ca``/``caFile``, ...) are masked whole;
* ``bytes``, ``bytearray`` and ``memoryview`` locals (upload bodies, seed ISOs, raw cloud-init)
  are shown by their size only;
* strings that look like cloud-init or a PEM block are masked whole, and Proxmox token strings
  inside any other string, dict, list or tuple are masked.
"""

from __future__ import annotations

import re
from types import FrameType
from typing import Any

from django.http import HttpRequest, QueryDict
from django.utils.datastructures import MultiValueDict
from django.views.debug import SafeExceptionReporterFilter

from .logging import REDACTED, is_sensitive_name, redact_value

# The first line of cloud-init user-data in its usual forms (cloud-init's "user-data formats").
_CLOUD_INIT_START = re.compile(
    r"^\s*(#cloud-config|#cloud-boothook|#include|#part-handler|#!|## template:"
    r"|Content-Type:\s*multipart/)",
    re.IGNORECASE,
)


def _looks_like_cloud_init(value: str) -> bool:
    return bool(_CLOUD_INIT_START.match(value))


class SensitiveReporterFilter(SafeExceptionReporterFilter):
    """Cleanses settings, POST parameters and locals named like URLs, DSNs, brokers, tokens,
    secrets, passwords, keys or cloud-init, on top of Django's defaults (module docstring)."""

    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE"
        "|URL|DSN|BROKER|CLOUD_?INIT|USER_?DATA|VENDOR_?DATA",
        flags=re.IGNORECASE,
    )

    # Unlike Django's own cleansing, everything here applies with DEBUG on too: the DEBUG page is
    # where POST and locals are shown, and a developer's screen share is an audience as well.

    def _cleanse(self, name: str, value: Any) -> Any:
        if isinstance(value, bytes | bytearray | memoryview):
            return f"<{len(value)} bytes>"
        if name and (self.hidden_settings.search(name) or is_sensitive_name(name)):
            return self.cleansed_substitute if value not in (None, "") else value
        if isinstance(value, str) and _looks_like_cloud_init(value):
            return self.cleansed_substitute
        if isinstance(value, MultiValueDict):
            return self._cleanse_multivaluedict(value)
        if isinstance(value, str | dict | list | tuple):
            return self._deep(redact_value(name, value))
        return value

    def _deep(self, value: Any) -> Any:
        """``redact_value``'s result with cloud-init-looking strings masked at any depth."""
        if isinstance(value, str):
            return REDACTED if _looks_like_cloud_init(value) else value
        if isinstance(value, dict):
            return {k: self._deep(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._deep(v) for v in value]
        return value

    def _cleanse_multivaluedict(self, values: MultiValueDict[str, Any]) -> MultiValueDict[str, Any]:
        cleansed = values.copy()
        for key in list(cleansed.keys()):
            cleansed.setlist(key, [self._cleanse(key, v) for v in values.getlist(key)])
        return cleansed

    def get_post_parameters(self, request: HttpRequest | None) -> Any:
        if request is None:
            return {}
        cleansed = super().get_post_parameters(request)
        if isinstance(cleansed, QueryDict | MultiValueDict):
            return self._cleanse_multivaluedict(cleansed)
        return {k: self._cleanse(str(k), v) for k, v in dict(cleansed).items()}

    def cleanse_special_types(self, request: HttpRequest | None, value: Any) -> Any:
        value = super().cleanse_special_types(request, value)
        if isinstance(value, MultiValueDict):
            return self._cleanse_multivaluedict(value)
        return value

    def get_traceback_frame_variables(
        self, request: HttpRequest | None, tb_frame: FrameType
    ) -> Any:
        return [
            (name, self._cleanse(name, value))
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]
