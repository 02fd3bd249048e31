"""The parts of ``make run`` (bin/run-local), one job per module.

- ``options``: the command line and its defaults;
- ``environment``: the interpreter and environment every child gets, and the metrics cleanup;
- ``web_port``: the admin's port, free before anything starts and answering once web is up;
- ``django_commands``: one ``manage.py`` command in the foreground;
- ``simulator``: the Proxmox simulator as a child, its ready line, its catalogue imported;
- ``sealing_key``: the key that seals cloud-init, generated into ``var/`` on first start;
- ``admin_login``: the superuser ``admin`` and its password file;
- ``processes``: web, worker and Beat from ``Procfile.local`` under honcho, watched and stopped;
- ``run``: the steps in order, and how a failure or Ctrl-C ends them.

Standard library only (see bin/run-local): Django, Celery and honcho are only ever children.
"""

from __future__ import annotations

from pathlib import Path

# The repository every child runs in: bin/runlocal/ is two levels below it.
REPO = Path(__file__).resolve().parents[2]
