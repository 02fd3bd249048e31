"""``manage.py gc [--dry-run] [--json]``: one garbage collection now (DESIGN.md §5)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.services.gc import GcItem, GcRefused, gc_run
from provisioning.services.leases import LeaseHeld


class Command(BaseCommand):
    help = (
        "Remove this installation's VMs that no proxy owns and seed ISOs no VM uses, older "
        "than PROXYHUB_GC_MIN_AGE_SECONDS, at most PROXYHUB_GC_MAX_DELETES_PER_ROUND per run. "
        "VMs are deleted by journalled operations. Exits 1 when another GC holds the lease, or "
        "when the installation identity kept outside the database is missing or disagrees."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="list what would be removed; remove nothing"
        )
        parser.add_argument("--json", action="store_true", help="print the items as a JSON array")

    def handle(self, *args: Any, **options: Any) -> None:
        dry_run = options["dry_run"]
        try:
            items = gc_run(dry_run=dry_run, via="command")
        except LeaseHeld as err:
            raise CommandError(f"{err}; try again when it has finished") from err
        except GcRefused as err:
            raise CommandError(f"gc refused, nothing was deleted: {err}") from err
        if options["json"]:
            self.stdout.write(json.dumps([item.as_json() for item in items], indent=2))
            return
        for item in items:
            self.stdout.write(_describe(item, dry_run=dry_run))
        vms = sum(item.kind == "vm" for item in items)
        seeds = len(items) - vms
        verb = "would remove" if dry_run else "removing"
        self.stdout.write(f"gc: {verb} {vms} VM(s) and {seeds} seed ISO(s)")


def _describe(item: GcItem, *, dry_run: bool) -> str:
    verb = "would remove" if dry_run else "removing"
    what = f"VM {item.vmid} {item.name}" if item.kind == "vm" else f"seed ISO {item.volid}"
    age = f", {item.age_seconds} s old" if item.age_seconds is not None else ""
    return f"{verb} {what} on {item.cluster}/{item.node} ({item.reason}{age})"
