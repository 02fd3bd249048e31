"""The container deployment: docker-compose.yml, the Dockerfile and what the build context holds.

No Docker engine is needed: the compose file is parsed as YAML (merge keys resolved, as compose
does) and checked for what an operator relies on, and ``docker-compose config`` validates it
when the binary is installed (Debian's ``docker-compose`` package).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"

LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat", "pvesim", "jaeger")
ONE_SHOT = ("migrate", "pvesim-import")
APP_SERVICES = ("migrate", "web", "worker", "beat", "pvesim-import")
# Environment variable names whose values are secrets or carry one (a URL with a password).
SECRET_NAMES = ("SECRET", "PASSWORD", "TOKEN", "DATABASE_URL", "REDIS_URL", "KEY")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return test if isinstance(test, str) else " ".join(test)


def test_every_service_of_the_deployment_is_there(services: dict[str, Any]) -> None:
    assert set(services) == set(LONG_RUNNING) | set(ONE_SHOT)


def test_long_running_services_have_health_checks(services: dict[str, Any]) -> None:
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
        assert not check.get("disable"), f"{name} disables its health check"
        assert services[name].get("restart") == "unless-stopped", name
    for name in ONE_SHOT:
        # A one-shot that restarted would run its command again and again.
        assert services[name].get("restart") == "no", name


def test_health_checks_probe_the_right_thing(services: dict[str, Any]) -> None:
    assert "pg_isready" in healthcheck_text(services["postgres"])
    assert healthcheck_text(services["redis"]) == "CMD redis-cli ping"
    assert "/healthz" in healthcheck_text(services["web"])
    # $$ is compose's escape for a literal $, so the container's shell expands $HOSTNAME.
    assert "inspect ping -d celery@$$HOSTNAME" in healthcheck_text(services["worker"])
    assert "inspect ping -d celerybeat@$$HOSTNAME" in healthcheck_text(services["beat"])
    assert "--enable-remote-control" in command_of(services["beat"])


def test_inline_python_health_checks_compile(services: dict[str, Any]) -> None:
    for name in ("web", "pvesim"):
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        compile(test[3], f"{name} healthcheck", "exec")


def test_commands_are_the_documented_ones(services: dict[str, Any]) -> None:
    assert command_of(services["migrate"]) == ["python", "manage.py", "migrate", "--noinput"]
    web = command_of(services["web"])
    assert web[:2] == ["gunicorn", "proxyhub.wsgi:application"]
    assert web[web.index("--bind") + 1] == "0.0.0.0:8000"
    assert "--no-control-socket" in web  # its default path is under a $HOME the user lacks
    # --quiet: no plain-text start-up banner among the JSON log lines on stdout.
    worker = command_of(services["worker"])
    assert worker[:5] == ["celery", "-A", "proxyhub", "--quiet", "worker"]
    assert worker[worker.index("-Q") + 1] == "provisioning,health,control"
    assert command_of(services["beat"])[:5] == ["celery", "-A", "proxyhub", "--quiet", "beat"]
    pvesim = command_of(services["pvesim"])
    assert pvesim[:3] == ["python", "-m", "pvesim"]
    assert pvesim[pvesim.index("--port") + 1] == "8006"
    assert command_of(services["pvesim-import"]) == [
        "python",
        "manage.py",
        "import_catalogue",
        "/etc/proxyhub/pvesim/catalogue.yaml",
    ]


def test_exactly_one_beat(services: dict[str, Any]) -> None:
    assert services["beat"]["deploy"]["replicas"] == 1
    for name, service in services.items():
        if name != "beat":
            assert "beat" not in command_of(service), f"{name} also runs Beat"
            assert "-B" not in command_of(service), f"{name} embeds Beat in a worker"


def test_nothing_starts_before_migrations(services: dict[str, Any]) -> None:
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["pvesim-import"]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"},
        "pvesim": {"condition": "service_healthy"},
    }


def test_data_survives_restarts(compose: dict[str, Any], services: dict[str, Any]) -> None:
    redis = command_of(services["redis"])
    assert redis[0] == "redis-server"
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert "redisdata:/data" in services["redis"]["volumes"]
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert {"pgdata", "redisdata", "pvesim"} <= set(compose["volumes"])


def test_the_simulator_is_optional_and_shares_its_files(services: dict[str, Any]) -> None:
    assert services["pvesim"]["profiles"] == ["sim"]
    assert services["pvesim-import"]["profiles"] == ["sim"]
    for name in (*LONG_RUNNING, "migrate"):
        if name not in ("pvesim", "jaeger"):
            assert "profiles" not in services[name], f"{name} must start without a profile"
    assert "pvesim:/etc/proxyhub/pvesim" in services["pvesim"]["volumes"]
    sim = command_of(services["pvesim"])
    assert sim[sim.index("--workdir") + 1] == "/etc/proxyhub/pvesim"
    # Workers read the simulator's token and CA; nothing but the simulator may change them. The
    # catalogue it writes names them where the workers see them, inside the one directory
    # proxyhub reads credentials from (issue 11).
    for name in ("web", "worker", "beat", "pvesim-import"):
        assert "pvesim:/etc/proxyhub/pvesim:ro" in services[name]["volumes"], name
        assert services[name]["environment"]["PROXYHUB_CREDENTIALS_DIR"] == "/etc/proxyhub", name


def test_tracing_is_an_optional_profile_that_only_listens_on_loopback(
    services: dict[str, Any],
) -> None:
    """Jaeger starts only with ``--profile tracing``; its UI is published on 127.0.0.1 only, and
    its OTLP port only inside the compose network, where the workers send spans."""
    jaeger = services["jaeger"]
    assert jaeger["profiles"] == ["tracing"]
    assert jaeger["ports"] == ["127.0.0.1:16686:16686"]
    assert ":" in jaeger["image"] and not jaeger["image"].endswith(":latest")
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in (services["worker"].get("environment") or {})


def test_settings_come_from_env_file_not_the_compose_file(services: dict[str, Any]) -> None:
    for name in (*APP_SERVICES, "postgres"):
        assert services[name]["env_file"] == ".env", name
    for name, service in services.items():
        environment = service.get("environment") or {}
        items = (
            environment.items()
            if isinstance(environment, dict)
            else (entry.partition("=")[::2] for entry in environment)
        )
        for key, _value in items:
            assert not any(word in key.upper() for word in SECRET_NAMES), (
                f"{name} sets {key} inline; secrets belong in .env"
            )
    text = COMPOSE_FILE.read_text()
    assert "postgres://" not in text and "redis://" not in text


def test_proxmox_credentials_are_mounted_read_only(services: dict[str, Any]) -> None:
    for name in APP_SERVICES:
        assert "./proxmox-credentials:/etc/proxyhub/proxmox:ro" in services[name]["volumes"], name


def test_dockerfile_builds_a_non_root_gunicorn_image() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert "RUN pip install -r requirements.txt" in lines
    assert "RUN pip install -r requirements-otel.txt" in lines  # tracing, off until configured
    assert any("manage.py collectstatic --noinput" in line for line in lines)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    cmd = next(line for line in reversed(lines) if line.startswith("CMD "))
    assert cmd.startswith('CMD ["gunicorn", "proxyhub.wsgi:application"')
    assert '"0.0.0.0:8000"' in cmd
    assert '"--no-control-socket"' in cmd
    # The secret key used for collectstatic must not stay in the image's environment.
    assert not any(line.startswith("ENV") and "SECRET" in line for line in lines)


def test_containers_run_the_production_settings(services: dict[str, Any]) -> None:
    """The image selects production's settings, and no service selects others."""
    dockerfile = (REPO / "Dockerfile").read_text().splitlines()
    assert "ENV DJANGO_SETTINGS_MODULE=proxyhub.settings.production" in dockerfile
    for name in APP_SERVICES:
        environment = services[name].get("environment", {})
        assert "DJANGO_SETTINGS_MODULE" not in str(environment), name


