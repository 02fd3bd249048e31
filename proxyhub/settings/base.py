"""Settings every environment shares; every value from the environment (django-environ).

Every variable read here is listed with its default in ``.env.example``. The values are
production's wherever an environment could differ: DEBUG off unless ``DJANGO_DEBUG`` says
otherwise, the HTTPS redirect on, HSTS and secure cookies. ``local`` relaxes what runserver on
127.0.0.1 needs, ``test`` what the test client needs, and ``production`` adds only refusals.

What this module leaves to the one that imports it: ``SECRET_KEY`` (required in production, a
default elsewhere) and the metrics directory (``PROMETHEUS_MULTIPROC_DIR = metrics_dir(...)``),
whose default differs between a test run and everything else.

proxyhub's own knobs are plain ``PROXYHUB_*`` settings (not one dict), so tests can override
each with ``override_settings`` and ``settings.PROXYHUB_STEP_CLAIM_SECONDS`` reads as what it is.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

# Checks the sealing keys without loading cryptography (see its module's text).
from provisioning.sealing import parse_keys as _parse_sealing_keys

BASE_DIR = Path(__file__).resolve().parents[2]


class _NonEmptyEnviron(Mapping[str, str]):
    """``os.environ`` with empty variables hidden, so an empty value means "use the default".

    A copied ``.env.example`` and compose's ``${VAR:-}`` set variables to the empty string;
    without this, ``DJANGO_SECURE_SSL_REDIRECT=`` would read as false and ``DATABASE_URL=`` as a
    broken URL.
    """

    def __getitem__(self, key: str) -> str:
        value = os.environ[key]
        if value == "":
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k, v in os.environ.items() if v != "")

    def __len__(self) -> int:
        return sum(1 for _ in self)


env = environ.Env()
env.ENVIRON = _NonEmptyEnviron()

# Like cookiecutter-django: a .env file is read only when asked, and the process environment
# always wins over it. docker compose (env_file) loads .env itself; `make run` never reads it.
if env.bool("DJANGO_READ_DOT_ENV_FILE", default=False):
    environ.Env.read_env(str(BASE_DIR / ".env"))

# Everything proxyhub writes locally (SQLite database, embedded broker, metrics files, collected
# static files) lives under one directory, so a container mounts one volume. A relative path is
# relative to the repository, not to the working directory.
VAR_DIR = (BASE_DIR / env.str("PROXYHUB_VAR_DIR", default="var")).resolve()


def _ensure_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"cannot create {path} ({type(exc).__name__}); set PROXYHUB_VAR_DIR to a writable "
            "directory"
        ) from exc
    return path


_ensure_dir(VAR_DIR)

# ----------------------------------------------------------------------------------------------
# GENERAL
# ----------------------------------------------------------------------------------------------
# https://docs.djangoproject.com/en/5.2/ref/settings/#debug
# Off unless set: production refuses it on, local turns its default on.
DEBUG = env.bool("DJANGO_DEBUG", default=False)

# https://docs.djangoproject.com/en/5.2/ref/settings/#allowed-hosts
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
# https://docs.djangoproject.com/en/5.2/ref/settings/#csrf-trusted-origins
# Needed when the admin is reached through a proxy on another origin, e.g. https://proxyhub.lan
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

TIME_ZONE = "UTC"
USE_TZ = True
LANGUAGE_CODE = "en-us"
USE_I18N = True

ROOT_URLCONF = "proxyhub.urls"
WSGI_APPLICATION = "proxyhub.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ----------------------------------------------------------------------------------------------
# DATABASES
# ----------------------------------------------------------------------------------------------
# https://docs.djangoproject.com/en/5.2/ref/settings/#databases
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'proxyhub.sqlite3'}"),
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several worker processes, Beat and the web process write to one SQLite file. WAL lets
    # readers run beside the writer; IMMEDIATE takes the write lock when a transaction starts, so
    # a transaction never fails half-way on "database is locked" when it upgrades a read lock
    # (Django 5.1 release notes, "SQLite transaction mode"); the 20 s busy timeout makes a
    # writer wait for the lock instead of failing at once.
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"].setdefault("init_command", "PRAGMA journal_mode=WAL;")
    _db["OPTIONS"].setdefault("transaction_mode", "IMMEDIATE")
    _db["OPTIONS"].setdefault("timeout", 20)
elif _db["ENGINE"] == "django.db.backends.postgresql":
    # An unreachable server must fail /readyz and a worker's step within seconds, not hang on
    # the kernel's TCP connect timeout. A connect_timeout in the URL's query string wins.
    _db.setdefault("OPTIONS", {})
    _db["OPTIONS"].setdefault("connect_timeout", 5)
# Keep a process's database connection across requests (and /readyz probes) instead of opening
# one per request; a connection found broken is replaced at the start of the next request.
_db["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=60)
_db["CONN_HEALTH_CHECKS"] = True

# ----------------------------------------------------------------------------------------------
# APPS AND MIDDLEWARE
# ----------------------------------------------------------------------------------------------
INSTALLED_APPS = [
    # The admin, with the console's site: sign-in asks for a one-time code (proxyhub.twofactor).
    "proxyhub.twofactor.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    # Login throttling: failed logins are counted per username and client address, recorded
    # (the admin's "Access attempts" and "Access failures"), and lock that pair out for a while.
    "axes",
    "csp",  # django-csp's system checks of CONTENT_SECURITY_POLICY
    # TOTP second factor: devices (a table of django-otp's own) and the console's use of them.
    "django_otp",
    "django_otp.plugins.otp_totp",
    "proxyhub.twofactor.apps.TwoFactorConfig",
    "provisioning",
    "healthchecks",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from gunicorn, so the admin works without a separate web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.user.is_verified(): whether this session signed in with a one-time code.
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # After MessageMiddleware: tells the next page when work could not reach the task queue.
    "provisioning.admin.queue_notice.UnsentWorkNoticeMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with the lockout page.
    "axes.middleware.AxesMiddleware",
]

# django-axes first: it refuses a locked-out login before the password is even checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Admin overrides live in <repo>/templates/admin/<app>/<model>/ (DESIGN §3).
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    # 12 characters at least (issue 11): these accounts can destroy every VM in scope.
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# ----------------------------------------------------------------------------------------------
# STATIC FILES
# ----------------------------------------------------------------------------------------------
# With DEBUG on, runserver serves the admin's static files through django.contrib.staticfiles.
# In production `manage.py collectstatic` (the container image runs it) fills STATIC_ROOT and
# WhiteNoise serves it from gunicorn, compressed, with far-future cache headers.
STATIC_URL = "static/"
STATIC_ROOT = _ensure_dir(VAR_DIR / "static")  # WhiteNoise warns when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# ----------------------------------------------------------------------------------------------
# SECURITY
# ----------------------------------------------------------------------------------------------
# The admin is only ever reached over HTTPS in production. Behind a reverse proxy that ends TLS,
# either keep the redirect and set DJANGO_SECURE_PROXY_SSL_HEADER=true so Django trusts the
# proxy's X-Forwarded-Proto (only when the proxy overwrites that header from clients), or let the
# proxy redirect and set DJANGO_SECURE_SSL_REDIRECT=false.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
# Content-Security-Policy (django-csp): scripts, styles, images and fonts only from this site,
# no inline script or style (the provisioning pages keep theirs in static files), no plugins,
# no framing, forms only to this site. The admin works under it; the browser suite fails on any
# violation it reports (tests/e2e/test_admin_browser.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Login throttling (django-axes): after PROXYHUB_LOGIN_FAILURE_LIMIT wrong passwords in a row for
# one username from one address, that pair is refused for PROXYHUB_LOGIN_LOCKOUT_MINUTES, even
# with the right password (a page says so and for how long); a success resets the count. Locking
# the pair, not the username alone, keeps a stranger from locking an operator out. Unlock early
# with `manage.py axes_reset_username USERNAME`. Behind a reverse proxy, the address is the
# proxy's unless DJANGO_SECURE_PROXY_SSL_HEADER says the proxy is trusted (see AXES_IPWARE_*).
# Second factor (django-otp, TOTP): any staff member may enrol an authenticator at
# /admin/two-factor/ (or an operator runs `manage.py totp_enrol USERNAME`); sign-in then asks for
# its code. With PROXYHUB_REQUIRE_2FA, superusers without one are refused. A wrong code counts as a
# failed login for django-axes below.
PROXYHUB_REQUIRE_2FA = env.bool("PROXYHUB_REQUIRE_2FA", default=False)
OTP_TOTP_ISSUER = "proxyhub"  # the account's name in the authenticator app
OTP_ADMIN_HIDE_SENSITIVE_DATA = True  # never a device's key in django-otp's own admin pages
AXES_FAILURE_LIMIT = env.int("PROXYHUB_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("PROXYHUB_LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True  # a row per refused login, for the audit
AXES_LOCKOUT_CALLABLE = "proxyhub.lockout.locked_out"
AXES_VERBOSE = False  # its own log lines are plain text; the refusal is recorded in the database
if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Probes and Prometheus talk to the process directly over the internal network, often by IP
# and plain HTTP; a redirect to HTTPS would fail them.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# One year, subdomains included. Preload stays off: submitting a domain to the browsers' preload
# list is a commitment for every host under it that an operator must make, not a default.
SECURE_HSTS_SECONDS = 31_536_000
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = False
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SECURE = True
X_FRAME_OPTIONS = "DENY"
# security.W021 asks for HSTS preload, which is deliberately off (see above).
SILENCED_SYSTEM_CHECKS = ["security.W021"]

# Error reports (the DEBUG page, mail_admins, Sentry-style reporters) must not show database or
# broker URLs, tokens, or cloud-init, whatever the setting or local variable is called.
DEFAULT_EXCEPTION_REPORTER_FILTER = "proxyhub.error_reports.SensitiveReporterFilter"

# ----------------------------------------------------------------------------------------------
# PROXYHUB
# ----------------------------------------------------------------------------------------------
# GC deletes a managed VM or seed ISO without a live proxy only when it is older than this, so a
# create that has not yet written its row is never collected (DESIGN §5 GC).
# Seed 000 entry 3 requires a zone on a cluster of several nodes; proxyhub places a blank
# zone itself unless this is set (docs/operator-guide.md, "Placement").
PROXYHUB_ZONE_REQUIRED = env.bool("PROXYHUB_ZONE_REQUIRED", default=False)
# How many proxies one bulk create (the admin's bulk page, `proxies create`) may declare, for a
# user without a UserQuota of their own and for every command (docs/operator-guide.md, "Quotas").
PROXYHUB_MAX_BULK_CREATE = env.int("PROXYHUB_MAX_BULK_CREATE", default=100)
PROXYHUB_GC_MIN_AGE_SECONDS = env.int("PROXYHUB_GC_MIN_AGE_SECONDS", default=900)
# Issue 11: the one directory a cluster's tokenFile and caFile may name files in (symlinks
# resolved), so no one who may edit a cluster can have another file sent as its token or probe
# the worker's file system. A relative value is relative to the repository.
PROXYHUB_CREDENTIALS_DIR = str(
    (BASE_DIR / env.str("PROXYHUB_CREDENTIALS_DIR", default="/etc/proxyhub")).resolve()
)

# A create ejects the seed ISO (it holds the user-data) and removes it from isoStorage once the
# guest has reported its address; true keeps it, for images that read cloud-init on every boot.
PROXYHUB_KEEP_SEED_ISO = env.bool("PROXYHUB_KEEP_SEED_ISO", default=False)
# Beat intervals, used by the data migration that creates the periodic tasks.
PROXYHUB_RECONCILE_INTERVAL_SECONDS = env.int("PROXYHUB_RECONCILE_INTERVAL_SECONDS", default=60)
PROXYHUB_GC_INTERVAL_SECONDS = env.int("PROXYHUB_GC_INTERVAL_SECONDS", default=300)
PROXYHUB_SWEEPER_INTERVAL_SECONDS = env.int("PROXYHUB_SWEEPER_INTERVAL_SECONDS", default=10)
PROXYHUB_HEALTH_INTERVAL_SECONDS = env.int("PROXYHUB_HEALTH_INTERVAL_SECONDS", default=60)
PROXYHUB_HEALTH_RETENTION_DAYS = env.int("PROXYHUB_HEALTH_RETENTION_DAYS", default=7)
# A health round's deadline per cluster; a node not answered by then reports Timeout.
PROXYHUB_HEALTH_DEADLINE_SECONDS = env.float("PROXYHUB_HEALTH_DEADLINE_SECONDS", default=20.0)
# Health results older than this no longer steer placement (a stopped Beat must not block it).
PROXYHUB_HEALTH_STALE_SECONDS = env.int(
    "PROXYHUB_HEALTH_STALE_SECONDS", default=5 * PROXYHUB_HEALTH_INTERVAL_SECONDS
)
# How often Beat prunes health history older than the retention.
PROXYHUB_HEALTH_PRUNE_INTERVAL_SECONDS = env.int(
    "PROXYHUB_HEALTH_PRUNE_INTERVAL_SECONDS", default=3600
)
# Days the journal keeps a finished operation (services.retention); a live proxy's newest
# finished operation of each kind is kept regardless. 0 keeps everything.
PROXYHUB_JOURNAL_RETENTION_DAYS = env.int("PROXYHUB_JOURNAL_RETENTION_DAYS", default=90)
# How often Beat prunes the journal.
PROXYHUB_JOURNAL_PRUNE_INTERVAL_SECONDS = env.int(
    "PROXYHUB_JOURNAL_PRUNE_INTERVAL_SECONDS", default=3600
)
# How often Beat refreshes the inventory snapshot of every cluster (services.inventory), and
# how long one cluster's refresh may take before it fails and keeps the previous snapshot.
PROXYHUB_INVENTORY_INTERVAL_SECONDS = env.int("PROXYHUB_INVENTORY_INTERVAL_SECONDS", default=300)
PROXYHUB_INVENTORY_DEADLINE_SECONDS = env.float(
    "PROXYHUB_INVENTORY_DEADLINE_SECONDS", default=120.0
)
# The control loop's timings (docs/operator-guide.md, "Retries and ceilings"; the defaults and
# their reasons are in provisioning/services/policy.py, circuit.py, rounds.py and sweeper.py).
# A delivery's claim on a step: renewed every third of it while the step runs, so a worker
# killed mid-step frees its step within this time and the sweeper sends it again.
PROXYHUB_STEP_CLAIM_SECONDS = env.float("PROXYHUB_STEP_CLAIM_SECONDS", default=20.0)
# How late a step may be before the sweeper sends its message again (same token, no loss).
PROXYHUB_SWEEPER_GRACE_SECONDS = env.float("PROXYHUB_SWEEPER_GRACE_SECONDS", default=10.0)
# Admission control (issue 12, services/slots.py): at most this many Proxmox tasks in flight per
# node (Proxmox's own worker limit is about this size; more only queue inside the node), and per
# storage by name (0: no storage limit). A step that finds no slot waits for one in the journal.
PROXYHUB_NODE_TASK_LIMIT = env.int("PROXYHUB_NODE_TASK_LIMIT", default=3)
PROXYHUB_STORAGE_TASK_LIMIT = env.int("PROXYHUB_STORAGE_TASK_LIMIT", default=0)
# On PostgreSQL a step delivery's statements are prepared once per connection (issue 12,
# services/prepared_statements.py); false behind a pooler that cannot keep them.
PROXYHUB_DB_PREPARED_STATEMENTS = env.bool("PROXYHUB_DB_PREPARED_STATEMENTS", default=True)
# Retries where the fault happened: a GET meeting a transient fault is sent again this many
# times (at once, then after a jittered pause doubling from the given one); a step that still
# fails transiently is run again in the same delivery this many times (it reads back first).
PROXYHUB_READ_RETRIES = env.int("PROXYHUB_READ_RETRIES", default=3)
PROXYHUB_READ_RETRY_PAUSE_SECONDS = env.float("PROXYHUB_READ_RETRY_PAUSE_SECONDS", default=0.2)
PROXYHUB_STEP_RETRIES_IN_PLACE = env.int("PROXYHUB_STEP_RETRIES_IN_PLACE", default=2)
# Then a short backoff: base * 2^(n-1), jittered, capped well under a minute.
PROXYHUB_STEP_BASE_BACKOFF_SECONDS = env.float("PROXYHUB_STEP_BASE_BACKOFF_SECONDS", default=1.0)
PROXYHUB_STEP_MAX_BACKOFF_SECONDS = env.float("PROXYHUB_STEP_MAX_BACKOFF_SECONDS", default=20.0)
# Ceilings: an operation ends failed, with its last error, after this many failed deliveries in
# a row or past its kind's age.
PROXYHUB_MAX_ATTEMPTS = env.int("PROXYHUB_MAX_ATTEMPTS", default=20)
PROXYHUB_MAX_AGE_CREATE_SECONDS = env.int("PROXYHUB_MAX_AGE_CREATE_SECONDS", default=3600)
PROXYHUB_MAX_AGE_REPLACE_SECONDS = env.int("PROXYHUB_MAX_AGE_REPLACE_SECONDS", default=5400)
PROXYHUB_MAX_AGE_DELETE_SECONDS = env.int("PROXYHUB_MAX_AGE_DELETE_SECONDS", default=3600)
PROXYHUB_MAX_AGE_POWER_SECONDS = env.int("PROXYHUB_MAX_AGE_POWER_SECONDS", default=1800)
PROXYHUB_MAX_AGE_REPAIR_SECONDS = env.int("PROXYHUB_MAX_AGE_REPAIR_SECONDS", default=1800)
# Drift (issue 14): a converged proxy VM's config is compared with its spec again after this
# many seconds, at most this share of a cluster's proxies per reconcile round (services/drift.py).
PROXYHUB_DRIFT_RECHECK_SECONDS = env.int("PROXYHUB_DRIFT_RECHECK_SECONDS", default=3600)
PROXYHUB_DRIFT_ROTATION_SHARE = env.float("PROXYHUB_DRIFT_ROTATION_SHARE", default=0.05)
# A template build (issue 14): download, create with import, resize, conversion.
PROXYHUB_MAX_AGE_TEMPLATE_BUILD_SECONDS = env.int(
    "PROXYHUB_MAX_AGE_TEMPLATE_BUILD_SECONDS", default=3600
)
# Maintenance (issue 14, services/maintenance.py): a step held by a maintenance switch looks
# again after this many seconds (ending the switch sends it at once; this bounds a lost send).
# Time held does not count toward the age ceilings above.
PROXYHUB_MAINTENANCE_RECHECK_SECONDS = env.float(
    "PROXYHUB_MAINTENANCE_RECHECK_SECONDS", default=15.0
)
# The per-cluster circuit breaker: opens after this many connection failures in a row (at once
# after one that held a worker 2 s or more), defers the cluster's steps for the open interval
# (doubling after a failed probe, up to the maximum).
PROXYHUB_CIRCUIT_FAILURES = env.int("PROXYHUB_CIRCUIT_FAILURES", default=5)
PROXYHUB_CIRCUIT_OPEN_SECONDS = env.float("PROXYHUB_CIRCUIT_OPEN_SECONDS", default=15.0)
PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS = env.float("PROXYHUB_CIRCUIT_MAX_OPEN_SECONDS", default=120.0)
# When the breaker's time is up, one cheap request bounded by this many seconds probes the cluster.
PROXYHUB_CIRCUIT_PROBE_SECONDS = env.float("PROXYHUB_CIRCUIT_PROBE_SECONDS", default=3.0)
# How long the probing delivery waits for the probe's answer before it defers its step and
# leaves the verdict to the probe's own thread (a silent cluster then costs a worker this much).
PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS = env.float("PROXYHUB_CIRCUIT_PROBE_WAIT_SECONDS", default=0.5)
# Reconcile and GC rounds stop starting new work after the deadline; their tasks' time limits
# follow it. Their job lease is short and renewed while the round runs, so a round killed with
# its worker frees its job within one lease length (system check proxyhub.E002).
PROXYHUB_ROUND_DEADLINE_SECONDS = env.int("PROXYHUB_ROUND_DEADLINE_SECONDS", default=240)
PROXYHUB_JOB_LEASE_SECONDS = env.int("PROXYHUB_JOB_LEASE_SECONDS", default=30)
# GC removes at most this many VMs and seed ISOs per round; the rest wait for the next round.
PROXYHUB_GC_MAX_DELETES_PER_ROUND = env.int("PROXYHUB_GC_MAX_DELETES_PER_ROUND", default=50)
# This installation's identity outside the database (services/installation.py): GC deletes only
# when it agrees with the database's. Empty: read from the file below (written on first start).
PROXYHUB_INSTALLATION_ID = env.str("PROXYHUB_INSTALLATION_ID", default="")
PROXYHUB_INSTALLATION_ID_FILE = env.str(
    "PROXYHUB_INSTALLATION_ID_FILE", default=str(VAR_DIR / "installation-id")
)
# The bearer token /metrics asks for (compared in constant time). Production refuses to start
# without one unless PROXYHUB_METRICS_PUBLIC=true says /metrics is deliberately open (say, behind a
# network policy); local and test leave it open when empty (runserver listens on 127.0.0.1 only).
PROXYHUB_METRICS_TOKEN = env.str("PROXYHUB_METRICS_TOKEN", default="")
PROXYHUB_METRICS_PUBLIC = env.bool("PROXYHUB_METRICS_PUBLIC", default=False)
# The journal grows without bound, so /metrics counts its finished operations (succeeded,
# failed) at most once per this many seconds per web process and serves that summary in between;
# operations still in flight are counted at every scrape (few rows, read through an index).
PROXYHUB_METRICS_SUMMARY_SECONDS = env.float("PROXYHUB_METRICS_SUMMARY_SECONDS", default=30.0)
# /readyz keeps its verdict this many seconds per web process, so a probe storm costs one
# database query and one broker round trip per window.
PROXYHUB_READYZ_CACHE_SECONDS = env.float("PROXYHUB_READYZ_CACHE_SECONDS", default=5.0)

_log_level = env.str("PROXYHUB_LOG_LEVEL", default="INFO").upper()
if _log_level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        "PROXYHUB_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"
    )
PROXYHUB_LOG_LEVEL = _log_level


# The keys that seal cloud-init and vendor-data at rest (provisioning.sealing): Fernet keys,
# comma-separated, newest first. The newest seals; all of them open, so a rotation puts a new
# key in front, runs `manage.py rotate_sealing_key`, then drops the old one. Production refuses
# to start without one; `make run` generates one into var/sealing-key on first start.
# Each key is checked here, so a bad one stops every process at start; its value is never echoed.
PROXYHUB_SEALING_KEYS = _parse_sealing_keys(env.list("PROXYHUB_SEALING_KEYS", default=[]))

# Before PROXYHUB_SEALING_KEYS, cloud-init was sealed with a key derived from this (or, unset,
# from DJANGO_SECRET_KEY). That derived key still opens, last, so an upgraded install reads its
# rows until rotate_sealing_key re-seals them; keep the old value set until then.
PROXYHUB_SECRETS_KEY = env.str("PROXYHUB_SECRETS_KEY", default="")
if PROXYHUB_SECRETS_KEY and len(PROXYHUB_SECRETS_KEY) < 32:
    # The value itself is never echoed: it is a secret.
    raise ImproperlyConfigured(
        "PROXYHUB_SECRETS_KEY must be at least 32 characters; generate one with "
        "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
    )

# How long the bulk-create confirmation's token (the cloud-init carried from the preview to the
# confirm) stays valid, in seconds.
PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS = env.int(
    "PROXYHUB_BULK_CONFIRM_MAX_AGE_SECONDS", default=600
)

# ----------------------------------------------------------------------------------------------
# CELERY
# ----------------------------------------------------------------------------------------------
# https://docs.celeryq.dev/en/stable/userguide/configuration.html
REDIS_URL = env.str("REDIS_URL", default="")


def redis_transport_options(timeout: float) -> dict[str, object]:
    """kombu's Redis transport options. The socket timeouts bound a publish to a Redis that does
    not answer (a host that drops packets, a hung server): without them a web request sending
    after commit waits for the kernel's TCP timeout, minutes (services.dispatch); kombu's own
    documentation asks for ``socket_timeout`` wherever the broker can vanish without closing the
    connection. A worker's BRPOP waits 1 s per round, well inside them."""
    return {
        "visibility_timeout": 3600,
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
    }


