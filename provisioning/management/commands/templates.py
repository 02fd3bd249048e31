"""``manage.py templates build ...``: build a template from a cloud image (issue 14).

A thin door onto ``services.template_builds``: it checks the inputs and reads the node's
storages and the cluster's VMIDs (every refusal names its option, and nothing is written), then
journals one build per node for the workers. ``--wait`` follows the builds to their end;
``--json`` prints the result (``templateKey``, ``cluster``, ``node``/``nodes``,
``vmid``/``vmids``, ``storage``, ``imageVolume``, ``checksum``, ``templateVersion``,
``diskDevice``, ``sourceDiskGiB``, ``guestUser``, ``state``, and each node's build).
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from provisioning.models import Cluster, Operation
from provisioning.models.choices import ACTIVE_STATES, OperationState, RequestedVia
from provisioning.proxmox.build_inputs import DISK_DEVICES, InputProblem
from provisioning.proxmox.errors import ClassifiedError
from provisioning.services.template_builds import BuildSpec, build_result, template_build_start

POLL_SECONDS = 1.0


def _pause(seconds: float) -> None:
    """--wait's pause between looks at the journal (tests make the workers run here)."""
    time.sleep(seconds)


class Command(BaseCommand):
    help = (
        "templates build: the node downloads a cloud image (checksum verified), a VM is created "
        "with its disk imported, the agent on, a serial console and no Proxmox cloud-init drive, "
        "and converted to a template registered in the cluster's catalogue."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        build = sub.add_parser("build", help="build a template from a cloud image")
        build.add_argument("--cluster", required=True)
        build.add_argument("--node", required=True, help="the node that downloads and builds")
        build.add_argument("--image-url", required=True, help="http:// or https:// URL")
        build.add_argument("--checksum", required=True, help="ALGORITHM:HEX, e.g. sha256:…")
        build.add_argument("--vmid", required=True, type=int, help="the template's VMID")
        build.add_argument("--storage", required=True, help="storage for the disk (images)")
        build.add_argument("--key", required=True, help="the catalogue's image key")
        build.add_argument(
            "--template-version", required=True, help="revision label recorded (seed 003)"
        )
        build.add_argument(
            "--guest-user", required=True, help="the image's cloud-init default user, not root"
        )
        build.add_argument("--bridge", default="", help="net0's bridge (blank: no NIC)")
        build.add_argument(
            "--image-storage",
            default="",
            help="where the image is downloaded (blank: a storage on the node that accepts it)",
        )
        build.add_argument("--disk-device", default="scsi0", choices=DISK_DEVICES)
        build.add_argument(
            "--disk-gib", type=int, default=8, help="grow the imported disk to this size (4-4096)"
        )
        build.add_argument(
            "--all-nodes",
            action="store_true",
            help="local storage: one copy per node at VMIDs VMID, VMID+1, … in node order",
        )
        build.add_argument("--wait", action="store_true", help="wait for the builds to end")
        build.add_argument("--timeout", type=float, default=1800.0, help="--wait's limit (s)")
        build.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"--cluster {options['cluster']!r} is not a configured cluster")
        spec = BuildSpec(
            key=options["key"],
            node=options["node"],
            image_url=options["image_url"],
            checksum=options["checksum"],
            vmid=options["vmid"],
            storage=options["storage"],
            template_version=options["template_version"],
            guest_user=options["guest_user"],
            image_storage=options["image_storage"],
            bridge=options["bridge"],
            disk_device=options["disk_device"],
            disk_gib=options["disk_gib"],
            all_nodes=options["all_nodes"],
        )
        try:
            ops = template_build_start(
                cluster=cluster, spec=spec, user=None, via=RequestedVia.COMMAND
            )
        except InputProblem as err:
            raise CommandError(f"--{err}; nothing was written") from None
        except ClassifiedError as err:
            raise CommandError(f"cannot check the build on Proxmox: {err}") from None
        if options["wait"]:
            ops = self._wait(ops, options["timeout"])
        result = _result(ops)
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=2))
        else:
            for build in result["builds"]:
                self.stdout.write(
                    f"{build['templateKey']}\t{build['node']}\tVM {build['vmid']}\t"
                    f"{build['state']}\t{build['error'] or ''}".rstrip()
                )
        if result["state"] == OperationState.FAILED:
            raise CommandError("a build failed: " + "; ".join(b["error"] for b in result["builds"]))

    def _wait(self, ops: list[Operation], timeout: float) -> list[Operation]:
        deadline = time.monotonic() + timeout
        pks = [op.pk for op in ops]
        while True:
            rows = {op.pk: op for op in Operation.objects.filter(pk__in=pks)}
            current = [rows[pk] for pk in pks]
            if all(op.state not in ACTIVE_STATES for op in current):
                return current
            if time.monotonic() > deadline:
                raise CommandError(f"the builds did not end within {timeout:g} s; they go on")
            _pause(POLL_SECONDS)


def _result(ops: list[Operation]) -> dict[str, Any]:
    builds = [build_result(op) for op in ops]
    first = builds[0]
    states = {b["state"] for b in builds}
    state = next(
        (s for s in (OperationState.FAILED, *ACTIVE_STATES) if s in states),
        OperationState.SUCCEEDED,
    )
    return {
        **{k: v for k, v in first.items() if k not in ("operation", "error")},
        "nodes": [b["node"] for b in builds],
        "vmids": [b["vmid"] for b in builds],
        "state": str(state),
        "builds": builds,
    }
