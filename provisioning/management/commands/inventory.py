"""``manage.py inventory [--cluster C] [--refresh] [--json]``: the guest snapshot (issue 14)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.models import Cluster, InventoryGuest, InventoryRefresh
from provisioning.services.inventory import inventory_refresh


class Command(BaseCommand):
    help = (
        "Print every guest of each cluster as the last inventory refresh listed it (Beat "
        "refreshes it every PROXYHUB_INVENTORY_INTERVAL_SECONDS). --refresh lists the cluster "
        "now first; a cluster whose refresh fails keeps its previous snapshot, and the command "
        "then exits 1."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", help="only this cluster (its name)")
        parser.add_argument(
            "--refresh", action="store_true", help="refresh the snapshot from Proxmox first"
        )
        parser.add_argument("--json", action="store_true", help="print a JSON array of guests")

    def handle(self, *args: Any, **options: Any) -> None:
        clusters = list(Cluster.objects.order_by("name"))
        name = options["cluster"]
        if name is not None:
            clusters = [c for c in clusters if c.name == name]
            if not clusters:
                known = ", ".join(Cluster.objects.order_by("name").values_list("name", flat=True))
                raise CommandError(
                    f"--cluster {name!r} is not a configured cluster "
                    f"(configured: {known or 'none'})"
                )
        failed = []
        if options["refresh"]:
            for cluster in clusters:
                outcome = inventory_refresh(cluster=cluster)
                if outcome.error:
                    failed.append(f"{cluster.name}: {outcome.error}")
        rows = (
            InventoryGuest.objects.filter(cluster__in=clusters)
            .select_related("cluster")
            .order_by("cluster__name", "vmid")
        )
        if options["json"]:
            self.stdout.write(json.dumps([_as_json(g) for g in rows], indent=2))
        else:
            self._table(clusters, rows)
        if failed:
            raise CommandError(
                "inventory refresh failed, the previous snapshot is shown: " + "; ".join(failed)
            )

    def _table(self, clusters: list[Cluster], rows: Any) -> None:
        records = {r.cluster_id: r for r in InventoryRefresh.objects.filter(cluster__in=clusters)}
        for cluster in clusters:
            record = records.get(cluster.pk)
            self.stdout.write(_refresh_line(cluster, record))
        for g in rows:
            flags = ",".join(
                f
                for f in (
                    "template" if g.template else "",
                    f"lock={g.lock}" if g.lock else "",
                    f"ha={g.hastate}" if g.hastate else "",
                    f"pool={g.pool}" if g.pool else "",
                )
                if f
            )
            self.stdout.write(
                f"{g.cluster.name}\t{g.node}\t{g.vmid}\t{g.name or '-'}\t{g.type}\t{g.status}"
                f"\t{g.owner}\t{flags or '-'}"
            )


def _refresh_line(cluster: Cluster, record: InventoryRefresh | None) -> str:
    if record is None or record.refreshed_at is None:
        line = f"# {cluster.name}: never refreshed"
    else:
        when = record.refreshed_at.strftime("%Y-%m-%d %H:%M:%S %Z")
        line = f"# {cluster.name}: {record.count} guest(s) as of {when}"
        if record.truncated:
            line += f", truncated: {record.listed} listed, only {record.count} kept"
    if record is not None and record.error:
        line += f"; last refresh failed: {record.error}"
    return line


def _as_json(g: InventoryGuest) -> dict[str, Any]:
    return {
        "cluster": g.cluster.name,
        "node": g.node,
        "vmid": g.vmid,
        "name": g.name,
        "type": g.type,
        "status": g.status,
        "lock": g.lock or None,
        "template": g.template,
        "pool": g.pool or None,
        "owner": g.owner,
        "tags": [t for t in g.tags.split(";") if t],
        "hastate": g.hastate or None,
        "markRead": g.mark_read,
        "refreshedAt": g.refreshed_at.isoformat(),
    }
