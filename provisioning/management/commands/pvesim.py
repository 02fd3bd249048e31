"""``manage.py pvesim``: the Proxmox VE simulator under manage.py (DESIGN.md §7, §7a).

The same program as ``python -m provisioning.proxmox.simulator``, whose ``main`` this calls,
so the two can never drift apart. When ready it prints exactly one JSON line to stdout
(``url``, ``tokenFile``, ``caFile``, ``catalogue``) and serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.proxmox.simulator.__main__ import add_arguments as add_simulator_arguments
from provisioning.proxmox.simulator.__main__ import main as simulator_main


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
        add_simulator_arguments(parser, default_workdir=str(settings.VAR_DIR / "pvesim"))

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
            "--workdir",
            options["workdir"],
            "--log-level",
            options["log_level"],
        ]
        code = simulator_main(argv)
        if code:
            raise CommandError(f"the simulator exited with status {code}", returncode=code)
