"""The sealing key of ``make run``: generated into ``var/sealing-key`` on first start, reused.

Cloud-init and vendor-data are sealed at rest with ``PROXYHUB_SEALING_KEYS``. A constant in the
repository would seal every clone's secrets with a key anyone can read, so the first run makes
a random Fernet key (owner-only, under the gitignored ``var/``) and every later run, and
``proxyhub.settings.local`` for a command typed by hand, reads it back. A key set in the
caller's environment wins and no file is written.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

FILE_NAME = "sealing-key"


def ensure_sealing_key(var: Path) -> tuple[str, bool]:
    """The key from ``var/sealing-key``, and whether this call created it (0600, in one step).

    A Fernet key is 32 random bytes in URL-safe base64; made here with the standard library,
    since this launcher imports nothing else.
    """
    path = var / FILE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        key = path.read_text(encoding="utf-8").strip()
        if key:
            return key, False
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    key = base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(key + "\n")
    return key, True
