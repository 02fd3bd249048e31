"""/metrics behind its token in production, bounded per scrape; /readyz kept for a window.

Issue 11: production refuses to serve /metrics without a bearer token (unless told it is public),
a scrape never counts the whole journal of operations, and a probe storm costs one readiness
check per window.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import METRICS_TOKEN
from django.conf import settings
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families
from pump import make_cluster

from provisioning.models import Operation
from provisioning.models.choices import OperationKind, OperationState
from proxyhub import metrics
from proxyhub.celery import app as celery_app

# --- the token ---------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, ""], ids=["unset", "empty"])
def test_production_refuses_to_start_without_a_metrics_token(
    prod_env: dict[str, str], manage, token: str | None
) -> None:
    env = {k: v for k, v in prod_env.items() if k != "PROXYHUB_METRICS_TOKEN"}
    if token is not None:
        env["PROXYHUB_METRICS_TOKEN"] = token
    done = manage(env, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: PROXYHUB_METRICS_TOKEN is not set" in done.stderr
    assert "PROXYHUB_METRICS_PUBLIC=true" in done.stderr


def test_production_serves_metrics_only_with_its_token(prod_env: dict[str, str], probe) -> None:
    (anonymous,) = probe(prod_env, "/metrics")
    assert anonymous["status"] == 401
    assert "proxyhub_" not in anonymous["body"]


def test_production_metrics_can_be_declared_public(prod_env: dict[str, str], manage, probe) -> None:
    env = {k: v for k, v in prod_env.items() if k != "PROXYHUB_METRICS_TOKEN"}
    env["PROXYHUB_METRICS_PUBLIC"] = "true"
    assert manage(env, "migrate", "--noinput").returncode == 0
    (public,) = probe(env, "/metrics")
    assert public["status"] == 200
    assert "proxyhub_operations" in public["body"]


@pytest.mark.django_db
def test_the_token_is_taken_only_as_a_bearer_token(client: Client) -> None:
    with override_settings(PROXYHUB_METRICS_TOKEN=METRICS_TOKEN):
        for header in (METRICS_TOKEN, f"Basic {METRICS_TOKEN}", f"Bearer {METRICS_TOKEN}x"):
            assert client.get("/metrics", headers={"Authorization": header}).status_code == 401
        right = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        assert right.status_code == 200


# --- bounded aggregates ------------------------------------------------------------------------


def _operations(body: bytes) -> dict[tuple[str, str], float]:
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "proxyhub_operations":
            return {(s.labels["kind"], s.labels["state"]): s.value for s in family.samples}
    raise AssertionError("no proxyhub_operations family")


def _journal(cluster, kind: str, state: str, n: int) -> None:
    Operation.objects.bulk_create(
        Operation(kind=kind, state=state, proxy_name=f"p{i}", cluster=cluster) for i in range(n)
    )


def _scrape(client: Client) -> tuple[dict[tuple[str, str], float], list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/metrics")
    assert response.status_code == 200
    return _operations(response.content), [q["sql"] for q in queries.captured_queries]


@pytest.fixture
def fresh_summary(monkeypatch: pytest.MonkeyPatch) -> metrics.OperationCountCollector:
    """A collector with no summary yet, as in a process that just started."""
    collector = metrics.OperationCountCollector()
    monkeypatch.setattr(metrics, "OPERATION_COUNTS", collector)
    return collector


@pytest.mark.django_db
def test_a_scrape_counts_only_operations_in_flight_within_the_window(
    client: Client, fresh_summary: metrics.OperationCountCollector
) -> None:
    cluster = make_cluster()
    _journal(cluster, OperationKind.CREATE, OperationState.SUCCEEDED, 5)
    _journal(cluster, OperationKind.DELETE, OperationState.FAILED, 2)
    _journal(cluster, OperationKind.CREATE, OperationState.WAITING, 1)

    with override_settings(PROXYHUB_METRICS_SUMMARY_SECONDS=3600):
        first, first_sql = _scrape(client)
        assert first == {
            ("create", "succeeded"): 5,
            ("delete", "failed"): 2,
            ("create", "waiting"): 1,
        }
        # The journal grows by two hundred rows, finished and in flight.
        _journal(cluster, OperationKind.CREATE, OperationState.SUCCEEDED, 190)
        _journal(cluster, OperationKind.START, OperationState.QUEUED, 10)
        second, second_sql = _scrape(client)

    # In-flight work is current at every scrape; finished counts come from the kept summary.
    assert second == {
        ("create", "succeeded"): 5,
        ("delete", "failed"): 2,
        ("create", "waiting"): 1,
        ("start", "queued"): 10,
    }
    # The second scrape ran one query fewer (no summary), and every query it sent to the journal
    # is restricted to the in-flight states.
    assert len(second_sql) == len(first_sql) - 1
    journal_sql = [sql for sql in second_sql if '"provisioning_operation"' in sql]
    assert journal_sql
    assert all(" IN (" in sql and "NOT" not in sql for sql in journal_sql), journal_sql


@pytest.mark.django_db
def test_after_the_window_the_finished_counts_are_right_again(
    client: Client, fresh_summary: metrics.OperationCountCollector
) -> None:
    cluster = make_cluster()
    _journal(cluster, OperationKind.CREATE, OperationState.SUCCEEDED, 3)
    with override_settings(PROXYHUB_METRICS_SUMMARY_SECONDS=0.2):
        first, first_sql = _scrape(client)
        _journal(cluster, OperationKind.CREATE, OperationState.SUCCEEDED, 120)
        _journal(cluster, OperationKind.REPLACE, OperationState.FAILED, 4)
        time.sleep(0.3)  # past the window; not a timing assertion
        later, later_sql = _scrape(client)
    assert first == {("create", "succeeded"): 3}
    assert later == {("create", "succeeded"): 123, ("replace", "failed"): 4}
    # A longer journal costs no more queries.
    assert len(later_sql) == len(first_sql)


# --- /readyz ----------------------------------------------------------------------------------


def _readiness_checks(sql: list[str]) -> int:
    return sum(1 for s in sql if s.strip().upper() == "SELECT 1")


@pytest.fixture
def no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """No verdict kept from before, as in a process that just started."""
    from proxyhub import views

    monkeypatch.setattr(views, "_verdict", None)


@pytest.mark.django_db
def test_two_probes_within_the_window_make_one_check(client: Client, no_verdict: None) -> None:
    with (
        override_settings(PROXYHUB_READYZ_CACHE_SECONDS=3600),
        CaptureQueriesContext(connection) as queries,
    ):
        first = client.get("/readyz")
        second = client.get("/readyz")
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() == {"database": "ok", "broker": "ok"}
    assert _readiness_checks([q["sql"] for q in queries.captured_queries]) == 1


@pytest.mark.django_db
def test_a_failure_is_reported_once_the_window_has_passed(
    client: Client, no_verdict: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with override_settings(PROXYHUB_READYZ_CACHE_SECONDS=0.5):
        assert client.get("/readyz").status_code == 200
        # The embedded broker loses its queue folder.
        options = celery_app.conf.broker_transport_options
        monkeypatch.setitem(options, "data_folder_in", str(tmp_path / "gone"))
        assert client.get("/readyz").status_code == 200  # the kept verdict
        time.sleep(0.6)  # past the window; not a timing assertion
        failed = client.get("/readyz")
    assert failed.status_code == 503
    body = json.loads(failed.content)
    assert body == {
        "database": "ok",
        "broker": "failed",
        "errors": {"broker": "NotADirectoryError"},
    }


@pytest.mark.every_database
def test_database_connections_outlive_a_request() -> None:
    """/readyz (and every request) reuses the process's database connection."""
    database = settings.DATABASES["default"]
    assert database["CONN_MAX_AGE"] > 0
    assert database["CONN_HEALTH_CHECKS"] is True
