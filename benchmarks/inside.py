"""The suite's Django side: a script run as a child with the stack's environment (like
tests/integration/probe.py), printing one JSON document on stdout.

    python benchmarks/inside.py installation-id
    python benchmarks/inside.py seed-proxies FILE          # starting state only (README)
    python benchmarks/inside.py send TASK_NAME             # through the broker, as Beat does
    python benchmarks/inside.py ping WORKER --count 50      # Celery round trips over Redis
    python benchmarks/inside.py changelist --proxies N --repeat 20
    python benchmarks/inside.py profile gc|reconcile|changelist [--top 25]

``seed-proxies`` and the first part of ``changelist`` write rows straight into the database:
they build a starting state that would take hours through the real path (2,000 Running proxies,
100,000 proxies). What is measured afterwards (a reconcile round, a GC sweep, the changelist
page) runs the product's own code: the worker's task, the admin's view.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Seeded proxies' uids: recognisable, and derivable from their index by the simulator's
# ``create_vms`` description template (``{i:012d}``), so the VM's mark names its proxy's uid.
SEED_UID = "00000000-0000-4000-8000-{i:012d}"


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proxyhub.settings.production")
    import django

    django.setup()


def installation_id() -> dict[str, str]:
    """This installation's id (created on first use, as the product does) and the mark of a
    seeded VM as the product writes it, its uid left as ``create_vms``'s ``{i}`` template."""
    from datetime import timedelta

    from django.utils import timezone

    from provisioning.proxmox.marks import render_mark
    from provisioning.services.installation import installation_id as current

    ours = current()
    # A day old: older than GC's minimum age, as a fleet that has run for a while.
    mark = render_mark(SEED_UID, timezone.now() - timedelta(days=1), ours)
    return {"installationId": ours, "mark": mark}


def seed_proxies(spec_file: Path) -> dict[str, Any]:
    """Proxy rows, Running with an address, for VMs the simulator already holds. ``spec_file``
    is a JSON object: ``cluster`` (name), ``vms`` ([{index, vmid, name, node}]) where ``name``
    is the VM's (``proxy-<proxy name>``) and ``index`` the ``{i}`` of its mark's uid."""
    from django.utils import timezone

    from provisioning.models import Cluster, Proxy
    from provisioning.models.choices import Phase
    from provisioning.proxmox.ids import format_provider_id

    spec = json.loads(spec_file.read_text())
    cluster = Cluster.objects.get(name=spec["cluster"])
    now = timezone.now()
    rows = []
    for vm in spec["vms"]:
        i, vmid = int(vm["index"]), int(vm["vmid"])
        rows.append(
            Proxy(
                name=str(vm["name"]).removeprefix("proxy-"),
                uid=uuid.UUID(SEED_UID.format(i=i)),
                cluster=cluster,
                machine_type="small",
                image="debian-13",
                phase=Phase.RUNNING,
                provider_id=format_provider_id(vmid, str(vm["name"])),
                vmid=vmid,
                node=str(vm["node"]),
                ip=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
                vm_created_at=now,
                observed_at=now,
            )
        )
    Proxy.objects.bulk_create(rows, batch_size=1000)
    return {"proxies": len(rows)}


def send(task: str) -> dict[str, Any]:
    """Send ``task`` through the broker with the product's routes (as Beat sends it)."""
    from proxyhub.celery import app

    result = app.send_task(task)
    return {"taskId": result.id, "sentAt": time.time()}


def ping(worker: str, count: int) -> dict[str, Any]:
    """``count`` Celery control pings to one worker over the Redis broker: each one a message
    to the worker's mailbox and its reply back, the broker's round trip with a live worker."""
    from proxyhub.celery import app

    times: list[float] = []
    missed = 0
    for _ in range(count):
        started = time.perf_counter()
        replies = app.control.ping(destination=[worker], timeout=5.0)
        elapsed = (time.perf_counter() - started) * 1000
        if replies:
            times.append(elapsed)
        else:
            missed += 1
    return {"roundTripsMs": [round(t, 3) for t in times], "missed": missed}


