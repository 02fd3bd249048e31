"""A Django script the integration tests run as a child with the stack's environment.

It reads what no management command prints (the operation journal) and does what only code
can do (send a step message again with the operation's current token, as a broker that
redelivers would). It prints one JSON document on stdout.

    python tests/integration/probe.py journal PREFIX
    python tests/integration/probe.py timing PREFIX [--kind delete]
    python tests/integration/probe.py operations PREFIX [--kind create]
    python tests/integration/probe.py duplicate PREFIX --copies 2 --seconds 60
    python tests/integration/probe.py proxies PREFIX
    python tests/integration/probe.py forget-cluster NAME
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proxyhub.settings.production")
    import django

    django.setup()
    import proxyhub.celery  # noqa: F401  (the Celery app, configured from settings)


def journal(prefix: str) -> list[dict[str, Any]]:
    """Every operation for proxies whose name starts with ``prefix``, with its steps."""
    from provisioning.models import Operation

    out = []
    for op in Operation.objects.filter(proxy_name__startswith=prefix).order_by("created_at"):
        out.append(
            {
                "id": str(op.pk),
                "kind": str(op.kind),
                "state": str(op.state),
                "proxyName": op.proxy_name,
                "via": str(op.requested_via),
                "lastError": op.last_error,
                "attempts": op.attempts,
                "faults": op.faults,
                "steps": [
                    [s.name, str(s.state), s.upid]
                    for s in op.steps.order_by("seq").only("name", "state", "upid")
                ],
            }
        )
    return out


def timing(prefix: str, kind: str = "create") -> dict[str, Any]:
    """When the prefix's operations of ``kind`` were asked for and when the last one finished
    (for a create: the proxy Running with its address; for a delete: the VM and its seed gone),
    as epoch seconds from the journal's own timestamps."""
    from django.db.models import Count, Max, Min

    from provisioning.models import Operation

    ops = Operation.objects.filter(proxy_name__startswith=prefix, kind=kind)
    span = ops.aggregate(first=Min("created_at"), last=Max("finished_at"), count=Count("pk"))
    states = dict(ops.values_list("state").annotate(n=Count("pk")).values_list("state", "n"))
    return {
        "count": span["count"],
        "states": states,
        "firstCreated": span["first"].timestamp() if span["first"] else None,
        "lastFinished": span["last"].timestamp() if span["last"] else None,
    }


