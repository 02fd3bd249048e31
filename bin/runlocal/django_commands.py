"""One ``manage.py`` command of the project, run in the foreground."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from . import REPO
from .console import RunError


def manage(python: str, args: Sequence[str], env: Mapping[str, str], what: str) -> None:
    """Run one ``manage.py`` command in the foreground; its output goes to the terminal."""
    if not (REPO / "manage.py").exists():
        raise RunError(f"{REPO / 'manage.py'} is missing; cannot {what}")
    # Every argument is ours (the venv's python, fixed commands, our own paths): no shell.
    command = [python, "manage.py", *args]
    result = subprocess.run(command, cwd=REPO, env=dict(env), check=False)  # noqa: S603
    if result.returncode != 0:
        raise RunError(f"{what} failed (manage.py {args[0]} exited {result.returncode})")