def test_build_context_leaves_out_state_and_secrets() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".env", "var", ".venv", ".git", "proxmox-credentials"} <= ignored


@pytest.fixture
def compose_project(tmp_path: Path) -> Path:
    """The compose file in a scratch project with the .env it requires."""
    shutil.copy2(COMPOSE_FILE, tmp_path / "docker-compose.yml")
    (tmp_path / ".env").write_text(
        "DJANGO_SECRET_KEY=test-only\n"
        "PROXYHUB_SEALING_KEYS=c2VhbGluZy10ZXN0LWtleS1ub3QtYS1zZWNyZXQtMDE=\n"
        "PROXYHUB_METRICS_TOKEN=test-only\n"
        "POSTGRES_USER=proxyhub\nPOSTGRES_PASSWORD=test-only\nPOSTGRES_DB=proxyhub\n"
        "DATABASE_URL=postgres://proxyhub:test-only@postgres:5432/proxyhub\n"
        "REDIS_URL=redis://redis:6379/0\n"
    )
    return tmp_path


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="no docker-compose binary on PATH (Debian package docker-compose); "
    "the YAML checks above still ran",
)
@pytest.mark.parametrize(
    "profile",
    [[], ["--profile", "sim"], ["--profile", "tracing"]],
    ids=["default", "sim", "tracing"],
)
def test_docker_compose_accepts_the_file(compose_project: Path, profile: list[str]) -> None:
    result = subprocess.run(
        ["docker-compose", *profile, "-f", "docker-compose.yml", "config", "-q"],
        cwd=compose_project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
