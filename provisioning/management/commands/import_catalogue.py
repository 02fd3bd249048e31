"""``manage.py import_catalogue FILE... [--dry-run]`` (DESIGN.md §7)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.services.catalogue import CatalogueError, catalogue_load
from provisioning.services.catalogue_import import catalogue_import


class Command(BaseCommand):
    help = (
        "Create or update Proxmox clusters from ProxmoxCluster YAML documents (several per file "
        "allowed). Every document is checked first; when any is refused, nothing is written. "
        "A token or CA file that does not exist yet is a warning, not a refusal."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("files", nargs="+", metavar="FILE", help="catalogue YAML files")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="check everything and print what would change; write nothing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            documents = catalogue_load(options["files"])
            report = catalogue_import(documents, dry_run=options["dry_run"])
        except CatalogueError as err:
            raise CommandError(str(err)) from err
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}", style_func=self.style.WARNING)
        for change in report.clusters:
            self.stdout.write(change.summary(dry_run=report.dry_run))
        if report.dry_run:
            self.stdout.write("dry run: nothing was written")
