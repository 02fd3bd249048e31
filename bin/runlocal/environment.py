"""The interpreter and environment every child of run-local gets, and the metrics they share."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from . import REPO


def project_python() -> str:
    """The interpreter that has proxyhub's requirements: this one when it runs in a venv (as
    ``make run`` does), else the repository's ``.venv`` when there is one."""
    if sys.prefix != sys.base_prefix:
        return sys.executable
    venv_python = REPO / ".venv" / "bin" / "python"
    return str(venv_python) if venv_python.exists() else sys.executable


def child_env(base: Mapping[str, str], venv_bin: Path) -> dict[str, str]:
    """The environment of every child: the caller's, the venv first on PATH, dev settings.

    ``DJANGO_SETTINGS_MODULE`` defaults to ``proxyhub.settings.local`` here only: everywhere else
    it defaults to production's, which wants a secret key and redirects plain HTTP to HTTPS,
    neither of which fits runserver on 127.0.0.1. ``DATABASE_URL`` and ``REDIS_URL`` stay unset
    unless the caller set them, so the settings pick SQLite under ``var/`` and the embedded
    broker.
    """
    env = dict(base)
    env["PATH"] = os.pathsep.join([str(venv_bin), env.get("PATH", os.defpath)])
    # Empty means the default, as for every variable the settings read.
    if not env.get("DJANGO_SETTINGS_MODULE"):
        env["DJANGO_SETTINGS_MODULE"] = "proxyhub.settings.local"
    env["PYTHONUNBUFFERED"] = "1"  # honcho relays lines; buffered output would arrive late
    return env


def clear_metrics(env: Mapping[str, str], var: Path) -> None:
    """Empty the shared metrics directory before any process starts.

    prometheus_client's multiprocess mode keeps one file per process there and adds them all
    up; files left by an earlier run would count forever (settings: METRICS). Only its own
    ``*.db`` files are removed, so a directory set to something unexpected loses nothing else.
    """
    folder = Path(env.get("PROMETHEUS_MULTIPROC_DIR") or var / "metrics")
    for stale in folder.glob("*.db"):
        stale.unlink(missing_ok=True)
