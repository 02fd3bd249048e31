"""The superuser ``admin`` whose login ``make run`` prints, and its password file."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from .django_commands import manage

ADMIN_USER = "admin"

# Run inside ``manage.py shell -c``; the password travels in the environment, never in argv
# (which ``ps`` shows to every user of the machine).
_ADMIN_CODE = """
import os
from django.contrib.auth import get_user_model
User = get_user_model()
user, created = User.objects.get_or_create(
    username=os.environ["RUN_LOCAL_ADMIN_USER"], defaults={"email": "admin@localhost"}
)
user.is_active = user.is_staff = user.is_superuser = True
user.set_password(os.environ["RUN_LOCAL_ADMIN_PASSWORD"])
user.save()
"""


def ensure_admin_password(var: Path) -> str:
    """The admin password from ``var/admin-password``, made (random, owner-only) on first run.

    It is reused on later runs so a login saved in a browser keeps working; delete the file for
    a new one. The file is created 0600 in one step, so it is never readable by others.
    """
    path = var / "admin-password"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        password = path.read_text(encoding="utf-8").strip()
        if password:
            return password
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    password = secrets.token_urlsafe(18)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(password + "\n")
    return password


def ensure_admin(python: str, env: Mapping[str, str], password: str) -> None:
    """Create the superuser ``admin``, or reset it to ``password`` if it exists."""
    admin_env = {
        **env,
        "RUN_LOCAL_ADMIN_USER": ADMIN_USER,
        "RUN_LOCAL_ADMIN_PASSWORD": password,
    }
    manage(python, ["shell", "--no-imports", "-c", _ADMIN_CODE], admin_env, "creating the admin")
