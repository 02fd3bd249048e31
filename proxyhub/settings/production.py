"""Settings of a deployment: ``base`` as it is, plus the refusals that keep it safe.

The default module of ``manage.py``, ``proxyhub.wsgi``, ``proxyhub.asgi`` and ``celery -A
proxyhub``. It refuses to start, with an ImproperlyConfigured that names the variable, without
``DJANGO_SECRET_KEY`` (sessions, password resets and the cloud-init seal depend on it) and with
``DJANGO_DEBUG`` true, and without ``PROXYHUB_METRICS_TOKEN`` unless ``PROXYHUB_METRICS_PUBLIC``
is true. Nothing else is required (DESIGN.md §7): ``PROXYHUB_SECRETS_KEY`` is
recommended but falls back to a key derived from ``DJANGO_SECRET_KEY``, and every other variable
has a working default. It passes ``manage.py check --deploy --fail-level WARNING``.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import DEBUG, PROXYHUB_METRICS_PUBLIC, PROXYHUB_METRICS_TOKEN, VAR_DIR, env, metrics_dir

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

# /metrics names every cluster, node and proxy count: not for whoever reaches the port.
if not PROXYHUB_METRICS_TOKEN and not PROXYHUB_METRICS_PUBLIC:
    raise ImproperlyConfigured(
        "PROXYHUB_METRICS_TOKEN is not set, and proxyhub.settings.production needs it for "
        "/metrics: set it to 32+ random characters (python -c 'import secrets; "
        "print(secrets.token_urlsafe(32))') and give Prometheus the same value as its bearer "
        "token, or set PROXYHUB_METRICS_PUBLIC=true to serve /metrics without one"
    )

PROMETHEUS_MULTIPROC_DIR = metrics_dir(default=str(VAR_DIR / "metrics"))
