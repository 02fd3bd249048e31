"""Settings of a deployment: ``base`` as it is, plus the refusals that keep it safe.

The default module of ``manage.py``, ``proxyhub.wsgi``, ``proxyhub.asgi`` and ``celery -A
proxyhub``. It refuses to start, with an ImproperlyConfigured that names the variable, without
``DJANGO_SECRET_KEY`` (sessions and password resets depend on it), without
``PROXYHUB_SEALING_KEYS`` (cloud-init and vendor-data are sealed with it), without
``PROXYHUB_METRICS_TOKEN`` unless ``PROXYHUB_METRICS_PUBLIC`` is true, and with ``DJANGO_DEBUG``
true. Every other variable has a working default. It passes
``manage.py check --deploy --fail-level WARNING``.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import (
    DEBUG,
    PROXYHUB_METRICS_PUBLIC,
    PROXYHUB_METRICS_TOKEN,
    PROXYHUB_SEALING_KEYS,
    VAR_DIR,
    env,
    metrics_dir,
)

if DEBUG:
    raise ImproperlyConfigured(
        "DJANGO_DEBUG is true, which proxyhub.settings.production refuses: debug pages show "
        "tracebacks and settings to whoever reaches the site. Unset DJANGO_DEBUG in a "
        "deployment; for development select DJANGO_SETTINGS_MODULE=proxyhub.settings.local"
    )

# https://docs.djangoproject.com/en/5.2/ref/settings/#secret-key
# An empty value counts as unset (base's environment), so `DJANGO_SECRET_KEY=` is refused too.
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set, and proxyhub.settings.production needs it: set it to 50+ "
        "random characters (python -c 'import secrets; print(secrets.token_urlsafe(50))'), the "
        "same on every machine of the deployment"
    )

# A key of its own, so rotating DJANGO_SECRET_KEY never makes stored cloud-init unreadable
# (provisioning.sealing); no fallback here, since one derived from a value in the repository or
# from SECRET_KEY is exactly what this setting replaces.
if not PROXYHUB_SEALING_KEYS:
    raise ImproperlyConfigured(
        "PROXYHUB_SEALING_KEYS is not set, and proxyhub.settings.production needs it: set it to "
        "a Fernet key (python -c 'from cryptography.fernet import Fernet; "
        "print(Fernet.generate_key().decode())'), the same on every machine of the deployment; "
        "an install upgraded from PROXYHUB_SECRETS_KEY keeps that set too until "
        "manage.py rotate_sealing_key has run"
    )

# /metrics names every cluster, node and proxy count: not for whoever reaches the port.
if not PROXYHUB_METRICS_TOKEN and not PROXYHUB_METRICS_PUBLIC:
    raise ImproperlyConfigured(
        "PROXYHUB_METRICS_TOKEN is not set, and proxyhub.settings.production needs it for "
        "/metrics: set it to 32+ random characters (python -c 'import secrets; "
        "print(secrets.token_urlsafe(32))') and give Prometheus the same value as its bearer "
        "token, or set PROXYHUB_METRICS_PUBLIC=true to serve /metrics without one"
    )

PROMETHEUS_MULTIPROC_DIR = metrics_dir(default=str(VAR_DIR / "metrics"))
