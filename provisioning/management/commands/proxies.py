"""``manage.py proxies``: create, delete, list, wait for and power proxies (DESIGN.md §7), and
accept the VM found at a proxy whose identity does not match (seed 001).

A thin door onto ``provisioning.services.operations``: it parses, checks what an operator typed
(naming the proxy or the file path of every problem; for ``create``, in ``_proxy_specs``),
calls the service and reports. The work itself happens in the workers; ``wait`` only reads the
database.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from provisioning.models import Proxy
from provisioning.models.choices import ErrorClass, Phase, RequestedVia
from provisioning.proxmox.errors import ClassifiedError
from provisioning.services import dispatch, plan_confirmation
from provisioning.services.operations import (
    ProxySpec,
    proxies_create,
    proxy_accept_vm,
    proxy_power,
    proxy_request_delete,
)

from ._progress import Progress
from ._proxy_specs import cluster_named, names_for_count, specs_from_file, specs_from_flags

# ``wait`` polls the database this often; it drives no work itself.
POLL_SECONDS = 0.5
DEFAULT_TIMEOUT = 600.0
DELETED = "Deleted"
POWER_ACTIONS = ("start", "shutdown", "reboot")

CREATE_DESCRIPTION = """\
Create proxies, all in one transaction: every name and placement is checked first, and when
any is refused nothing is created. Three forms:

  proxies create NAME... --cluster C --machine-type M --image I [--zone Z] [--cloud-init FILE]
  proxies create --file FILE.yaml
      a YAML list of proxies with the keys name, cluster, machineType, image and optionally
      zone, cloudInit (the user-data inline) or cloudInitFile (a path, relative to FILE.yaml)
  proxies create --count N --prefix P --cluster C --machine-type M --image I ...
      creates P-1 .. P-N, numbers zero-padded to the width of N (P-01 .. P-20 for 20);
      refused when any of those names exists already

Refused whole when the request declares more than PROXYHUB_MAX_BULK_CREATE proxies, or would
take a cluster past its quotas (maxProxies, maxConcurrentCreates); the message names the limit.

Prints one line per proxy: its name and uid.

Confirming a plan (seed 003, issue 14):

  --dry-run [--json]   print each proxy's plan (node, template, size) and the plan set's
                       hash; no Proxmox call, nothing written. --json prints planHash, the
                       proxies' resolved plans and planSet (the document the hash is over).
  --plan-hash H        create only if the plan is still H; otherwise exit non-zero, nothing
                       written.
  --plan-file F        the JSON the dry run printed: as --plan-hash, and a refusal names what
                       changed (catalogue, placement, spec).
