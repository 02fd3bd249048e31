"""Settings from the environment, the deploy checklist, the Celery configuration, error reports
and log lines: what an operator relies on when proxyhub starts in production.

Which settings module a process gets (``proxyhub.settings.production``, ``local`` or ``test``) is
tested in child processes too, each with exactly the environment an operator, ``make run`` or
pytest would give it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings
from django.views.debug import ExceptionReporter

from proxyhub import celery_app
from proxyhub.celery import check_visibility_timeout
from proxyhub.logging import REDACTED, JsonFormatter, RedactSecretsFilter, redact

REPO = Path(__file__).resolve().parents[2]

# Runs in the child: record every variable the settings module reads (the one
# DJANGO_SETTINGS_MODULE names, as Django finds it), then print them with the settings the tests
# look at.
_DUMP = """
import importlib, json, os
import proxyhub  # the package and Celery first, so only the settings module's reads are recorded
read = set()
class Recording(dict):
    def __getitem__(self, key):
        read.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        read.add(key)
        return super().__contains__(key)
os.environ = Recording(os.environ)
s = importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
db = s.DATABASES["default"]
print("DUMP " + json.dumps({
    "read": sorted(read),
    "DEBUG": s.DEBUG,
    "development_key": s.SECRET_KEY.startswith("django-insecure-"),
    "hsts": s.SECURE_HSTS_SECONDS,
    "cookies_secure": [s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE],
    "db": {"ENGINE": db["ENGINE"], "NAME": str(db["NAME"]), "OPTIONS": db.get("OPTIONS", {})},
    "broker_url": s.CELERY_BROKER_URL,
    "broker_transport": getattr(s, "CELERY_BROKER_TRANSPORT", None),
    "transport_options": s.CELERY_BROKER_TRANSPORT_OPTIONS,
    "publish_retry": s.CELERY_TASK_PUBLISH_RETRY_POLICY,
    "connection_timeout": s.CELERY_BROKER_CONNECTION_TIMEOUT,
    "multiproc": s.PROMETHEUS_MULTIPROC_DIR,
    "ssl_redirect": s.SECURE_SSL_REDIRECT,
    "knobs": {k: getattr(s, k) for k in dir(s) if k.startswith("PROXYHUB_")},
}))
"""


def _settings_in(env: dict[str, str]) -> dict:
    done = _python(env, "-c", _DUMP)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("DUMP "))
    return json.loads(line.removeprefix("DUMP "))


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _selecting(module: str, prod_env: dict[str, str]) -> dict[str, str]:
    """``prod_env`` with ``module`` selected; local and test get no secret key, as ``make run``
    and pytest do not need one."""
    env = {**prod_env, "DJANGO_SETTINGS_MODULE": module}
    if module != "proxyhub.settings.production":
        del env["DJANGO_SECRET_KEY"]
    return env


def _env_example() -> dict[str, str]:
    names = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            names[name] = value
    return names


# --- environment -------------------------------------------------------------------------------


# Read by docker compose's postgres service, not by proxyhub; .env.example lists them for compose.
COMPOSE_ONLY = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


@pytest.mark.parametrize("module", ["production", "local", "test"])
def test_env_example_lists_exactly_the_variables_settings_read(
    prod_env: dict[str, str], module: str
) -> None:
    dumped = _settings_in(_selecting(f"proxyhub.settings.{module}", prod_env))
    assert set(dumped["read"]) == set(_env_example()) - COMPOSE_ONLY


def test_production_defaults_are_the_embedded_single_machine_setup(
    prod_env: dict[str, str], tmp_path: Path
) -> None:
    dumped = _settings_in(prod_env)
    var = tmp_path / "var"

    assert dumped["DEBUG"] is False
    assert dumped["ssl_redirect"] is True
    # SQLite under var/, tuned so several processes can write without "database is locked".
    assert dumped["db"]["ENGINE"] == "django.db.backends.sqlite3"
    assert dumped["db"]["NAME"] == str(var / "proxyhub.sqlite3")
    assert dumped["db"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert dumped["db"]["OPTIONS"]["timeout"] == 20
    assert "journal_mode=WAL" in dumped["db"]["OPTIONS"]["init_command"]
    # The embedded broker needs no server: kombu's filesystem transport under var/broker.
    assert dumped["broker_url"].startswith("filesystem://")
    # ...through proxyhub's subclass, which publishes whole files (test_embedded_broker.py).
    assert dumped["broker_transport"] == "proxyhub.embedded_broker:Transport"
    options = dumped["transport_options"]
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        assert Path(options[key]).is_dir()
        assert Path(options[key]).is_relative_to(var / "broker")
    assert options["data_folder_in"] == options["data_folder_out"]
    assert options["store_processed"] is False
    # Worker metrics are collected through files shared by every process.
    assert Path(dumped["multiproc"]) == var / "metrics"
    assert (var / "metrics").is_dir()
    # Every documented knob has its documented default.
    documented = _env_example()
    for name, value in dumped["knobs"].items():
        if documented.get(name):
            assert str(value) == documented[name], name


def test_empty_variables_mean_the_default(prod_env: dict[str, str]) -> None:
    """A copied .env.example sets every variable, most of them to the empty string."""
    env = {**{name: "" for name in _env_example()}, **prod_env}
    dumped = _settings_in(env)
    assert dumped["ssl_redirect"] is True
    assert dumped["db"]["ENGINE"] == "django.db.backends.sqlite3"
    assert dumped["broker_url"].startswith("filesystem://")
    assert dumped["multiproc"]


def test_redis_and_postgres_urls_are_used_as_given(prod_env: dict[str, str]) -> None:
    env = {
        **prod_env,
        "REDIS_URL": "redis://:brokerpass@redis.internal:6379/2",
        "DATABASE_URL": "postgres://proxyhub:dbpass@db.internal:5432/proxyhub",
        "PROXYHUB_STEP_MAX_BACKOFF_SECONDS": "120",
        "PROXYHUB_MAX_ATTEMPTS": "90",
    }
    dumped = _settings_in(env)
    assert dumped["broker_url"] == "redis://:brokerpass@redis.internal:6379/2"
    assert dumped["broker_transport"] is None  # the URL's scheme chooses kombu's Redis transport
    # A publish to a Redis that does not answer fails within seconds (issue 11).
    assert dumped["transport_options"] == {
        "visibility_timeout": 3600,
        "socket_connect_timeout": 3.0,
        "socket_timeout": 3.0,
    }
    assert dumped["connection_timeout"] == 3.0
    assert dumped["publish_retry"]["max_retries"] <= 3
    assert dumped["publish_retry"]["interval_max"] <= 1
    assert dumped["db"]["ENGINE"] == "django.db.backends.postgresql"
    assert dumped["db"]["NAME"] == "proxyhub"
    assert dumped["db"]["OPTIONS"]["connect_timeout"] == 5
    assert dumped["knobs"]["PROXYHUB_STEP_MAX_BACKOFF_SECONDS"] == 120
    assert dumped["knobs"]["PROXYHUB_MAX_ATTEMPTS"] == 90


def test_postgresql_database_url_works(prod_env: dict[str, str], manage, probe) -> None:
    url = "postgres://postgres@127.0.0.1:5432/test"
    done = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-Atc", "select 1"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"no PostgreSQL with a 'test' database on 127.0.0.1:5432: {done.stderr}")
    env = {**prod_env, "DATABASE_URL": url}

    checked = manage(env, "check", "--database", "default")
    assert checked.returncode == 0, checked.stderr
    (ready,) = probe(env, "/readyz")
    assert ready["status"] == 200, ready
    assert json.loads(ready["body"])["database"] == "ok"


# --- deploy checklist --------------------------------------------------------------------------


def test_production_settings_pass_the_deploy_checklist(prod_env: dict[str, str], manage) -> None:
    done = manage(prod_env, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("change", "warning"),
    [
        # DEBUG on with a real key: only local allows it (production refuses to start, below).
        ({"DJANGO_SETTINGS_MODULE": "proxyhub.settings.local"}, "security.W018"),
        ({"DJANGO_SECRET_KEY": "short-and-weak"}, "security.W009"),
        ({"DJANGO_SECURE_SSL_REDIRECT": "false"}, "security.W008"),
    ],
    ids=["debug-on", "weak-key", "no-https-redirect"],
)
def test_deploy_checklist_fails_on_unsafe_settings(
    prod_env: dict[str, str], manage, change: dict[str, str], warning: str
) -> None:
    done = manage({**prod_env, **change}, "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode != 0
    assert warning in done.stderr + done.stdout


@pytest.mark.parametrize("key", [None, ""], ids=["unset", "empty"])
def test_production_refuses_to_start_without_a_secret_key(
    prod_env: dict[str, str], manage, key: str | None
) -> None:
    env = {k: v for k, v in prod_env.items() if k != "DJANGO_SECRET_KEY"}
    if key is not None:
        env["DJANGO_SECRET_KEY"] = key
    done = manage(env, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in done.stderr


@pytest.mark.parametrize("key", [None, ""], ids=["unset", "empty"])
def test_production_refuses_to_start_without_a_sealing_key(
    prod_env: dict[str, str], manage, key: str | None
) -> None:
    """No fallback to a key derived from SECRET_KEY or from the repository in production."""
    env = {k: v for k, v in prod_env.items() if k != "PROXYHUB_SEALING_KEYS"}
    if key is not None:
        env["PROXYHUB_SEALING_KEYS"] = key
    done = manage(env, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: PROXYHUB_SEALING_KEYS is not set" in done.stderr


def test_a_sealing_key_that_is_not_a_fernet_key_is_refused_by_position(
    prod_env: dict[str, str], manage
) -> None:
    secret = "not-a-fernet-key-secret-value"
    env = {**prod_env, "PROXYHUB_SEALING_KEYS": f"{prod_env['PROXYHUB_SEALING_KEYS']},{secret}"}
    done = manage(env, "check")
    assert done.returncode != 0
    assert "PROXYHUB_SEALING_KEYS: key 2 is not a Fernet key" in done.stderr
    assert secret not in done.stderr + done.stdout


def test_a_worker_refuses_to_start_without_a_secret_key(prod_env: dict[str, str]) -> None:
    """``celery -A proxyhub`` loads production's settings too, so it refuses the same way."""
    env = {k: v for k, v in prod_env.items() if k != "DJANGO_SECRET_KEY"}
    celery = str(Path(sys.executable).parent / "celery")
    done = subprocess.run(
        [celery, "-A", "proxyhub", "inspect", "ping", "--timeout", "1"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in done.stdout + done.stderr


def test_production_refuses_debug(prod_env: dict[str, str], manage) -> None:
    """DJANGO_DEBUG=true used to give the development conveniences; production refuses it and
    says which module gives them."""
    done = manage({**prod_env, "DJANGO_DEBUG": "true"}, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_DEBUG is true" in done.stderr
    assert "DJANGO_SETTINGS_MODULE=proxyhub.settings.local" in done.stderr


def test_local_gives_a_development_key(prod_env: dict[str, str], manage) -> None:
    done = manage(_selecting("proxyhub.settings.local", prod_env), "check")
    assert done.returncode == 0, done.stderr


# --- which settings module ---------------------------------------------------------------------


_SHOW_MODULE = "from django.conf import settings; print('MODULE', settings.SETTINGS_MODULE)"


@pytest.mark.parametrize(
    ("entry", "selected"),
    [
        ("manage.py", None),
        ("manage.py", ""),
        ("proxyhub.wsgi", None),
        ("proxyhub.asgi", None),
        ("proxyhub.celery", None),
    ],
    ids=["manage.py", "manage.py-empty", "wsgi", "asgi", "celery"],
)
def test_every_entry_point_defaults_to_production(
    prod_env: dict[str, str], entry: str, selected: str | None
) -> None:
    """An operator who sets only the documented variables gets production, from
    ``manage.py``, ``gunicorn proxyhub.wsgi:application``, ASGI and ``celery -A proxyhub``
    alike; an empty value (a copied .env.example) is the default too."""
    env = {k: v for k, v in prod_env.items() if k != "DJANGO_SETTINGS_MODULE"}
    if selected is not None:
        env["DJANGO_SETTINGS_MODULE"] = selected
    if entry == "manage.py":
        done = _python(env, "manage.py", "shell", "--no-imports", "-c", _SHOW_MODULE)
    else:
        done = _python(env, "-c", f"import {entry}; {_SHOW_MODULE}")
    assert done.returncode == 0, done.stderr
    assert "MODULE proxyhub.settings.production" in done.stdout.splitlines()


def test_the_settings_package_is_not_a_settings_module(prod_env: dict[str, str], manage) -> None:
    """``proxyhub.settings`` was the one settings module; selected now, Django would load no
    apps at all (``migrate`` would find nothing to do), so it is refused with the new name."""
    done = manage({**prod_env, "DJANGO_SETTINGS_MODULE": "proxyhub.settings"}, "migrate")
    assert done.returncode != 0
    assert "select proxyhub.settings.production" in done.stderr


def test_local_is_runserver_on_plain_http(prod_env: dict[str, str], tmp_path: Path) -> None:
    """What ``make run`` selects: DEBUG, a development key, no HTTPS redirect or HSTS, cookies
    over HTTP; the same embedded state under var/ as production."""
    dumped = _settings_in(_selecting("proxyhub.settings.local", prod_env))
    assert dumped["DEBUG"] is True
    assert dumped["development_key"] is True
    assert dumped["ssl_redirect"] is False
    assert dumped["hsts"] == 0
    assert dumped["cookies_secure"] == [False, False]
    assert dumped["db"]["NAME"] == str(tmp_path / "var" / "proxyhub.sqlite3")
    assert dumped["broker_url"].startswith("filesystem://")
    assert Path(dumped["multiproc"]) == tmp_path / "var" / "metrics"
    # DJANGO_DEBUG=false still works there, for the pages a deployment shows.
    off = _settings_in({**_selecting("proxyhub.settings.local", prod_env), "DJANGO_DEBUG": "false"})
    assert off["DEBUG"] is False
    assert off["ssl_redirect"] is False


def test_test_settings_outside_pytest(prod_env: dict[str, str]) -> None:
    """The test module needs nothing from the shell: a fixed key, no HTTPS redirect for the
    test client, process-local metrics; otherwise production's values."""
    dumped = _settings_in(_selecting("proxyhub.settings.test", prod_env))
    assert dumped["DEBUG"] is False
    assert dumped["development_key"] is False
    assert dumped["ssl_redirect"] is False
    assert dumped["multiproc"] == ""
    assert dumped["hsts"] == 31_536_000
    assert dumped["cookies_secure"] == [True, True]


def test_pytest_runs_on_the_test_settings() -> None:
    # pytest-django prefers an exported DJANGO_SETTINGS_MODULE over pyproject.toml.
    assert settings.SETTINGS_MODULE == "proxyhub.settings.test", (
        "DJANGO_SETTINGS_MODULE is exported in this shell; unset it to run the tests"
    )
    assert settings.SECURE_SSL_REDIRECT is False


def test_no_settings_module_sniffs_the_test_runner() -> None:
    """Which settings apply is DJANGO_SETTINGS_MODULE's choice alone, never a guess from the
    environment of a test runner."""
    sources = sorted((REPO / "proxyhub").rglob("*.py"))
    assert any(p.name == "production.py" for p in sources)
    for path in sources:
        text = path.read_text()
        for marker in ("PYTEST_VERSION", "PYTEST_CURRENT_TEST", '"pytest" in sys.modules'):
            assert marker not in text, f"{path.relative_to(REPO)} mentions {marker}"


# --- Celery ------------------------------------------------------------------------------------


def test_celery_configuration_is_pinned() -> None:
    """research/reliability.md §5 item 7."""
    conf = celery_app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"]
    assert conf.task_serializer == "json"
    assert conf.result_serializer == "json"
    assert conf.result_backend is None
    assert conf.task_ignore_result is True
    assert conf.task_soft_time_limit == 120
    assert conf.task_time_limit == 180
    assert conf.broker_connection_retry_on_startup is True
    assert conf.worker_hijack_root_logger is False
    assert conf.beat_scheduler == "django_celery_beat.schedulers:DatabaseScheduler"
    assert conf.task_default_queue == "provisioning"


def test_every_proxyhub_task_has_a_stable_name_and_time_limits() -> None:
    celery_app.loader.import_default_modules()
    ours = {name: task for name, task in celery_app.tasks.items() if name.startswith("proxyhub.")}
    for name, task in ours.items():
        soft = task.soft_time_limit or celery_app.conf.task_soft_time_limit
        hard = task.time_limit or celery_app.conf.task_time_limit
        assert soft and hard and soft < hard, name
    for task in celery_app.tasks.values():
        if task.__module__.startswith(("provisioning", "healthchecks")):
            assert task.name.startswith("proxyhub."), task.name


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("proxyhub.health.check_nodes", "health"),
        ("proxyhub.provisioning.step", "provisioning"),
        ("proxyhub.gc.run", "provisioning"),
    ],
)
def test_tasks_are_routed_to_their_queue(task: str, queue: str) -> None:
    route = celery_app.amqp.router.route({}, task)
    assert route["queue"].name == queue
    # Each queue is bound by its own routing key, so a message reaches exactly one queue.
    assert route["queue"].routing_key == queue


def test_visibility_timeout_rule() -> None:
    """The timeout must exceed 4 x (hard time limit + longest countdown)."""
    rule = {"task_time_limit": 180, "max_backoff": 300}
    redis = "redis://127.0.0.1:6379/0"
    assert (
        check_visibility_timeout(
            broker_url=redis, transport_options={"visibility_timeout": 1920}, **rule
        )
        is None
    )
    too_short = check_visibility_timeout(
        broker_url=redis, transport_options={"visibility_timeout": 1919}, **rule
    )
    assert too_short and "1920" in too_short
    assert check_visibility_timeout(broker_url=redis, transport_options={}, **rule)
    assert check_visibility_timeout(
        broker_url=redis,
        transport_options={"visibility_timeout": 3600},
        task_time_limit=None,
        max_backoff=300,
    )
    # Redis over a Unix socket or through Sentinel has the same rule.
    for url in ("redis+socket:///run/redis.sock", "sentinel://s1:26379", "rediss://r:6380/0"):
        assert check_visibility_timeout(broker_url=url, transport_options={}, **rule)
    # The embedded broker has no visibility timeout to get wrong.
    assert (
        check_visibility_timeout(broker_url="filesystem://", transport_options={}, **rule) is None
    )
    # The configured Redis value satisfies the rule with the configured limits.
    assert (
        check_visibility_timeout(
            broker_url=redis,
            transport_options={"visibility_timeout": 3600},
            task_time_limit=settings.CELERY_TASK_TIME_LIMIT,
            max_backoff=settings.PROXYHUB_STEP_MAX_BACKOFF_SECONDS,
        )
        is None
    )


def test_unsafe_visibility_timeout_fails_the_system_check() -> None:
    with override_settings(
        CELERY_BROKER_URL="redis://127.0.0.1:6379/0",
        CELERY_BROKER_TRANSPORT_OPTIONS={"visibility_timeout": 5},
    ):
        errors = checks.run_checks(tags=["celery"])
    assert [e.id for e in errors] == ["proxyhub.E001"]
    assert not checks.run_checks(tags=["celery"])


def test_a_long_backoff_makes_manage_py_refuse_to_run(prod_env: dict[str, str], manage) -> None:
    env = {
        **prod_env,
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "PROXYHUB_STEP_MAX_BACKOFF_SECONDS": "900",
    }
    done = manage(env, "check")
    assert done.returncode != 0
    assert "proxyhub.E001" in done.stderr


def test_worker_starts_and_logs_json_through_django_logging(
    prod_env: dict[str, str], tmp_path: Path
) -> None:
    """``celery -A proxyhub --quiet worker`` on the embedded broker: every stdout line is one
    JSON object, so the worker really uses Django's LOGGING rather than Celery's handlers."""
    out = tmp_path / "worker.out"
    with out.open("w") as sink:
        worker = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "proxyhub",
                "--quiet",
                "worker",
                "--pool",
                "solo",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
            ],
            env=prod_env,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and worker.poll() is None:
                if " ready." in out.read_text():
                    break
                time.sleep(0.1)
            # Read before stopping it: Celery prints its shutdown notice as plain text.
            lines = out.read_text().splitlines()
        finally:
            # Its warm shutdown is not under test and takes seconds; SIGKILL is immediate.
            worker.kill()
            worker.wait(timeout=30)
    records = [json.loads(line) for line in lines if line.strip()]
    assert any(r["message"].endswith(" ready.") for r in records), lines
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)