# Seconds a connection to the broker, or one read or write on it, may take before a publish
# counts as failed.
PROXYHUB_BROKER_TIMEOUT_SECONDS = env.float("PROXYHUB_BROKER_TIMEOUT_SECONDS", default=3.0)
BROKER_DIR = VAR_DIR / "broker"

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    # Redis redelivers a message that is not acknowledged within the visibility timeout, and a
    # worker holds a countdown message unacknowledged until it runs. So the timeout must be well
    # above the longest task (hard limit) plus the longest countdown, or a step still running or
    # still waiting out its countdown is delivered twice (research/reliability.md §5 item 6; the
    # rule is enforced by the system check in proxyhub.celery).
    # The socket timeouts bound a publish to a Redis that does not answer (below).
    CELERY_BROKER_TRANSPORT_OPTIONS = redis_transport_options(PROXYHUB_BROKER_TIMEOUT_SECONDS)
else:
    # The embedded broker for one machine: kombu's filesystem transport needs no server. Producer
    # and consumer read this same configuration, so "in" and "out" are one folder. The control
    # folder holds the exchange tables (it defaults to ./control relative to the working
    # directory, hence set explicitly). Messages are not kept after delivery.
    # The host part means nothing to this transport; naming one avoids kombu's warning. kombu's
    # own class can hand a worker a half-written message, which stops it; ours publishes whole
    # files (proxyhub/embedded_broker.py).
    CELERY_BROKER_URL = "filesystem://localhost/"
    CELERY_BROKER_TRANSPORT = "proxyhub.embedded_broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_ensure_dir(BROKER_DIR / "queue")),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(_ensure_dir(BROKER_DIR / "processed")),
        "control_folder": str(_ensure_dir(BROKER_DIR / "control")),
        "store_processed": False,
        # The folder is polled; every create is a chain of eight or more step messages, so a
        # tenth of a second instead of the default second keeps a first proxy quick.
        "polling_interval": 0.1,
    }