def operations(prefix: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Every operation of the prefix (of ``kind`` when given) with its counters and the timing
    of each step, as epoch seconds: where an operation's time went (the benchmarks read it)."""
    from provisioning.models import Operation

    def epoch(value: Any) -> float | None:
        return value.timestamp() if value is not None else None

    ops = Operation.objects.filter(proxy_name__startswith=prefix)
    if kind:
        ops = ops.filter(kind=kind)
    out = []
    for op in ops.order_by("created_at").prefetch_related("steps"):
        out.append(
            {
                "id": str(op.pk),
                "kind": str(op.kind),
                "state": str(op.state),
                "proxyName": op.proxy_name,
                "clusterId": op.cluster_id,
                "attempts": op.attempts,
                "faults": op.faults,
                "redispatches": op.redispatches,
                "lastError": op.last_error,
                "createdAt": epoch(op.created_at),
                "startedAt": epoch(op.started_at),
                "finishedAt": epoch(op.finished_at),
                "steps": [
                    {
                        "name": s.name,
                        "state": str(s.state),
                        "startedAt": epoch(s.started_at),
                        "finishedAt": epoch(s.finished_at),
                        "message": s.message,
                    }
                    for s in sorted(op.steps.all(), key=lambda s: s.seq)
                ],
            }
        )
    return out


def proxies(prefix: str) -> list[dict[str, Any]]:
    """What ``proxies list --json`` leaves out: what the operator asked for (``desired_*``)."""
    from provisioning.models import Proxy

    rows = Proxy.objects.filter(name__startswith=prefix).order_by("name")
    return [
        {
            "name": p.name,
            "phase": str(p.phase),
            "desiredState": str(p.desired_state),
            "desiredPower": str(p.desired_power),
            "vmid": p.vmid,
            "providerId": p.provider_id,
        }
        for p in rows
    ]


def forget_cluster(name: str, seconds: float = 30.0) -> dict[str, int]:
    """Remove a cluster that never answered, with its proxies and their operations, from the
    database only: nothing of it exists on any Proxmox, and a delete would wait out its breaker.

    Its operations are ended first, so no delivery takes one again; the one a worker may be
    running (the breaker's probe, waiting out its timeout) is let finish, so it does not write
    its journal entry for a row that is gone.
    """
    from django.db import transaction
    from django.utils import timezone

    from provisioning.models import Cluster, Operation, Proxy
    from provisioning.models.choices import OperationState

    ops = Operation.objects.filter(cluster__name=name)
    ops.update(state=OperationState.FAILED, dispatch_token="", next_step_at=None)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not ops.exclude(claim_token="").filter(claim_expires_at__gte=timezone.now()).exists():
            break
        time.sleep(0.2)
    time.sleep(1.0)  # the delivery records the cluster's reachability just after its claim
    with transaction.atomic():
        _, gone = ops.delete()
        _, proxies = Proxy.objects.filter(cluster__name=name).delete()
        _, clusters = Cluster.objects.filter(name=name).delete()
    return {**gone, **proxies, **clusters}


def duplicate(prefix: str, copies: int, seconds: float, interval: float) -> dict[str, int]:
    """Keep sending ``copies`` extra messages for every in-flight step of the prefix's
    operations, with the token the driver expects, until none is left or time is up.

    Each duplicate is a real message through Redis to whichever worker takes it, so two
    workers regularly receive the same step at the same moment.
    """
    from provisioning.models import Operation
    from provisioning.models.choices import ACTIVE_STATES
    from provisioning.tasks import run_step

    sent = rounds = idle = 0
    seen: set[tuple[str, str]] = set()
    began = False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = list(
            Operation.objects.filter(
                proxy_name__startswith=prefix, state__in=ACTIVE_STATES
            ).values_list("pk", "dispatch_token")
        )
        began = began or bool(rows)
        idle = 0 if rows else idle + 1
        if began and idle >= 10:  # two seconds with nothing in flight: the work is over
            break
        for pk, token in rows:
            if not token or (str(pk), token) in seen:
                continue
            seen.add((str(pk), token))
            for _ in range(copies):
                run_step.apply_async(kwargs={"operation_id": str(pk), "token": token})
                sent += 1
        rounds += 1
        time.sleep(interval)
    return {"sent": sent, "tokens": len(seen), "rounds": rounds}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="probe.py")
    sub = parser.add_subparsers(dest="action", required=True)
    j = sub.add_parser("journal")
    j.add_argument("prefix")
    t = sub.add_parser("timing")
    t.add_argument("prefix")
    t.add_argument("--kind", default="create")
    o = sub.add_parser("operations")
    o.add_argument("prefix")
    o.add_argument("--kind", default=None)
    d = sub.add_parser("duplicate")
    d.add_argument("prefix")
    d.add_argument("--copies", type=int, default=2)
    d.add_argument("--seconds", type=float, default=60.0)
    d.add_argument("--interval", type=float, default=0.2)
    sub.add_parser("proxies").add_argument("prefix")
    sub.add_parser("forget-cluster").add_argument("name")
    args = parser.parse_args(argv)
    _setup()
    if args.action == "journal":
        result: Any = journal(args.prefix)
    elif args.action == "timing":
        result = timing(args.prefix, args.kind)
    elif args.action == "operations":
        result = operations(args.prefix, args.kind)
    elif args.action == "proxies":
        result = proxies(args.prefix)
    elif args.action == "forget-cluster":
        result = forget_cluster(args.name)
    else:
        result = duplicate(args.prefix, args.copies, args.seconds, args.interval)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