# --- error reports -----------------------------------------------------------------------------


def _secret(*parts: str) -> str:
    """Built at run time, so the source lines shown in a traceback never hold the secret."""
    return "-".join(parts)


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.every_database
def test_error_reports_hide_urls_passwords_tokens_and_cloud_init() -> None:
    db_password = _secret("db", "password", "1234")
    broker_password = _secret("broker", "password", "5678")
    token_value = _secret("tok", "secret", "0b7c3a52")
    api_secret = _secret("9f1e2d3c", "aaaa", "bbbb")
    user_data = "#cloud-config\npassword: " + _secret("cloud", "init", "secret", "42")
    database = {**settings.DATABASES["default"], "PASSWORD": db_password}

    def provision(cloud_init: str) -> None:
        token = token_value  # noqa: F841 (a local the report must not show)
        header = {"Authorization": "PVEAPIToken=root@pam!ph=" + api_secret}  # noqa: F841
        raise RuntimeError("provisioning failed")

    with override_settings(
        DATABASES={"default": database},
        CELERY_BROKER_URL=f"redis://:{broker_password}@redis:6379/0",
    ):
        try:
            provision(user_data)
        except RuntimeError:
            reporter = ExceptionReporter(None, *sys.exc_info())
            text = reporter.get_traceback_text()
            html = reporter.get_traceback_html()

    for report in (text, html):
        for secret in (db_password, broker_password, token_value, api_secret, user_data[16:]):
            assert secret not in report
    # The names stay visible (locals are on the HTML page only), so a developer still sees
    # which variable held what.
    assert re.search(r"<td>token</td>", html)
    assert re.search(r"<td>header</td>", html)
    assert "CELERY_BROKER_URL" in text


