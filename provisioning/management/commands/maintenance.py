"""``manage.py maintenance on|off|status``: the maintenance switch (issue 14).

``on --cluster C [--node N] --reason TEXT`` stops proxyhub writing to the cluster (or the node):
operations wait, reconcile and GC start nothing there, and every admin page shows a banner.
``off`` resumes what waited. ``status`` lists the switches that are on (``--json``: objects
with ``cluster``, ``node``, ``reason``, ``since``, ``by``).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.models import Cluster, MaintenanceWindow
from provisioning.models.choices import RequestedVia
from provisioning.services.maintenance import (
    MaintenanceInputError,
    maintenance_end,
    maintenance_start,
    maintenance_windows,
)


def _as_json(window: MaintenanceWindow) -> dict[str, Any]:
    return {
        "cluster": window.cluster.name,
        "node": window.node,
        "reason": window.reason,
        "since": window.started_at.isoformat(),
        "by": window.started_by,
    }


class Command(BaseCommand):
    help = (
        "Turn maintenance on or off for a cluster or one of its nodes, or list what is on. While "
        "it is on proxyhub writes nothing there: operations wait, reconcile and GC start nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["on", "off", "status"])
        parser.add_argument("--cluster", default="", help="the cluster's name (on, off)")
        parser.add_argument("--node", default="", help="one node of it; omit for the whole cluster")
        parser.add_argument("--reason", default="", help="why (on; shown on every admin page)")
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "status":
            self._print(maintenance_windows(), as_json=options["json"])
            return
        name = options["cluster"]
        if not name:
            raise CommandError(f"--cluster is required for {options['action']}")
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"--cluster: no cluster named {name!r} (catalogue: {names})")
        try:
            if options["action"] == "on":
                window = maintenance_start(
                    cluster=cluster,
                    node=options["node"],
                    reason=options["reason"],
                    user=None,
                    via=RequestedVia.COMMAND,
                )
                self._print([window], as_json=options["json"])
                return
            was_on = maintenance_end(cluster=cluster, node=options["node"])
        except MaintenanceInputError as err:
            raise CommandError(_field_of(str(err))) from err
        target = f"{cluster.name}/{options['node']}" if options["node"] else cluster.name
        if options["json"]:
            self.stdout.write(
                json.dumps({"cluster": cluster.name, "node": options["node"], "ended": was_on})
            )
        elif was_on:
            self.stdout.write(f"maintenance off on {target}: waiting operations resume")
        else:
            self.stdout.write(f"maintenance was not on for {target}; nothing changed")

    def _print(self, windows: list[MaintenanceWindow], *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps([_as_json(w) for w in windows], indent=2))
            return
        if not windows:
            self.stdout.write("no maintenance is on")
        for w in windows:
            self.stdout.write(
                f"maintenance on {w.target} since {w.started_at:%Y-%m-%d %H:%M} UTC "
                f"by {w.started_by}: {w.reason}"
            )


def _field_of(message: str) -> str:
    """The service names fields as the model does; the command names its options."""
    if message.startswith("node "):
        return f"--node: {message}"
    if message.startswith("reason "):
        return f"--reason: {message}"
    return message
