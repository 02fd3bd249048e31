"""Who asked for a piece of work, as text for the audit (the journal, maintenance windows)."""

from __future__ import annotations

import getpass
import os

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from provisioning.models.choices import RequestedVia

User = AbstractBaseUser | AnonymousUser | None


def requester_name(user: User, via: str) -> str:
    """The console user's name; for a command, the operating-system user who ran it; blank
    when neither is known (Beat, the sweeper)."""
    if user is not None and user.is_authenticated:
        return str(user.get_username())[:150]
    if via == RequestedVia.COMMAND:
        try:
            return getpass.getuser()[:150]
        except (KeyError, OSError):  # no name for this uid (a container's bare uid)
            return f"uid {os.getuid()}"
    return ""
