"""``manage.py reconcile``: one reconcile round now, as Beat runs it (DESIGN.md §5)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from provisioning.services.leases import LeaseHeld
from provisioning.services.reconcile import reconcile_round


class Command(BaseCommand):
    help = (
        "Run one reconcile round over every cluster and print what it did per proxy "
        "(converged, create, start, ...). Exits 1 when another round holds the lease."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            counts = reconcile_round()
        except LeaseHeld as err:
            raise CommandError(f"{err}; try again when it has finished") from err
        if not counts:
            self.stdout.write("reconcile: no proxies to reconcile")
            return
        detail = ", ".join(f"{what} {n}" for what, n in sorted(counts.items()))
        self.stdout.write(f"reconcile: {detail}")