"""


def _confirmation(
    plan_hash: str | None, plan_file: str | None
) -> tuple[str, dict[str, Any] | None]:
    """The hash to commit against, and the shown plan set when a ``--plan-file`` gives one."""
    if plan_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", plan_hash):
        raise CommandError("--plan-hash must be 64 lower-case hexadecimal digits")
    if plan_file is None:
        assert plan_hash is not None
        return plan_hash, None
    try:
        with open(plan_file, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as err:
        raise CommandError(f"--plan-file {plan_file}: cannot be read as JSON ({err})") from err
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("planHash"), str)
        or not isinstance(data.get("planSet"), dict)
    ):
        raise CommandError(
            f"--plan-file {plan_file}: expected the JSON of `proxies create --dry-run --json` "
            "(with planHash and planSet)"
        )
    if plan_hash is not None and plan_hash != data["planHash"]:
        raise CommandError(
            f"--plan-hash {plan_hash} is not the planHash of --plan-file {plan_file}"
        )
    return data["planHash"], data["planSet"]


def _pause(seconds: float) -> None:
    """The wait between two polls (a seam: tests do the workers' work here instead)."""
    time.sleep(seconds)


class Command(BaseCommand):
    help = (
        "Manage proxies in bulk: create, delete, list, wait, start, shutdown, reboot, "
        "accept-vm. "
        "Run `manage.py proxies ACTION --help` for each action."
    )

    def run_from_argv(self, argv: list[str]) -> None:
        # A command line's run is a process of its own that ends with the command. Django's
        # setup leaves a heap whose first full collection took about 50 ms, and it came due
        # between an operation's commit and the publish of its step (issue 12's latency).
        # What the setup made lives as long as the process: it is kept out of every collection.
        # (call_command, in a long-lived process, does not come this way.)
        gc.freeze()
        super().run_from_argv(argv)

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, metavar="ACTION", title="actions"
        )

        create = actions.add_parser(
            "create",
            help="create proxies (NAME..., --file or --count)",
            description=CREATE_DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        create.add_argument("names", nargs="*", metavar="NAME", help="proxy names (DNS labels)")
        create.add_argument("--file", metavar="FILE.yaml", help="a YAML list of proxies")
        create.add_argument("--count", type=int, metavar="N", help="create N numbered proxies")
        create.add_argument("--prefix", metavar="P", help="name prefix for --count")
        create.add_argument("--cluster", metavar="C", help="the cluster to create them on")
        create.add_argument("--machine-type", metavar="M", help="a machine type of the cluster")
        create.add_argument("--image", metavar="I", help="a template key of the cluster")
        create.add_argument(
            "--zone", metavar="Z", default="", help="a node of the cluster; default: chosen"
        )
        create.add_argument("--cloud-init", metavar="FILE", help="user-data file, sent as is")
        create.add_argument(
            "--dry-run",
            action="store_true",
            help="print the plan and its hash; write nothing",
        )
        create.add_argument(
            "--json", action="store_true", help="with --dry-run: print the plan as JSON"
        )
        create.add_argument(
            "--plan-hash",
            metavar="H",
            help="create only if the plan is still H (the hash --dry-run printed)",
        )
        create.add_argument(
            "--plan-file",
            metavar="F",
            help="the JSON --dry-run --json printed: create only if the plan is still that "
            "one, and say what changed if not",
        )
        _key_option(create)

        delete = actions.add_parser(
            "delete",
            help="delete proxies and their VMs",
            description="Delete the named proxies, or --all (of --cluster C). Their VMs, disks "
            "and seed ISOs are removed by the workers, then the proxies disappear.",
        )
        delete.add_argument("names", nargs="*", metavar="NAME")
        delete.add_argument("--all", action="store_true", help="delete every proxy")
        delete.add_argument("--cluster", metavar="C", help="with --all: only this cluster's")
        _key_option(delete)

        listing = actions.add_parser(
            "list",
            help="list proxies",
            description="List every proxy. --json prints an array of objects with the keys "
            "name, uid, cluster, phase, providerId, vmid, node, ip, lastError, createdAt "
            "(when Proxmox created the VM, RFC 3339), drift (what differs from the VM's "
            "spec: a list of field, want, have; empty when in step) and identity (the VM's "
            "recorded smbiosUuid and vmgenid, checkedAt, and mismatch: true when the VM found "
            "is not the one recorded); what is not known yet is null.",
        )
        listing.add_argument("--json", action="store_true", help="print JSON")

        wait = actions.add_parser(
            "wait",
            help="wait until proxies reach a phase",
            description="Wait until the named proxies (default: every proxy that exists now) "
            "reach PHASE; with --phase Deleted, until they are gone. Exits 0 when reached, 1 on "
            "timeout or as soon as one is Failed. Reads the database every "
            f"{POLL_SECONDS:g} s; the workers do the work.",
        )
        wait.add_argument("names", nargs="*", metavar="NAME")
        wait.add_argument(
            "--phase", required=True, choices=[*Phase.values, DELETED], help="the phase to reach"
        )
        wait.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT,
            metavar="S",
            help=f"give up after S seconds (default {DEFAULT_TIMEOUT:g})",
        )

        for action, what in zip(
            POWER_ACTIONS, ("start", "gracefully shut down", "reboot"), strict=True
        ):
            power = actions.add_parser(
                action,
                help=f"{what} proxies' VMs",
                description=f"{what.capitalize()} the VMs of the named proxies, as journalled "
                "Proxmox tasks. When one is refused, none is touched.",
            )
            power.add_argument("names", nargs="+", metavar="NAME")
            _key_option(power)

        accept = actions.add_parser(
            "accept-vm",
            help="accept the VM found at proxies with an identity mismatch",
            description="Seed 001: the named proxies are Failed because the VM carrying their "
            "name and mark is not the one recorded (restored from a backup, or created again "
            "at the VMID). Accepting says it is theirs: its identity is recorded and each "
            "proxy is provisioned again on it (started if stopped, its seed ISO attached). "
            "Refused, and nothing done, when any named proxy shows no identity mismatch. "
            "--json prints an array of objects with the keys name and operation.",
        )
        accept.add_argument("names", nargs="+", metavar="NAME")
        accept.add_argument("--json", action="store_true", help="print JSON")
        _key_option(accept)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action not in ("list", "wait") and not options.get("dry_run"):
            # The step messages leave at commit; the producer gets ready meanwhile.
            dispatch.warm_sender()
        if action == "create":
            self._create(options)
        elif action == "delete":
            self._delete(options)
        elif action == "list":
            self._list(options)
        elif action == "wait":
            self._wait(options)
        elif action == "accept-vm":
            self._accept_vm(options)
        else:
            self._power(action, options["names"], options["idempotency_key"])

    # --- create ---------------------------------------------------------------------------

    def _create(self, options: Mapping[str, Any]) -> None:
        names, path, count = options["names"], options["file"], options["count"]
        if sum((bool(names), path is not None, count is not None)) != 1:
            raise CommandError(
                "give the proxies one way: NAME..., --file FILE.yaml, or --count N --prefix P"
            )
        if path is not None:
            flags = ("cluster", "machine_type", "image", "zone", "cloud_init", "prefix")
            given = ["--" + f.replace("_", "-") for f in flags if options[f]]
            if given:
                raise CommandError(
                    f"--file takes every setting from the file; drop {', '.join(given)}"
                )
            specs = specs_from_file(path)
        else:
            if count is not None:
                names = names_for_count(options["prefix"], count)
            elif options["prefix"]:
                raise CommandError("--prefix goes with --count N")
            specs = specs_from_flags(names, options)
        if options["json"] and not options["dry_run"]:
            raise CommandError("--json goes with --dry-run")
        if options["dry_run"]:
            if options["plan_hash"] or options["plan_file"]:
                raise CommandError("--dry-run writes nothing; drop --plan-hash and --plan-file")
            self._dry_run(specs, as_json=options["json"])
            return
        try:
            if options["plan_hash"] or options["plan_file"]:
                plan_hash, shown = _confirmation(options["plan_hash"], options["plan_file"])
                operations = plan_confirmation.commit(
                    specs,
                    plan_hash=plan_hash,
                    shown=shown,
                    via=RequestedVia.COMMAND,
                    idempotency_key=options["idempotency_key"],
                )
            else:
                operations = proxies_create(
                    specs=specs,
                    via=RequestedVia.COMMAND,
                    idempotency_key=options["idempotency_key"],
                )
        except ClassifiedError as err:
            raise CommandError(f"nothing was created: {err}") from err
        except ValidationError as err:
            raise CommandError(f"nothing was created: {_text(err)}") from err
        width = max(len(op.proxy_name) for op in operations)
        for op in operations:
            assert op.proxy is not None
            self.stdout.write(f"{op.proxy_name:<{width}}  {op.proxy.uid}")

    def _dry_run(self, specs: list[ProxySpec], *, as_json: bool) -> None:
        """The plan set (seed 003, issue 14): no Proxmox call, nothing written."""
        try:
            plan_set = plan_confirmation.plan_set_for(specs)
        except (ClassifiedError, ValueError) as err:
            raise CommandError(f"the plan cannot be made: {err}") from err
        if as_json:
            self.stdout.write(json.dumps(plan_set.as_dict(), indent=2))
            return
        width = max(len(name) for name, _ in plan_set.plans)
        for name, plan in plan_set.plans:
            self.stdout.write(
                f"{name:<{width}}  node {plan.node} ({plan.node_source})  template "
                f"{plan.template_vmid}  {plan.cores} cores {plan.memory_mib} MiB"
                + (f" {plan.disk_gib} GiB" if plan.disk_gib else "")
            )
        self.stdout.write(f"plan hash {plan_set.plan_hash}")
        self.stdout.write("nothing was created; run again with --plan-hash to create this plan")

    # --- delete ---------------------------------------------------------------------------

    def _delete(self, options: Mapping[str, Any]) -> None:
        names, everything, cluster = options["names"], options["all"], options["cluster"]
        if everything == bool(names):
            raise CommandError("give NAME... or --all (not both)")
        if cluster and not everything:
            raise CommandError("--cluster goes with --all")
        if everything:
            rows = Proxy.objects.all()
            if cluster:
                rows = rows.filter(cluster=cluster_named(cluster))
            proxies = list(rows.order_by("name"))
        else:
            proxies = _proxies_named(names)
        if not proxies:
            self.stdout.write("no proxies to delete")
            return
        progress = Progress(self.stdout, len(proxies))
        done = []
        with transaction.atomic():
            for index, proxy in enumerate(proxies, 1):
                key = _key(options["idempotency_key"], "delete", proxy.name)
                op = proxy_request_delete(
                    proxy=proxy, via=RequestedVia.COMMAND, idempotency_key=key
                )
                done.append((proxy, op))
                progress.update(index, "deleting")
        progress.finish()
        for proxy, op in done:
            progress.line(f"{proxy.name}  deleting  operation {op.pk}")
        self.stdout.write(f"deleting {_count(len(done), 'proxy', 'proxies')}")

    # --- list -----------------------------------------------------------------------------

    def _list(self, options: Mapping[str, Any]) -> None:
        rows = [_as_json(p) for p in Proxy.objects.select_related("cluster").order_by("name")]
        if options["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no proxies")
            return
        columns = (
            ("NAME", "name"),
            ("CLUSTER", "cluster"),
            ("PHASE", "phase"),
            ("NODE", "node"),
            ("VMID", "vmid"),
            ("IP", "ip"),
            ("CREATED", "createdAt"),
            ("LAST ERROR", "lastError"),
        )
        table = [[title for title, _ in columns]]
        for row in rows:
            cells = ["" if row[key] is None else str(row[key]) for _, key in columns]
            cells[-1] = _short(cells[-1], 60)
            table.append(cells)
        widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
        for cells in table:
            line = "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
            self.stdout.write(line.rstrip())

    # --- wait -----------------------------------------------------------------------------

    def _wait(self, options: Mapping[str, Any]) -> None:
        target, timeout = options["phase"], options["timeout"]
        if timeout < 0:
            raise CommandError("--timeout must not be negative")
        names = list(dict.fromkeys(options["names"]))
        if names and target != DELETED:
            _proxies_named(names)  # refuses unknown names at once
        if not names:
            names = list(Proxy.objects.order_by("name").values_list("name", flat=True))
        total = len(names)
        deadline = time.monotonic() + timeout
        progress = Progress(self.stdout, total)
        shown: int | None = None
        while True:
            rows = _phases(names, named=bool(options["names"]))
            if target == DELETED:
                reached = sum(name not in rows for name in names)
            else:
                reached = sum(rows.get(name, ("", ""))[0] == target for name in names)
            if reached != shown:
                progress.line(f"{reached}/{total} {target}")
                shown = reached
            progress.update(reached, target)
            if reached == total:
                progress.finish()
                return
            failed = [n for n in names if n in rows and rows[n][0] == Phase.FAILED]
            if failed and target != Phase.FAILED:
                progress.finish()
                detail = "; ".join(
                    f"{n}: {_short(rows[n][1], 200) or 'no error recorded'}" for n in failed
                )
                raise CommandError(f"{len(failed)} Failed, cannot reach {target}: {detail}")
            gone = [n for n in names if n not in rows]
            if gone and target != DELETED:
                progress.finish()
                raise CommandError(f"deleted while waiting for {target}: {', '.join(gone)}")
            left = deadline - time.monotonic()
            if left <= 0:
                progress.finish()
                behind = [n for n in names if not _at(rows, n, target)]
                raise CommandError(
                    f"timed out after {timeout:g} s: {reached}/{total} {target}; not yet: "
                    + _short(", ".join(f"{n} ({_where(rows, n)})" for n in behind), 400)
                )
            _pause(min(POLL_SECONDS, left))

    # --- power ----------------------------------------------------------------------------

    def _power(self, action: str, names: list[str], key: str | None) -> None:
        proxies = _proxies_named(names)
        progress = Progress(self.stdout, len(proxies))
        done, refused = [], []
        with transaction.atomic():
            for index, proxy in enumerate(proxies, 1):
                try:
                    op = proxy_power(
                        proxy=proxy,
                        action=action,
                        via=RequestedVia.COMMAND,
                        idempotency_key=_key(key, action, proxy.name),
                    )
                except ValidationError as err:
                    refused.append(f"{proxy.name}: {_text(err)}")
                else:
                    done.append((proxy, op))
                progress.update(index, action)
            if refused:
                progress.finish()
                raise CommandError(f"{action} refused, nothing was done: {'; '.join(refused)}")
        progress.finish()
        for proxy, op in done:
            progress.line(f"{proxy.name}  {action}  operation {op.pk}")
        self.stdout.write(f"{action}: {_count(len(done), 'proxy', 'proxies')}")

    # --- accept-vm (seed 001) ---------------------------------------------------------------

    def _accept_vm(self, options: Mapping[str, Any]) -> None:
        """The door the admin action "Accept the VM found…" also opens: one service call per
        proxy, all in one transaction, so one refusal leaves every proxy as it was."""
        proxies = _proxies_named(options["names"])
        key = options["idempotency_key"]
        done, refused = [], []
        with transaction.atomic():
            for proxy in proxies:
                if proxy.last_error_class != ErrorClass.IDENTITY:
                    refused.append(
                        f"{proxy.name}: shows no identity mismatch (phase {proxy.phase}); there "
                        "is no found VM to accept"
                    )
                    continue
                try:
                    op = proxy_accept_vm(
                        proxy=proxy,
                        via=RequestedVia.COMMAND,
                        idempotency_key=_key(key, "accept-vm", proxy.name),
                    )
                except ValidationError as err:
                    refused.append(f"{proxy.name}: {_text(err)}")
                else:
                    done.append((proxy, op))
            if refused:
                raise CommandError(f"accept-vm refused, nothing was done: {'; '.join(refused)}")
        if options["json"]:
            rows = [{"name": p.name, "operation": str(op.pk)} for p, op in done]
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for proxy, op in done:
            self.stdout.write(f"{proxy.name}  accept-vm  operation {op.pk}")
        self.stdout.write(f"accepted: {_count(len(done), 'proxy', 'proxies')}")


