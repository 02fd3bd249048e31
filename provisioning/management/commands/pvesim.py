"""``manage.py pvesim``: the Proxmox VE simulator under manage.py (DESIGN.md §7, §7a).

The same program as ``python -m pvesim``, whose ``main`` this calls, so the two can never drift
apart. When ready it prints exactly one JSON line to stdout (``url``, ``tokenFile``, ``caFile``,
``catalogue``) and serves until SIGINT or SIGTERM.

This command and ``bin/run-local`` (which starts ``python -m pvesim`` as a child process) are
the only runtime doors from proxyhub to the simulator; the rest of ``provisioning`` never
imports ``pvesim``. Even here the import is made inside the methods: loading a module of
``provisioning`` never loads the simulator, only running this command does, so the product keeps
no module-level tie to its test double (tests/pvesim/test_import_rules.py holds both rules).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Serve the Proxmox VE simulator over HTTPS with a generated CA. When ready, print one "
        "JSON line with url, tokenFile, caFile and catalogue (a catalogue YAML for "
        "import_catalogue); serve until SIGINT or SIGTERM."
    )
    # The simulator needs no database and must start before migrations have run.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        from pvesim.__main__ import add_arguments

        add_arguments(parser, default_workdir=str(settings.VAR_DIR / "pvesim"))

    def handle(self, *args: Any, **options: Any) -> None:
        if options["time_scale"] < 0:
            raise CommandError("--time-scale must not be negative")
        # Django's logging writes JSON lines to stdout; the ready line must be the only thing
        # there, so the simulator's log goes to stderr instead.
        logging.basicConfig(
            level=options["log_level"],
            stream=sys.stderr,
            format="%(levelname)s %(name)s %(message)s",
            force=True,
        )
        argv = [
            "--host",
            options["host"],
            "--port",
            str(options["port"]),
            "--profile",
            options["profile"],
            "--time-scale",
            repr(options["time_scale"]),
            *(
                ["--node-task-limit", str(options["node_task_limit"])]
                if options["node_task_limit"] is not None
                else []
            ),
            "--workdir",
            options["workdir"],
            "--log-level",
            options["log_level"],
        ]
        from pvesim.__main__ import main

        code = main(argv)
        if code:
            raise CommandError(f"the simulator exited with status {code}", returncode=code)