# --- log lines ---------------------------------------------------------------------------------


def test_log_lines_are_json_objects_with_extra_fields_and_no_token() -> None:
    record = _record(
        "proxmox api call",
        extra={"call": "clone", "vmid": 100123, "node": "pve1", "payload": b"\x00" * 10},
    )
    line = _format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "proxmox api call"
    assert data["level"] == "INFO"
    assert data["logger"] == "proxyhub.proxmox.api"
    assert data["call"] == "clone"
    assert data["vmid"] == 100123
    assert data["payload"] == "<10 bytes>"


def test_a_token_in_message_extra_or_traceback_is_redacted() -> None:
    secret = "9f1e2d3c-1111-2222-3333-444455556666"
    try:
        raise ValueError(f"auth failed for proxyhub@pve!ph={secret}")
    except ValueError:
        record = _record(
            "sent %s",
            args=(f"PVEAPIToken=proxyhub@pve!ph={secret}",),
            extra={"headers": {"Authorization": f"PVEAPIToken=proxyhub@pve!ph={secret}"}},
            exc_info=sys.exc_info(),
        )
    line = _format(record)
    assert secret not in line
    data = json.loads(line)
    assert data["message"] == f"sent PVEAPIToken={REDACTED}"
    assert data["headers"] == {"Authorization": REDACTED}
    assert f"proxyhub@pve!ph={REDACTED}" in data["exc"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PVEAPIToken=root@pam!ci=abc-123", f"PVEAPIToken={REDACTED}"),
        ("Authorization: PVEAPIToken=a@b!c=d'", f"Authorization: PVEAPIToken={REDACTED}'"),
        ("token proxyhub@pve!sim=0b7c3a52, next", f"token proxyhub@pve!sim={REDACTED}, next"),
        ("Authorization: Bearer abc.def", f"Authorization: Bearer {REDACTED}"),
        # Nothing secret: an e-mail address, a key=value pair, a VM name.
        ("admin@example.com set cores=2 on proxy-alpha", None),
    ],
)
def test_redact(text: str, expected: str | None) -> None:
    assert redact(text) == (text if expected is None else expected)
    assert redact(redact(text)) == redact(text)


def _record(msg: str, *, args: tuple = (), extra: dict | None = None, exc_info=None):
    import logging

    record = logging.getLogger("proxyhub.proxmox.api").makeRecord(
        "proxyhub.proxmox.api", logging.INFO, __file__, 1, msg, args, exc_info, extra=extra
    )
    return record


def _format(record) -> str:
    assert RedactSecretsFilter().filter(record) is True
    return JsonFormatter().format(record)