# Keep retrying the broker while it starts (compose starts everything at once).
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A publish gives up within seconds when the broker is down: a few quick retries, then the
# sender logs it and the journal sweeper sends the step once the broker is back. A web request
# never hangs on a dead broker after its data committed (services.dispatch).
CELERY_BROKER_CONNECTION_TIMEOUT = PROXYHUB_BROKER_TIMEOUT_SECONDS
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 1,
}
# JSON only: a pickle payload from the broker is code execution.
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_ACCEPT_CONTENT = ["json"]
# The journal (Operation, OperationStep) is the record of outcomes; no result backend is needed.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# A step is acknowledged only when it finished, and comes back when its worker dies mid-step:
# every step is idempotent and resumes from what Proxmox holds (seed 000 "what a retry finds").
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A message that can no longer be acknowledged (the broker connection was lost) will be
# redelivered anyway, so the running copy is cancelled rather than finishing twice.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# One message reserved per worker process: with late acks a prefetched message waits behind a
# long step instead of being taken by an idle worker.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A step never sleeps on Proxmox (it re-enqueues with a countdown), so two minutes is generous;
# the soft limit lets the step record its state before the hard limit kills the process.
CELERY_TASK_SOFT_TIME_LIMIT = 120
CELERY_TASK_TIME_LIMIT = 180
# Three queues so bulk provisioning can starve neither node health checks nor the control loop;
# a plain `celery -A proxyhub worker` consumes all, a deployment may split them with -Q.
# Each queue has its own exchange and routing key: queues declared by name alone share the
# default exchange and routing key, and a message would land in both.
CELERY_TASK_DEFAULT_QUEUE = "provisioning"
CELERY_TASK_DEFAULT_EXCHANGE = "provisioning"
CELERY_TASK_DEFAULT_ROUTING_KEY = "provisioning"
CELERY_TASK_QUEUES = (
    Queue("provisioning", Exchange("provisioning", type="direct"), routing_key="provisioning"),
    Queue("health", Exchange("health", type="direct"), routing_key="health"),
    Queue("control", Exchange("control", type="direct"), routing_key="control"),
)
# Sweep, reconcile and GC keep the loop alive: their own small queue, which a backlog of step
# messages cannot starve (a worker consumes its queues in turn).
CELERY_TASK_ROUTES = {
    "proxyhub.health.*": {"queue": "health"},
    "proxyhub.provisioning.sweep": {"queue": "control"},
    "proxyhub.provisioning.reconcile": {"queue": "control"},
    "proxyhub.provisioning.gc": {"queue": "control"},
    "proxyhub.provisioning.prune_journal": {"queue": "control"},
    "proxyhub.provisioning.inventory_refresh": {"queue": "control"},
}
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Celery's Django fixup closes a worker's database connection around every task unless this is
# set, and then only every this many tasks; between those, proxyhub.celery applies CONN_MAX_AGE
# and the health check around each task, as Django does around a request.
CELERY_DB_REUSE_MAX = 1000
# Workers log through Django's LOGGING (proxyhub.celery connects setup_logging).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# ----------------------------------------------------------------------------------------------
# METRICS
# ----------------------------------------------------------------------------------------------
# Proxmox calls happen in worker processes, /metrics is served by the web process: both write
# their counters to files in one directory (prometheus_client's multiprocess mode) and /metrics
# adds them up. prometheus_client decides the mode when it is first imported, so the variable is
# exported here, before anything imports it. Every process on a machine must share the directory;
# empty it before starting them (not while they run).