def changelist(proxies: int, repeat: int) -> dict[str, Any]:
    """The proxy changelist at ``proxies`` proxies: queries and milliseconds per page load,
    ``repeat`` loads by a signed-in superuser through Django's request handler."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from provisioning.models import Cluster, Proxy
    from provisioning.models.choices import Phase

    cluster = Cluster.objects.first()
    if cluster is None:
        raise SystemExit("no cluster imported")
    have = Proxy.objects.count()
    seeded_started = time.perf_counter()
    nodes = ["pve1", "pve2", "pve3"]
    phases = [Phase.RUNNING] * 8 + [Phase.PROVISIONING, Phase.STOPPED]
    batch: list[Proxy] = []
    for i in range(have, proxies):
        batch.append(
            Proxy(
                name=f"adm-{i:06d}",
                cluster=cluster,
                machine_type="small",
                image="debian-13",
                phase=phases[i % len(phases)],
                provider_id=f"vms/{200000 + i}/proxy-adm-{i:06d}",
                vmid=200000 + i,
                node=nodes[i % len(nodes)],
                ip=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            )
        )
        if len(batch) == 5000:
            Proxy.objects.bulk_create(batch)
            batch = []
    if batch:
        Proxy.objects.bulk_create(batch)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh statistics, as autovacuum gives a table this size
    seeded = time.perf_counter() - seeded_started
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    url = reverse("admin:provisioning_proxy_changelist")
    loads: list[dict[str, Any]] = []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url, secure=True)
            ms = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise SystemExit(f"changelist answered {response.status_code}")
        loads.append({"ms": round(ms, 2), "queries": len(queries.captured_queries)})
    slowest = max(queries.captured_queries, key=lambda q: float(q["time"]), default=None)
    return {
        "proxies": Proxy.objects.count(),
        "seedSeconds": round(seeded, 1),
        "vendor": connection.vendor,
        "loads": loads,
        "lastLoadQueries": [
            {"ms": round(float(q["time"]) * 1000, 2), "sql": q["sql"][:300]}
            for q in queries.captured_queries
        ],
        "slowestQuery": slowest["sql"][:300] if slowest else None,
    }


def profile(target: str, top: int) -> dict[str, Any]:
    """Where the time of one GC plan, one reconcile round or one changelist load goes, under
    cProfile in this process (the same service code the worker and the admin run; for finding
    the cost, not for the figures). The ``top`` functions by cumulative and by own time."""
    import cProfile
    import io
    import pstats

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from provisioning.services.gc import gc_run
    from provisioning.services.reconcile import reconcile_round

    work: Any
    if target == "gc":

        def work() -> None:
            gc_run(dry_run=True, via="command")
    elif target == "reconcile":
        work = reconcile_round
    else:
        user = get_user_model().objects.get(username="bench-admin")
        client = Client(HTTP_HOST="127.0.0.1")
        client.force_login(user)
        url = reverse("admin:provisioning_proxy_changelist")

        def work() -> None:
            client.get(url, secure=True)

    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(work)
    seconds = time.perf_counter() - started
    out: dict[str, Any] = {"target": target, "seconds": round(seconds, 3)}
    for key in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
        out[key] = text.getvalue()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("installation-id")
    p = sub.add_parser("seed-proxies")
    p.add_argument("spec", type=Path)
    p = sub.add_parser("send")
    p.add_argument("task")
    p = sub.add_parser("ping")
    p.add_argument("worker")
    p.add_argument("--count", type=int, default=50)
    p = sub.add_parser("changelist")
    p.add_argument("--proxies", type=int, required=True)
    p.add_argument("--repeat", type=int, default=20)
    p = sub.add_parser("profile")
    p.add_argument("target", choices=["gc", "reconcile", "changelist"])
    p.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    _setup()
    if args.command == "installation-id":
        out: Any = installation_id()
    elif args.command == "seed-proxies":
        out = seed_proxies(args.spec)
    elif args.command == "send":
        out = send(args.task)
    elif args.command == "ping":
        out = ping(args.worker, args.count)
    elif args.command == "changelist":
        out = changelist(args.proxies, args.repeat)
    else:
        out = profile(args.target, args.top)
    # Django's logging writes JSON lines to stdout as well: the document is the last line.
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
