"""/healthz, /readyz and /metrics as a probe, an orchestrator and Prometheus see them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from pump import make_cluster

from provisioning.models import Proxy
from provisioning.models.choices import Phase
from provisioning.proxmox.api import Api
from provisioning.proxmox.errors import ApiError, ConnectFailed
from proxyhub.metrics import CountSpec, DatabaseCountCollector, record_step
from tests.support.simtransport import sim_api

REPO = Path(__file__).resolve().parents[2]
PLAIN_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _families(body: bytes) -> dict[str, dict]:
    """Metric families by name, each a map of label tuples to values."""
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            out.setdefault(family.name, {})[key] = sample.value
    return out


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- probes ------------------------------------------------------------------------------------


def test_healthz_answers_without_touching_the_database(client: Client) -> None:
    # No django_db mark: any query here would fail the test.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
@pytest.mark.parametrize("method", ["post", "put", "delete", "head"])
def test_probes_answer_get_only(path: str, method: str) -> None:
    # CSRF enforced as in production, so a POST is refused as a method, not for its token.
    client = Client(enforce_csrf_checks=True)
    response = getattr(client, method)(path)
    assert response.status_code == 405
    assert response["Allow"] == "GET"


def test_readyz_on_the_embedded_defaults(prod_env: dict[str, str], probe) -> None:
    ready, health, admin = probe(prod_env, "/readyz", "/healthz", "/admin/login/")
    assert ready["status"] == 200, ready
    assert json.loads(ready["body"]) == {"database": "ok", "broker": "ok"}
    # Probes are answered over plain HTTP while the admin is redirected to HTTPS.
    assert health["status"] == 200
    assert admin["status"] == 301
    assert admin["location"].startswith("https://")


def test_readyz_names_the_broker_when_redis_is_down(prod_env: dict[str, str], probe) -> None:
    env = {**prod_env, "REDIS_URL": "redis://:redis-pw-314@127.0.0.1:1/0"}
    (ready,) = probe(env, "/readyz")
    assert ready["status"] == 503
    body = json.loads(ready["body"])
    assert body["database"] == "ok"
    assert body["broker"] == "failed"
    assert body["errors"]["broker"].isidentifier()  # a class name, never the URL
    assert "redis-pw-314" not in ready["body"]


def test_readyz_names_the_database_when_it_is_down(prod_env: dict[str, str], probe) -> None:
    env = {**prod_env, "DATABASE_URL": "postgres://proxyhub:db-pw-271@127.0.0.1:1/proxyhub"}
    (ready,) = probe(env, "/readyz")
    assert ready["status"] == 503
    body = json.loads(ready["body"])
    assert body["database"] == "failed"
    assert body["broker"] == "ok"
    assert "db-pw-271" not in ready["body"]


# --- metrics -----------------------------------------------------------------------------------


class _Unreachable:
    """A transport for a node that never answers."""

    def send(self, call, *, deadline):
        raise ConnectFailed("connection refused")


@pytest.mark.django_db
def test_proxmox_calls_and_steps_show_up_in_metrics(client: Client) -> None:
    """The provider's per-call log lines feed the counters (no Django import in the provider)."""
    before_ok = _sample("proxmox_requests_total", call="version", status="200")
    before_500 = _sample("proxmox_requests_total", call="vm_config", status="500")
    before_down = _sample("proxmox_requests_total", call="version", status="ConnectFailed")
    before_latency = _sample("proxmox_request_seconds_count", call="version")
    before_step = _sample("operation_step_seconds_count", kind="create", step="clone")

    api, _engine = sim_api(profile="instant")
    api.version()
    with pytest.raises(ApiError):
        api.vm_config("pve1", 999)
    with pytest.raises(ConnectFailed):
        Api(_Unreachable()).version()
    record_step("create", "clone", 2.5)

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == PLAIN_TEXT
    families = _families(response.content)
    requests = families["proxmox_requests"]
    assert requests[("proxmox_requests_total", (("call", "version"), ("status", "200")))] == (
        before_ok + 1
    )
    assert requests[("proxmox_requests_total", (("call", "vm_config"), ("status", "500")))] == (
        before_500 + 1
    )
    down = ("proxmox_requests_total", (("call", "version"), ("status", "ConnectFailed")))
    assert requests[down] == before_down + 1
    latency = families["proxmox_request_seconds"]
    assert latency[("proxmox_request_seconds_count", (("call", "version"),))] == (
        before_latency + 2
    )
    steps = families["operation_step_seconds"]
    step_key = ("operation_step_seconds_count", (("kind", "create"), ("step", "clone")))
    assert steps[step_key] == before_step + 1