# --- helpers ----------------------------------------------------------------------------------


def _key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="run this command again with the same KEY (after a dropped connection, say) and "
        "it returns the operations the first run made instead of acting twice",
    )


def _key(key: str | None, action: str, name: str) -> str | None:
    """One proxy's key for ``action`` under the command's ``--idempotency-key``."""
    return f"{key}:{action}:{name}" if key else None


def _proxies_named(names: Iterable[str]) -> list[Proxy]:
    names = list(dict.fromkeys(names))
    found = {p.name: p for p in Proxy.objects.filter(name__in=names)}
    missing = [n for n in names if n not in found]
    if missing:
        raise CommandError(f"no proxy is named {', '.join(missing)}; nothing was done")
    return [found[n] for n in names]


def _phases(names: list[str], *, named: bool) -> dict[str, tuple[str, str]]:
    rows = Proxy.objects.filter(name__in=names) if named else Proxy.objects.all()
    wanted = set(names)
    return {
        name: (phase, error)
        for name, phase, error in rows.values_list("name", "phase", "last_error")
        if name in wanted
    }


def _at(rows: Mapping[str, tuple[str, str]], name: str, target: str) -> bool:
    return name not in rows if target == DELETED else rows.get(name, ("", ""))[0] == target


def _where(rows: Mapping[str, tuple[str, str]], name: str) -> str:
    return rows[name][0] if name in rows else "gone"


