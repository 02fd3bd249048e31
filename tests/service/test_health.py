"""Node health (issue 6, seed 000 entry 16): rounds, results, history, command, placement.

Every cluster's provider talks to the in-process simulator through a transport that, like the
HTTPS client, sends whatever the cluster's token file holds on every request, so a wrong or
missing token file behaves as it does in production. The certificate case runs the real HTTPS
client against the HTTPS simulator on loopback.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import trustme
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from pump import Pump, Sim, make_cluster

from healthchecks import services, tasks
from healthchecks.models import NodeHealth
from healthchecks.services import (
    check_cluster,
    check_round,
    clusters_without_ready_node,
    latest_for_cluster,
    prune_history,
    ready_nodes,
)
from provisioning.models import Node, Proxy, Template
from provisioning.proxmox.api import Call, Response
from provisioning.proxmox.budgets import Budgets
from provisioning.proxmox.credentials import read_token
from provisioning.proxmox.deadline import Deadline
from provisioning.proxmox.errors import TransientError
from provisioning.services import operations
from provisioning.services.operations import ProxySpec
from provisioning.services.placement import choose_node
from provisioning.services.providers import use_transport_factory
from pvesim.server import SimServer
from pvesim.simulator import Simulator
from tests.support.simtransport import SimTransport

pytestmark = pytest.mark.django_db

GIB = 1024**3
MIB = 1024**2
CANARY = "canary-7f3e9b21-secret-must-never-show"

# A hook called before each request: (cluster name, call, the request's deadline).
Hook = Callable[[str, Call, Deadline | None], None]


class FileTokenTransport(SimTransport):
    """The simulator behind a transport that reads the cluster's token file on every request,
    as ``HttpTransport`` does, with an optional hook to hold requests back."""

    def __init__(self, engine: Simulator, cluster: str, token_file: str, hooks: list[Hook]) -> None:
        super().__init__(engine)
        self.cluster = cluster
        self.token_file = token_file
        self.hooks = hooks

    @property
    def token(self) -> str:
        token = read_token(self.token_file)
        return f"{token.token_id}={token.secret}"

    def send(self, call: Call, *, deadline: Deadline | None) -> Response:
        for hook in self.hooks:
            hook(self.cluster, call, deadline)
        return super().send(call, deadline=deadline)


@dataclass
class Health:
    sim: Sim
    token_file: Path
    hooks: list[Hook] = field(default_factory=list)

    @property
    def engine(self) -> Simulator:
        return self.sim.engine

    def write_token(self, secret: str | None = None) -> None:
        token = self.engine.token if secret is None else f"{self.engine.token_id}={secret}"
        self.token_file.write_text(token + "\n")

    def by_node(self, rows: list[NodeHealth]) -> dict[str, NodeHealth]:
        return {row.node: row for row in rows}


@pytest.fixture
def health(sim: Sim, tmp_path: Path) -> Iterator[Health]:
    """``sim`` with a real token file, read per request; the engine's secret is the canary."""
    sim.engine.set_token_secret(CANARY)
    state = Health(sim, tmp_path / "token")
    state.write_token()
    sim.cluster.token_file = str(state.token_file)
    sim.cluster.save()

    def factory(config: Any) -> FileTokenTransport:
        return FileTokenTransport(sim.engine, config.name, config.token_file, state.hooks)

    with use_transport_factory(factory, budgets=Budgets(poll_interval=0.02)):
        yield state


# --- rounds and reasons -----------------------------------------------------------------------