@pytest.mark.django_db
def test_proxies_are_counted_by_phase_and_cluster(client: Client) -> None:
    home = make_cluster("proxmox-home")
    lab = make_cluster("proxmox-lab", nodes=("lab1",))
    for name, cluster, phase in [
        ("a", home, Phase.RUNNING),
        ("b", home, Phase.RUNNING),
        ("c", home, Phase.FAILED),
        ("d", lab, Phase.RUNNING),
    ]:
        Proxy.objects.create(
            name=name, cluster=cluster, machine_type="small", image="debian-13", phase=phase
        )

    families = _families(client.get("/metrics").content)

    proxies = families["proxyhub_proxies"]
    assert proxies == {
        ("proxyhub_proxies", (("cluster", "proxmox-home"), ("phase", Phase.RUNNING))): 2.0,
        ("proxyhub_proxies", (("cluster", "proxmox-home"), ("phase", Phase.FAILED))): 1.0,
        ("proxyhub_proxies", (("cluster", "proxmox-lab"), ("phase", Phase.RUNNING))): 1.0,
    }
    assert "proxyhub_operations" in _families_with_types(client.get("/metrics").content)


def _families_with_types(body: bytes) -> set[str]:
    return {f.name for f in text_string_to_metric_families(body.decode())}


@pytest.mark.django_db
def test_a_missing_model_or_field_skips_its_family_only(django_user_model) -> None:
    django_user_model.objects.create(username="ops", is_staff=True)
    django_user_model.objects.create(username="viewer")
    django_user_model.objects.create(username="viewer2")
    collector = DatabaseCountCollector(
        [
            CountSpec("gone", "a model that does not exist", "nowhere.Missing"),
            CountSpec("renamed", "a field that does not exist", "auth.User", {"x": "nope"}),
            CountSpec("users", "users by staff flag", "auth.User", {"staff": "is_staff"}),
        ]
    )
    families = list(collector.collect())
    assert [f.name for f in families] == ["users"]
    counts = {s.labels["staff"]: s.value for s in families[0].samples}
    assert counts == {"True": 1, "False": 2}


@pytest.mark.django_db
def test_metrics_token_is_required_when_set(client: Client) -> None:
    token = "metrics-token-" + "7" * 24
    with override_settings(PROXYHUB_METRICS_TOKEN=token):
        assert client.get("/metrics").status_code == 401
        wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert wrong["WWW-Authenticate"].startswith("Bearer")
        right = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert right.status_code == 200


# Runs in the child, a stand-in for a Celery worker process: Proxmox calls through the real
# seam, a step, and log lines with extra fields, a token and an exception.
_WORKER = """
import logging
import django
django.setup()
from tests.support.simtransport import sim_api
from proxyhub.metrics import record_step
api, _ = sim_api(profile="instant")
api.version()
api.nodes()
record_step("create", "clone", 2.5)
secret = "-".join(["0b7c3a52", "8f0e", "4c55"])
log = logging.getLogger("provisioning.services.driver")
log.warning("step waiting", extra={"vmid": 100123, "node": "pve1",
                                   "auth": "PVEAPIToken=proxyhub@pve!ph=" + secret})
try:
    raise RuntimeError("login as proxyhub@pve!ph=" + secret + " failed")
except RuntimeError:
    log.exception("step failed", extra={"upload": b"ISO" * 100})
"""


@pytest.mark.django_db
def test_worker_metrics_and_logs(prod_env: dict[str, str], tmp_path: Path, client: Client) -> None:
    """A worker process records into the shared directory and /metrics serves its numbers;
    its log lines are JSON with their extra fields, tokens masked, INFO hidden at WARNING."""
    shared = tmp_path / "metrics"
    env = {**prod_env, "PROMETHEUS_MULTIPROC_DIR": str(shared), "PROXYHUB_LOG_LEVEL": "WARNING"}
    worker = subprocess.run(
        [sys.executable, "-c", _WORKER],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr

    records = [json.loads(line) for line in worker.stdout.splitlines()]
    assert [r["message"] for r in records] == ["step waiting", "step failed"]
    waiting, failed = records
    assert waiting["level"] == "WARNING"
    assert waiting["vmid"] == 100123
    assert waiting["node"] == "pve1"
    assert waiting["auth"] == "PVEAPIToken=[REDACTED]"
    assert "proxyhub@pve!ph=[REDACTED]" in failed["exc"]
    assert failed["upload"] == "<300 bytes>"
    assert "0b7c3a52-8f0e-4c55" not in worker.stdout

    with override_settings(PROMETHEUS_MULTIPROC_DIR=str(shared)):
        response = client.get("/metrics")
    assert response.status_code == 200
    families = _families(response.content)
    requests = families["proxmox_requests"]
    assert requests[("proxmox_requests_total", (("call", "version"), ("status", "200")))] == 1
    assert requests[("proxmox_requests_total", (("call", "nodes"), ("status", "200")))] == 1
    steps = families["operation_step_seconds"]
    assert steps[("operation_step_seconds_count", (("kind", "create"), ("step", "clone")))] == 1
    assert steps[("operation_step_seconds_sum", (("kind", "create"), ("step", "clone")))] == 2.5
