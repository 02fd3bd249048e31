"""What Django's error reports (the DEBUG page, mail_admins, the text traceback) may show.

Django's ``SafeExceptionReporterFilter`` hides settings whose names look secret (API, AUTH, TOKEN,
KEY, SECRET, PASS, ...), but not ``CELERY_BROKER_URL`` (a Redis URL can carry a password), and it
shows every local variable of every frame unless the function was decorated with
``sensitive_variables``. proxyhub handles Proxmox tokens and cloud-init user-data (which may hold
secrets) in many places, so the same name rule applies to local variables too, and strings that
look like a Proxmox token are masked in any local string, dict, list or tuple.
"""

from __future__ import annotations

import re
from types import FrameType
from typing import Any

from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter

from .logging import redact_value


class SensitiveReporterFilter(SafeExceptionReporterFilter):
    """Cleanses settings and locals named like URLs, DSNs, brokers, tokens, secrets, passwords,
    keys or cloud-init, on top of Django's defaults."""

    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE"
        "|URL|DSN|BROKER|CLOUD_?INIT|USER_?DATA",
        flags=re.IGNORECASE,
    )

    def get_traceback_frame_variables(
        self, request: HttpRequest | None, tb_frame: FrameType
    ) -> Any:
        # Unlike Django's own cleansing this applies with DEBUG on too: the DEBUG page is where
        # locals are shown, and a developer's screen share is an audience as well.
        cleansed = []
        for name, value in super().get_traceback_frame_variables(request, tb_frame):
            if self.hidden_settings.search(name):
                value = self.cleansed_substitute
            elif isinstance(value, str | dict | list | tuple):
                value = redact_value(name, value)
            cleansed.append((name, value))
        return cleansed