def test_a_round_reports_every_node_ready_in_config_order(health: Health) -> None:
    cluster = health.sim.cluster
    # Config order is not alphabetical: pve3, pve1, pve2.
    for position, name in enumerate(["pve3", "pve1", "pve2"]):
        Node.objects.filter(cluster=cluster, name=name).update(position=position)
    cluster.save()

    rows = check_round()

    assert [(r.node, r.reason, r.ready) for r in rows] == [
        ("pve3", "Reachable", True),
        ("pve1", "Reachable", True),
        ("pve2", "Reachable", True),
    ]
    assert [r.node for r in latest_for_cluster(cluster)] == ["pve3", "pve1", "pve2"]
    assert ready_nodes(cluster) == ["pve3", "pve1", "pve2"]
    details = rows[0].details
    assert details["tokenID"] == health.engine.token_id
    assert details["isoStorage"] == "proxy-seeds"
    assert details["templates"] == "3/3"
    assert details["pveVersion"] and details["kernel"].endswith("-pve")
    assert details["isoStorageAvailGiB"] > 0
    # Entry 16's cost: four requests per node, counted by the simulator.
    assert len(health.engine.ledger.calls()) == 12
    status = health.sim.api.node_status("pve3")
    assert details["memFreeBytes"] == status["memory"]["available"]


def _missing_template(health: Health) -> None:
    Template.objects.create(cluster=health.sim.cluster, key="gone", vmid=9876)
    health.sim.cluster.save()


def _drop_storage(node: str) -> Callable[[Health], None]:
    def arrange(health: Health) -> None:
        with health.engine.lock:
            health.engine.cluster.nodes[node].storages.pop("proxy-seeds")

    return arrange


def _no_iso_content(health: Health) -> None:
    with health.engine.lock:
        health.engine.cluster.nodes["pve2"].storages["proxy-seeds"].content = ("images",)


def _missing_token_file(health: Health) -> None:
    health.token_file.unlink()


# case -> (arrange, the reason of each node pve1..pve3, a fragment of the failing message)
REASONS: dict[str, tuple[Callable[[Health], object], tuple[str, str, str], str]] = {
    "bad token": (
        lambda h: h.write_token("wrong-" + CANARY),
        ("Unauthorized",) * 3,
        "fix the token file",
    ),
    "missing token file": (
        _missing_token_file,
        ("CredentialsUnavailable",) * 3,
        "does not exist",
    ),
    "missing iso storage": (
        _drop_storage("pve2"),
        ("Reachable", "StorageNotFound", "Reachable"),
        "fix the storage on the node",
    ),
    "storage without iso content": (
        _no_iso_content,
        ("Reachable", "StorageNotFound", "Reachable"),
        "does not allow ISO content",
    ),
    "missing template": (
        _missing_template,
        ("TemplateNotFound",) * 3,
        "template gone (VMID 9876) does not exist",
    ),
    "node offline": (
        lambda h: h.engine.control.node_offline("pve3"),
        ("Reachable", "Reachable", "Unreachable"),
        "bring the node back",
    ),
    "privilege missing": (
        lambda h: h.engine.control.deny("/nodes/pve1", "Sys.Audit"),
        ("Forbidden", "Reachable", "Reachable"),
        "lacks Sys.Audit on /nodes/pve1",
    ),
    "proxmox error": (
        # Every read of every node's status fails, the in-place retries included.
        lambda h: h.engine.control.fail_call("GET", "/nodes/{node}/status", times=12),
        ("APIError",) * 3,
        "Proxmox answered 500",
    ),
}


@pytest.mark.parametrize("case", list(REASONS), ids=list(REASONS))
def test_each_failure_is_reported_with_its_reason(
    case: str, health: Health, caplog: pytest.LogCaptureFixture
) -> None:
    arrange, reasons, says = REASONS[case]
    caplog.set_level(logging.DEBUG)
    arrange(health)

    rows = check_round()

    assert [(r.node, r.reason) for r in rows] == list(
        zip(["pve1", "pve2", "pve3"], reasons, strict=True)
    )
    assert all(r.ready is (r.reason == "Reachable") for r in rows)
    failing = [r for r in rows if not r.ready]
    assert failing and all(says in r.message for r in failing), [r.message for r in failing]
    assert ready_nodes(health.sim.cluster) == [r.node for r in rows if r.ready]
    assert all(r.details["isoStorage"] == "proxy-seeds" for r in rows)
    # The token's secret (the canary) is nowhere: not in a stored row, not in a log line.
    stored = json.dumps(list(NodeHealth.objects.values()), default=str)
    assert CANARY not in stored
    assert CANARY not in caplog.text