def _as_json(proxy: Proxy) -> dict[str, Any]:
    """One proxy in ``list --json``'s contract (DESIGN.md §7): exactly these keys; what is not
    known yet is null. ``createdAt`` is when Proxmox created the VM (from its mark, seed 000
    entry 8), as DESIGN.md §4 lists it among the observed fields. ``drift`` (issue 14, added
    beside the contract's keys) lists what differs from the VM's spec; ``identity`` is seed
    001's."""
    return {
        "name": proxy.name,
        "uid": str(proxy.uid),
        "cluster": proxy.cluster.name,
        "phase": proxy.phase,
        "providerId": proxy.provider_id or None,
        "vmid": proxy.vmid,
        "node": proxy.node or None,
        "ip": proxy.ip or None,
        "lastError": proxy.last_error or None,
        "createdAt": _rfc3339(proxy.vm_created_at),
        "drift": [
            {"field": d.get("field"), "want": d.get("want"), "have": d.get("have")}
            for d in proxy.drift or []
        ],
        # Seed 001 (issue 14, added beside the contract's keys): the identity recorded for the
        # VM, when a read last compared it, and whether the VM found is another one.
        "identity": {
            "smbiosUuid": proxy.smbios_uuid or None,
            "vmgenid": proxy.vmgenid or None,
            "checkedAt": _rfc3339(proxy.identity_checked_at),
            "mismatch": proxy.last_error_class == ErrorClass.IDENTITY,
        },
    }


def _rfc3339(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _text(err: ValidationError) -> str:
    if hasattr(err, "error_dict"):
        parts: list[str] = []
        for field, messages in err.message_dict.items():
            label = "" if field == "__all__" else f"{field}: "
            parts.extend(label + m for m in messages)
        return "; ".join(parts)
    return "; ".join(err.messages)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
