"""``manage.py rotate_sealing_key [--batch-size N] [--json]``: re-seal every sealed column under
the newest key of ``PROXYHUB_SEALING_KEYS`` (docs/operator-guide.md, "Sealing keys")."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.services.sealing_rotation import BATCH_SIZE, RotationCounts, sealing_key_rotate


class Command(BaseCommand):
    help = (
        "Re-seal every proxy's cloud-init and every cluster's vendor-data under the first key of "
        "PROXYHUB_SEALING_KEYS, so the keys behind it can be removed. Safe to run again; "
        "changes no VM and starts no operation. Exits 1 when a row opens with no configured key "
        "(it is named and left as it is)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"rows per transaction (default {BATCH_SIZE})",
        )
        parser.add_argument("--json", action="store_true", help="print the counts as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        report = sealing_key_rotate(batch_size=options["batch_size"])
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            self.stdout.write(_line("cloud-init of proxies", report.cloud_init))
            self.stdout.write(_line("vendor-data of clusters", report.vendor_data))
        if not report.ok:
            names = sorted(report.cloud_init.unreadable + report.vendor_data.unreadable)
            raise CommandError(
                f"{len(names)} row(s) open with no key of PROXYHUB_SEALING_KEYS and were left "
                f"as they are: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}; put "
                "their key back behind the newest one and run the command again, or enter the "
                "value again"
            )


def _line(what: str, counts: RotationCounts) -> str:
    return (
        f"{what}: {counts.resealed} re-sealed, {counts.current} already under the newest key, "
        f"{counts.empty} empty, {len(counts.unreadable)} unreadable"
    )