def metrics_dir(*, default: str) -> str:
    """``PROMETHEUS_MULTIPROC_DIR``, exported for prometheus_client and created; empty for
    process-local metrics. The importing module calls it with its own default."""
    path = env.str("PROMETHEUS_MULTIPROC_DIR", default=default)
    if path:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        _ensure_dir(Path(path))
    return path


# ----------------------------------------------------------------------------------------------
# LOGGING
# ----------------------------------------------------------------------------------------------
# One JSON object per line on stdout, for web, workers and Beat alike. The console handler
# filters by PROXYHUB_LOG_LEVEL; the Proxmox API logger always emits INFO so the metrics handler
# sees every call even when the console shows only warnings.
_proxmox_api_level = min(logging.INFO, logging.getLevelName(PROXYHUB_LOG_LEVEL))
# Services (gunicorn, celery, runserver) log JSON lines to stdout. A management command prints
# its own output there (``proxies list --json``, ``gc --json``), so its logs go to stderr and the
# output stays parseable.
_MANAGE_COMMAND = sys.argv[1] if Path(sys.argv[0]).name == "manage.py" and len(sys.argv) > 1 else ""
_LOG_STREAM = (
    "ext://sys.stderr" if _MANAGE_COMMAND and _MANAGE_COMMAND != "runserver" else "ext://sys.stdout"
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact_secrets": {"()": "proxyhub.logging.RedactSecretsFilter"},
    },
    "formatters": {
        "json": {"()": "proxyhub.logging.JsonFormatter"},
    },
    "handlers": {
        "stdout": {
            "class": "logging.StreamHandler",
            "stream": _LOG_STREAM,
            "formatter": "json",
            "filters": ["redact_secrets"],
            "level": PROXYHUB_LOG_LEVEL,
        },
        "step_metrics": {
            "class": "proxyhub.metrics.StepMetricsHandler",
            "level": "DEBUG",
        },
        "proxmox_metrics": {
            "class": "proxyhub.metrics.ProxmoxCallMetricsHandler",
            "level": "INFO",
        },
    },
    "root": {"handlers": ["stdout"], "level": PROXYHUB_LOG_LEVEL},
    "loggers": {
        # Django's defaults print to stderr in DEBUG and mail admins otherwise; everything goes
        # through the one JSON handler instead.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": [], "level": "INFO", "propagate": True},
        # The journal's per-stage lines feed the step-duration histogram; they are DEBUG, so the
        # console shows them only at PROXYHUB_LOG_LEVEL=DEBUG.
        "proxyhub.operations.steps": {
            "handlers": ["step_metrics"],
            "level": "DEBUG",
            "propagate": True,
        },
        "proxyhub.proxmox.api": {
            "handlers": ["proxmox_metrics"],
            "level": logging.getLevelName(_proxmox_api_level),
            "propagate": True,
        },
    },
}

# ----------------------------------------------------------------------------------------------
# POLLING (integration tests and benchmarks shorten these against the `fast` simulator)
# ----------------------------------------------------------------------------------------------
# The pause between polls of a running Proxmox task or VM status (Budgets.poll_interval), and
# between guest-agent reads while a started VM has no address yet. A wait on a task or a boot
# first sleeps until its learned expected end (provisioning.proxmox.waits), then polls on an
# interval doubling from 50 ms: these two are that interval's ceiling.
PROXYHUB_POLL_INTERVAL_SECONDS = env.float("PROXYHUB_POLL_INTERVAL_SECONDS", default=1.0)
PROXYHUB_ADDRESS_POLL_SECONDS = env.float("PROXYHUB_ADDRESS_POLL_SECONDS", default=3.0)
