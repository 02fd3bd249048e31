"""``manage.py export_catalogue [--cluster C]`` (DESIGN.md §7): the catalogue as YAML."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.services.catalogue import CatalogueError
from provisioning.services.catalogue_export import catalogue_export


class Command(BaseCommand):
    help = (
        "Print the catalogue as ProxmoxCluster YAML documents, one per cluster; the output "
        "imports back with import_catalogue unchanged. The token and the CA are never in it, "
        "only their files' paths; vendor-data is written as a placeholder (which an import "
        "reads as 'keep the current vendor-data') unless --include-secrets."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--cluster",
            action="append",
            metavar="C",
            help="export only this cluster (repeat for several); default: all",
        )
        parser.add_argument(
            "--include-secrets",
            action="store_true",
            help="write each cluster's vendor-data in clear instead of a placeholder",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            text = catalogue_export(options["cluster"], include_secrets=options["include_secrets"])
        except CatalogueError as err:
            raise CommandError(str(err)) from err
        self.stdout.write(text, ending="")
