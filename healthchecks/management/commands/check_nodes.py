"""``manage.py check_nodes [--json] [--cluster NAME]``: one node health round now."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from healthchecks.models import NodeHealth
from healthchecks.services import check_round
from provisioning.models import Cluster

# Exit statuses: a node not ready is not the command failing, so they differ.
NOT_READY = 1
FAILED = 2


class Command(BaseCommand):
    help = (
        "Check every node of every cluster now (seed 000 entry 16) and store the results, as "
        "the Beat schedule does. Exit status: 0 when every node checked is ready, 1 when at "
        "least one is not (the results are still printed and stored), 2 when the check "
        "itself could not run (for example an unknown --cluster). No cluster at all is 0."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="print a JSON array, one object per node with cluster, node, ready, reason, "
            "message, details, durationSeconds and checkedAt (RFC 3339)",
        )
        parser.add_argument(
            "--cluster",
            action="append",
            metavar="NAME",
            help="check only this cluster (repeatable)",
        )
        parser.add_argument(
            "--deadline",
            type=float,
            metavar="SECONDS",
            help="time allowed per cluster (default: PROXYHUB_HEALTH_DEADLINE_SECONDS)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        names: list[str] | None = options["cluster"]
        deadline: float | None = options["deadline"]
        if deadline is not None and deadline <= 0:
            raise CommandError("--deadline must be above 0", returncode=FAILED)
        if names:
            known = set(Cluster.objects.filter(name__in=names).values_list("name", flat=True))
            unknown = [name for name in names if name not in known]
            if unknown:
                raise CommandError(f"no such cluster: {', '.join(unknown)}", returncode=FAILED)
        rows = check_round(deadline_seconds=deadline, cluster_names=names)
        if options["json"]:
            self.stdout.write(json.dumps([as_json(row) for row in rows], indent=2))
        else:
            self._table(rows)
        not_ready = [
            f"{row.cluster.name}/{row.node} ({row.reason})" for row in rows if not row.ready
        ]
        if not_ready:
            # On stderr, after the report: stdout stays the table or valid JSON.
            raise CommandError(
                f"{len(not_ready)} of {len(rows)} nodes not ready: {', '.join(not_ready)}",
                returncode=NOT_READY,
            )

    def _table(self, rows: list[NodeHealth]) -> None:
        if not rows:
            self.stdout.write("no clusters to check")
            return
        table = [["CLUSTER", "NODE", "READY", "REASON", "MESSAGE"]]
        table += [
            [row.cluster.name, row.node, "yes" if row.ready else "no", row.reason, row.message]
            for row in rows
        ]
        widths = [max(len(line[i]) for line in table) for i in range(4)]
        for line in table:
            cells = [cell.ljust(width) for cell, width in zip(line[:4], widths, strict=True)]
            self.stdout.write("  ".join([*cells, line[4]]).rstrip())
        ready = sum(row.ready for row in rows)
        self.stdout.write(f"{ready}/{len(rows)} nodes ready")


def as_json(row: NodeHealth) -> dict[str, Any]:
    return {
        "cluster": row.cluster.name,
        "node": row.node,
        "ready": row.ready,
        "reason": row.reason,
        "message": row.message,
        "details": row.details,
        "durationSeconds": row.duration,
        "checkedAt": _rfc3339(row.checked_at),
    }


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