def test_a_node_beyond_the_deadline_times_out_while_the_others_report(health: Health) -> None:
    def slow_pve2(cluster: str, call: Call, deadline: Deadline | None) -> None:
        if call.path_params.get("node") == "pve2":
            (deadline or Deadline(5)).sleep(5)  # ends with the round's deadline

    health.hooks.append(slow_pve2)

    rows = check_round(deadline_seconds=0.5)

    assert [(r.node, r.reason) for r in rows] == [
        ("pve1", "Reachable"),
        ("pve2", "Timeout"),
        ("pve3", "Reachable"),
    ]
    timed_out = rows[1]
    assert "ran out of time while reading the status of node pve2" in timed_out.message
    # What it had learnt before the slow request is kept.
    assert timed_out.details["pveVersion"]


def test_a_slow_cluster_never_holds_back_another_clusters_results(
    health: Health, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "a-slow" is checked first (name order); its requests wait until the other cluster's
    # results have been stored. Checked one after the other, it would run out of time.
    slow = make_cluster("a-slow", nodes=("pve1",))
    slow.token_file = str(health.token_file)
    slow.save()
    stored = threading.Event()

    def hold_slow(cluster: str, call: Call, deadline: Deadline | None) -> None:
        if cluster == "a-slow":
            assert stored.wait(10), "the other cluster's results were not stored meanwhile"

    health.hooks.append(hold_slow)
    record = services._record

    def record_and_signal(checked: Any) -> list[NodeHealth]:
        rows = record(checked)
        if checked.prepared.cluster.name == "pvesim":
            stored.set()
        return rows

    monkeypatch.setattr(services, "_record", record_and_signal)

    rows = check_round(deadline_seconds=10)

    assert [(r.cluster.name, r.node, r.reason) for r in rows] == [
        ("a-slow", "pve1", "Reachable"),
        ("pvesim", "pve1", "Reachable"),
        ("pvesim", "pve2", "Reachable"),
        ("pvesim", "pve3", "Reachable"),
    ]


def test_a_token_file_imported_before_it_exists_checks_unavailable_until_it_lands(
    health: Health, tmp_path: Path
) -> None:
    from provisioning.services.catalogue_import import catalogue_import

    token_file = tmp_path / "later" / "token"
    report = catalogue_import(
        [
            {
                "apiVersion": "proxyhub/v1",
                "kind": "ProxmoxCluster",
                "name": "later",
                "url": "https://127.0.0.1:8006",
                "tokenFile": str(token_file),
                "nodes": ["pve1", "pve2"],
                "isoStorage": "proxy-seeds",
                "templates": {"debian-13": {"vmid": 9000}},
                "machineTypes": {"small": {"cores": 1, "memoryMiB": 1024}},
            }
        ]
    )
    assert any("does not exist yet" in warning for warning in report.warnings)

    rows = check_round(cluster_names=["later"])
    assert [(r.node, r.reason) for r in rows] == [
        ("pve1", "CredentialsUnavailable"),
        ("pve2", "CredentialsUnavailable"),
    ]
    assert "fix the token file, not Proxmox" in rows[0].message
    assert health.engine.ledger.calls() == []  # no request without a token

    # The secret lands: the next round is ready, with no restart and no re-import.
    token_file.parent.mkdir()
    token_file.write_text(health.engine.token + "\n")
    rows = check_round(cluster_names=["later"])
    assert [(r.node, r.reason) for r in rows] == [("pve1", "Reachable"), ("pve2", "Reachable")]


def test_a_foreign_ca_is_certificate_invalid_over_https(tmp_path: Path) -> None:
    ca, foreign = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "server.pem", tmp_path / "server-key.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    foreign.cert_pem.write_to_path(str(tmp_path / "foreign.pem"))
    engine = Simulator(profile="instant", token_secret=CANARY)
    (tmp_path / "token").write_text(engine.token + "\n")

    with SimServer(engine, certfile=str(cert), keyfile=str(key)) as server:
        cluster = make_cluster("https", nodes=("pve1",))
        cluster.url = server.url
        cluster.token_file = str(tmp_path / "token")
        cluster.ca_file = str(tmp_path / "foreign.pem")
        cluster.save()
        [row] = check_cluster(cluster, deadline_seconds=10)
        assert (row.reason, row.ready) == ("CertificateInvalid", False)
        assert "fix caFile or url" in row.message
        assert CANARY not in row.message

        # The same cluster with the right CA is ready: the CA was the only thing wrong.
        cluster.ca_file = str(tmp_path / "ca.pem")
        cluster.save()
        [row] = check_cluster(cluster, deadline_seconds=10)
        assert row.reason == "Reachable"
    assert [r.reason for r in latest_for_cluster(cluster)] == ["Reachable"]


# --- latest, history, selectors ---------------------------------------------------------------


def test_latest_moves_to_the_newest_round_and_history_is_kept(health: Health) -> None:
    cluster = health.sim.cluster
    check_round()
    health.engine.control.node_offline("pve3")
    check_round()

    assert NodeHealth.objects.filter(cluster=cluster).count() == 6
    assert [(r.node, r.reason) for r in latest_for_cluster(cluster)] == [
        ("pve1", "Reachable"),
        ("pve2", "Reachable"),
        ("pve3", "Unreachable"),
    ]
    assert clusters_without_ready_node() == []

    for node in ("pve1", "pve2"):
        health.engine.control.node_offline(node)
    check_round()
    assert clusters_without_ready_node() == [cluster]
    assert ready_nodes(cluster) == []


def test_a_round_that_started_earlier_does_not_overtake_a_newer_result(health: Health) -> None:
    cluster = health.sim.cluster
    check_round()
    newest = timezone.now() + timedelta(seconds=30)
    NodeHealth.objects.filter(cluster=cluster, node="pve1").update(checked_at=newest)

    check_round()

    assert NodeHealth.objects.get(cluster=cluster, node="pve1", latest=True).checked_at == newest
    assert NodeHealth.objects.filter(cluster=cluster, latest=True).count() == 3


def test_a_node_removed_from_the_cluster_leaves_the_latest_results(health: Health) -> None:
    cluster = health.sim.cluster
    check_round()
    Node.objects.filter(cluster=cluster, name="pve3").delete()
    cluster.save()

    assert [r.node for r in latest_for_cluster(cluster)] == ["pve1", "pve2"]
    check_round()
    assert set(
        NodeHealth.objects.filter(cluster=cluster, latest=True).values_list("node", flat=True)
    ) == {"pve1", "pve2"}


def test_prune_deletes_history_past_the_retention_but_keeps_each_latest(
    health: Health, settings: Any
) -> None:
    settings.PROXYHUB_HEALTH_RETENTION_DAYS = 7
    cluster = health.sim.cluster
    check_round()  # the latest rows
    now = timezone.now()
    ancient_latest = now - timedelta(days=30)
    NodeHealth.objects.filter(node="pve3").update(checked_at=ancient_latest)

    def history(days: float) -> NodeHealth:
        return NodeHealth.objects.create(
            cluster=cluster,
            node="pve1",
            ready=True,
            reason="Reachable",
            message="old",
            details={"isoStorage": "proxy-seeds"},
            duration=0.01,
            checked_at=now - timedelta(days=days),
        )

    old, recent = history(8), history(6)

    assert prune_history(now=now) == 1
    assert not NodeHealth.objects.filter(pk=old.pk).exists()
    assert NodeHealth.objects.filter(pk=recent.pk).exists()
    # A node not checked for a month still shows its last result.
    assert NodeHealth.objects.get(node="pve3", latest=True).checked_at == ancient_latest
    assert tasks.prune() == 0  # the Beat task runs the same pruning


# --- Beat, task, command, metrics, admin --------------------------------------------------------


def test_beat_schedules_exist_by_name_on_the_health_queue() -> None:
    checks = PeriodicTask.objects.get(name="proxyhub: node health checks")
    assert checks.task == "proxyhub.health.check_round"
    assert checks.queue == "health"
    assert (checks.interval.every, checks.interval.period) == (60, "seconds")
    assert checks.expire_seconds == 60  # a backlog expires instead of piling up rounds
    prune = PeriodicTask.objects.get(name="proxyhub: node health pruning")
    assert (prune.task, prune.queue) == ("proxyhub.health.prune", "health")


def test_the_round_task_checks_every_cluster(health: Health) -> None:
    health.engine.control.node_offline("pve2")
    assert tasks.check_round() == {"checked": 3, "ready": 2}
    assert ready_nodes(health.sim.cluster) == ["pve1", "pve3"]


def test_check_nodes_json_lists_every_node_and_exits_1_when_one_is_not_ready(
    health: Health,
) -> None:
    health.engine.control.node_offline("pve3")
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("check_nodes", "--json", stdout=out)
    assert failed.value.returncode == 1
    assert "pvesim/pve3 (Unreachable)" in str(failed.value)

    printed = json.loads(out.getvalue())
    assert [(o["cluster"], o["node"], o["ready"], o["reason"]) for o in printed] == [
        ("pvesim", "pve1", True, "Reachable"),
        ("pvesim", "pve2", True, "Reachable"),
        ("pvesim", "pve3", False, "Unreachable"),
    ]
    for item in printed:
        assert {"cluster", "node", "ready", "reason", "message", "details", "checkedAt"} <= set(
            item
        )
        assert item["checkedAt"].endswith("Z")
        assert item["details"]["isoStorage"] == "proxy-seeds"
    assert CANARY not in out.getvalue()

    health.engine.control.node_online("pve3")
    out = StringIO()
    call_command("check_nodes", stdout=out)  # all ready: exit 0
    assert "3/3 nodes ready" in out.getvalue()


def test_check_nodes_refuses_an_unknown_cluster_with_exit_2(health: Health) -> None:
    with pytest.raises(CommandError) as failed:
        call_command("check_nodes", "--cluster", "nope", stdout=StringIO())
    assert failed.value.returncode == 2
    assert NodeHealth.objects.count() == 0


def test_metrics_show_readiness_and_duration_per_node(health: Health, settings: Any) -> None:
    settings.PROXYHUB_METRICS_TOKEN = ""
    health.engine.control.node_offline("pve3")
    check_round()

    body = Client().get("/metrics").content.decode()

    assert 'proxyhub_node_ready{cluster="pvesim",node="pve1"} 1.0' in body
    assert 'proxyhub_node_ready{cluster="pvesim",node="pve3"} 0.0' in body
    assert 'proxyhub_node_check_reason{cluster="pvesim",node="pve3",reason="Unreachable"} 1.0' in (
        body
    )
    durations = [
        line
        for line in body.splitlines()
        if line.startswith("proxyhub_node_check_duration_seconds{")
    ]
    assert len(durations) == 3


def test_admin_lists_results_read_only_with_filters(
    health: Health, admin_client: Client, django_assert_max_num_queries: Any
) -> None:
    health.engine.control.node_offline("pve3")
    check_round()
    check_round()
    url = "/admin/healthchecks/nodehealth/"

    with django_assert_max_num_queries(12):
        page = admin_client.get(url)
    assert page.status_code == 200
    filtered = admin_client.get(url, {"reason__exact": "Unreachable"})
    assert filtered.context["cl"].result_count == 2
    assert {row.node for row in filtered.context["cl"].result_list} == {"pve3"}
    searched = admin_client.get(url, {"q": "pve1", "latest__exact": "1"})
    assert [row.node for row in searched.context["cl"].result_list] == ["pve1"]

    row = NodeHealth.objects.filter(node="pve3").first()
    assert row is not None
    assert admin_client.get(f"{url}{row.pk}/change/").status_code == 200  # viewable
    assert admin_client.get(f"{url}add/").status_code == 403
    assert admin_client.post(f"{url}{row.pk}/delete/").status_code == 403
    before = NodeHealth.objects.get(pk=row.pk).message
    admin_client.post(f"{url}{row.pk}/change/", {"message": "edited"})
    assert NodeHealth.objects.get(pk=row.pk).message == before


# --- placement --------------------------------------------------------------------------------


def _available(health: Health, node: str) -> int:
    return int(health.sim.api.node_status(node)["memory"]["available"])


def _set_available(health: Health, node: str, available: int) -> None:
    with health.engine.lock:
        target = health.engine.cluster.nodes[node]
        target.maxmem += available - _available(health, node)
    assert _available(health, node) == available


def _create(pump: Pump, health: Health, *names: str) -> list[Proxy]:
    specs = [
        ProxySpec(
            name=name,
            cluster=health.sim.cluster,
            machine_type="small",
            image="debian-13",
            zone="",
            cloud_init=b"#cloud-config\n",
        )
        for name in names
    ]
    pump.call(operations.proxies_create, specs=specs)
    pump.run()
    return list(Proxy.objects.filter(name__in=names).order_by("name"))


def test_placement_picks_the_ready_node_with_the_most_free_memory(
    health: Health, pump: Pump
) -> None:
    # pve3 would win on free memory and on proxy count, but it is not ready.
    base = _available(health, "pve1")
    _set_available(health, "pve2", base + 512 * MIB)
    _set_available(health, "pve3", base + 64 * GIB)
    health.engine.control.node_offline("pve3")
    check_round()
    health.engine.control.node_online("pve3")  # back, but no check has seen it yet

    first, second = _create(pump, health, "p0", "p1")

    # p0: pve2 has 512 MiB more free. p1: p0's 1024 MiB counts against pve2 although no check
    # has run since, so pve1 has more left.
    assert (first.node, second.node) == ("pve2", "pve1")
    assert all(p.phase == "Running" for p in (first, second))
    # Counted by the simulator: nothing was cloned onto the node that was not ready.
    clones = health.engine.ledger.calls("POST", "/nodes/{node}/qemu/{vmid}/clone")
    assert len(clones) == 2
    assert all(c.params.get("target") != "pve3" for c in clones)


def test_placement_refuses_when_no_node_is_ready_and_falls_back_without_fresh_data(
    health: Health, settings: Any
) -> None:
    cluster = health.sim.cluster
    config = cluster.proxmox_config("test")
    for node in ("pve1", "pve2"):
        health.engine.control.node_offline(node)
    health.token_file.write_text(health.engine.token + "\n")
    with health.engine.lock:
        health.engine.cluster.nodes["pve3"].storages.pop("proxy-seeds")
    check_round()

    with pytest.raises(TransientError) as refused:
        choose_node(cluster, config)
    assert str(refused.value).startswith(
        "no node of cluster pvesim is ready: pve1 Unreachable, pve2 Unreachable, "
        "pve3 StorageNotFound"
    )

    # Results older than the staleness limit neither block nor steer: spread by count.
    settings.PROXYHUB_HEALTH_STALE_SECONDS = 60
    NodeHealth.objects.update(checked_at=timezone.now() - timedelta(seconds=120))
    assert choose_node(cluster, config) == "pve1"


def test_placement_without_health_data_keeps_spreading_by_count(health: Health) -> None:
    cluster = health.sim.cluster
    assert NodeHealth.objects.count() == 0
    assert choose_node(cluster, cluster.proxmox_config("test")) == "pve1"
