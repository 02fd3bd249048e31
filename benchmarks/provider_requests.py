"""Requests per create and per delete for the bare provider over the HTTPS simulator.

No Django, no worker, no journal: ``provisioning.proxmox.provider.Provider`` over the real
``HttpTransport`` against ``python -m pvesim --profile fast``, driven the way the service's
runner drives it: ``Provider.create_step`` to a running VM, then ``Provider.observe_boot`` (else
``Provider.get``) until the guest agent reports an address, then the seed release that follows
the address by default (issue 11: ``Provider.release_seed_step`` until done), then
``Provider.delete``. Counts come from the simulator's ledger, split into mutations
(POST/PUT/DELETE), polls (reads repeated while a task or a boot runs: task status, VM status,
guest agent) and other reads (listing, configs, task lists, storage). Issue 12's requests per
create are ``toRunning`` (create to Running with an address) and ``toRunningWithRelease``.

The create's polls depend on the poll interval (``Budgets.poll_interval``, 1 s by default,
the setting ``PROXYHUB_POLL_INTERVAL_SECONDS`` in the service) against the profile's task
durations, so the run is repeated for each ``--poll-interval`` given.

    .venv/bin/python benchmarks/provider_requests.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fleet import classify_request  # noqa: E402
from benchmarks.record import (  # noqa: E402
    Figure,
    append_report,
    git_commit,
    load_average,
    now_iso,
    record_latest,
    shown,
)
from provisioning.proxmox.api import Api  # noqa: E402
from provisioning.proxmox.budgets import Budgets  # noqa: E402
from provisioning.proxmox.config import ProxmoxConfig  # noqa: E402
from provisioning.proxmox.create import CreateRequest  # noqa: E402
from provisioning.proxmox.http import HttpTransport  # noqa: E402
from provisioning.proxmox.provider import Provider  # noqa: E402
from provisioning.proxmox.release import ReleaseRequest  # noqa: E402
from tests.integration.itstack import Simulator, start_simulator  # noqa: E402

INSTALLATION = "ph-benchmark"


def _split(entries: list[dict[str, Any]]) -> dict[str, int]:
    kinds = Counter(classify_request(e) for e in entries)
    return {
        "total": len(entries),
        "mutations": kinds["mutations"],
        "polls": kinds["polls"],
        "otherReads": kinds["other_reads"],
    }


def _provider(sim: Simulator, poll_interval: float) -> Provider:
    document = yaml.safe_load(sim.catalogue.read_text())
    for key in ("apiVersion", "kind"):
        document.pop(key, None)
    config = ProxmoxConfig.from_mapping(document, installation_id=INSTALLATION)
    transport = HttpTransport(config.url, str(sim.token_file), ca_file=str(sim.ca_file))
    return Provider(Api(transport), config, budgets=Budgets(poll_interval=poll_interval))


def measure(sim: Simulator, *, poll_interval: float, repeats: int) -> dict[str, Any]:
    provider = _provider(sim, poll_interval)
    by_endpoint: dict[str, dict[str, int]] = {}
    creates: list[dict[str, int]] = []
    addresses: list[dict[str, int]] = []
    deletes: list[dict[str, int]] = []
    releases: list[dict[str, int]] = []
    to_running: list[dict[str, int]] = []
    with_release: list[dict[str, int]] = []
    nodes = provider.config.nodes
    for i in range(repeats):
        uid = str(uuid.uuid4())
        name = f"proxy-prq-{poll_interval:g}-{i}".replace(".", "-")
        before = sim.last_seq()
        req = CreateRequest(
            uid=uid,
            vm_name=name,
            machine_type="small",
            image="debian-13",
            zone=nodes[i % len(nodes)],
            cloud_init=b"#cloud-config\n",
        )
        # Step by step, as the service's runner does, so the record is at hand for the boot
        # watch (``observe_boot``, else ``get``) that follows.
        record = provider.new_create_progress()
        while (created := provider.create_step(req, record)).status != "done":
            assert created.status != "error", created.error
            record = created.progress
            time.sleep(created.delay)
        provider_id, record = str(created.provider_id), created.progress
        after_create = sim.last_seq()
        while (
            provider.observe_boot(provider_id, record, uid=uid)
            or provider.get(provider_id, node=str(record["node"]))
        ).state != "Running":
            time.sleep(poll_interval)
        after_address = sim.last_seq()
        vmid = int(provider_id.split("/")[1])
        node = nodes[i % len(nodes)]
        release = ReleaseRequest(name, uid, vmid, node, node)
        progress = provider.new_release_progress()
        while (step := provider.release_seed_step(release, progress)).status != "done":
            assert step.status != "error", step.error
            progress = step.progress
            time.sleep(step.delay)
        after_release = sim.last_seq()
        provider.delete(provider_id, uid=uid)
        entries = sim.ledger(after=before)
        create_calls = [e for e in entries if e["seq"] <= after_create]
        delete_calls = [e for e in entries if e["seq"] > after_release]
        release_calls = [e for e in entries if after_address < e["seq"] <= after_release]
        creates.append(_split(create_calls))
        addresses.append(_split([e for e in entries if after_create < e["seq"] <= after_address]))
        to_running.append(_split([e for e in entries if e["seq"] <= after_address]))
        with_release.append(_split([e for e in entries if e["seq"] <= after_release]))
        releases.append(_split(release_calls))
        deletes.append(_split(delete_calls))
        by_endpoint = {
            "create": dict(Counter(str(e["key"]) for e in create_calls).most_common()),
            "seedRelease": dict(Counter(str(e["key"]) for e in release_calls).most_common()),
            "delete": dict(Counter(str(e["key"]) for e in delete_calls).most_common()),
        }
    close = getattr(provider.api.transport, "close", None)
    if close is not None:
        close()

    def mean(rows: list[dict[str, int]]) -> dict[str, float]:
        return {k: round(statistics.mean(r[k] for r in rows), 2) for k in rows[0]}

    return {
        "pollIntervalSeconds": poll_interval,
        "repeats": repeats,
        "create": mean(creates),
        "addressAfterCreate": mean(addresses),
        # Issue 12's requests per create: to Running with an address, and with the release.
        "toRunning": mean(to_running),
        "toRunningWithRelease": mean(with_release),
        "seedRelease": mean(releases),
        "delete": mean(deletes),
        "lastRepeatByEndpoint": by_endpoint,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--poll-interval", type=float, nargs="+", default=[1.0, 0.2])
    parser.add_argument("--repeats", type=int, default=6, help="creates (and deletes) per run")
    parser.add_argument("--out", type=Path, default=None, help="results file (JSON)")
    parser.add_argument(
        "--no-latest", action="store_true", help="do not merge the figures into latest.json"
    )
    args = parser.parse_args(argv)

    runs = []
    started = now_iso()
    # The code that runs is the checkout's at the start; files edited meanwhile are not in it.
    commit = git_commit()
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="proxyhub-prq-") as tmp:
        sim = start_simulator(Path(tmp) / "pvesim", profile="fast", log=Path(tmp) / "sim.log")
        try:
            for interval in args.poll_interval:
                run = measure(sim, poll_interval=interval, repeats=args.repeats)
                runs.append(run)
                c, a, d = run["create"], run["addressAfterCreate"], run["delete"]
                r = run["seedRelease"]
                t, w = run["toRunning"], run["toRunningWithRelease"]
                print(
                    f"poll {interval:g} s: to Running {t['total']:.1f} requests "
                    f"({t['mutations']:.1f} mutations, {t['polls']:.1f} polls, "
                    f"{t['otherReads']:.1f} other reads), {w['total']:.1f} with the seed release"
                )
                print(
                    f"poll {interval:g} s: create {c['total']:.1f} requests "
                    f"({c['mutations']:.1f} mutations, {c['polls']:.1f} polls, "
                    f"{c['otherReads']:.1f} other reads); then {a['total']:.1f} reads until "
                    f"the address; seed release {r['total']:.1f} ({r['mutations']:.1f} "
                    f"mutations, {r['polls']:.1f} polls); delete {d['total']:.1f} "
                    f"({d['mutations']:.1f} mutations, "
                    f"{d['polls']:.1f} polls, {d['otherReads']:.1f} other reads)"
                )
        finally:
            sim.stop()
    report = {
        "benchmark": "provider_requests",
        "date": started,
        "commit": commit,
        "loadAverage": {"before": load_before, "after": load_average()},
        "profile": "fast",
        "runs": runs,
    }
    out = append_report("provider-requests", report, args.out)
    if not args.no_latest:
        figures: dict[str, Figure] = {}
        for run in runs:
            interval = f"{run['pollIntervalSeconds']:g}s"
            for what, key in (
                ("toRunning", "create_to_running"),
                ("toRunningWithRelease", "create_with_release"),
                ("create", "create"),
                ("seedRelease", "seed_release"),
                ("delete", "delete"),
            ):
                split = run[what]
                figures[f"provider_{key}_requests_poll_{interval}"] = Figure(
                    split["total"],
                    None,  # no issue sets a ceiling; the README explains each request
                    "requests",
                    {
                        "mutations": split["mutations"],
                        "polls": split["polls"],
                        "otherReads": split["otherReads"],
                        "repeats": run["repeats"],
                    },
                )
        record_latest(figures, measured_at=started, commit=commit)
    print(f"results appended to {shown(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
