"""``manage.py bootstrap_cluster --cluster C --admin-token-file F [--rotate-token] [--json]``.

A thin door onto ``services.cluster_bootstrap`` (issue 14): with an administrator's token used
once and never stored, give cluster C a pool, a role with exactly proxyhub's privileges, a user,
a privilege-separated token and ACLs on its pool, templates, storages, bridges and nodes only.
Exits 1 when the new token lacks a privilege it needs (named with its path).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.models import Cluster
from provisioning.proxmox.errors import ProxmoxError
from provisioning.services.cluster_bootstrap import BootstrapInputError, cluster_bootstrap


class Command(BaseCommand):
    help = (
        "Create or verify proxyhub's pool, role, user, privilege-separated API token and ACLs on "
        "a cluster with an administrator's token (read from --admin-token-file, used for this "
        "run only), write the new token into the credentials directory and the cluster's "
        "catalogue entry. Running it again changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True, help="the cluster's name in the catalogue")
        parser.add_argument(
            "--admin-token-file",
            required=True,
            help="file inside PROXYHUB_CREDENTIALS_DIR holding an administrator's "
            "USER@REALM!TOKENID=SECRET; read for this run only, never copied",
        )
        parser.add_argument(
            "--rotate-token",
            action="store_true",
            help="delete proxyhub's token on Proxmox and make a new one (when its secret is lost)",
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(
                f"--cluster: no cluster named {options['cluster']!r} (catalogue: {names})"
            )
        try:
            result = cluster_bootstrap(
                cluster=cluster,
                admin_token_file=options["admin_token_file"],
                rotate_token=options["rotate_token"],
            )
        except BootstrapInputError as err:
            raise CommandError(str(err)) from err
        except ProxmoxError as err:
            raise CommandError(f"bootstrap of {cluster.name} stopped: {err}") from err
        failed = result.privileges is not None and result.privileges.status == "failed"
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
        else:
            for line in result.changes:
                self.stdout.write(f"changed: {line}")
            for line in result.verified:
                self.stdout.write(f"verified: {line}")
            if result.privileges is not None:
                for line in result.privileges.failures:
                    self.stdout.write(f"FAILED: {line}")
                for line in result.privileges.warnings:
                    self.stdout.write(f"warning: {line}")
            self.stdout.write(
                f"{cluster.name}: token {result.token_id} in {result.token_file}, pool "
                f"{result.pool}, role {result.role} on {len(result.acl_paths)} path(s); "
                f"{len(result.changes)} change(s)"
            )
        if failed:
            raise CommandError("the new token lacks privileges proxyhub needs (listed above)")
