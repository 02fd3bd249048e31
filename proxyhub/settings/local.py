"""Settings of ``make run``: runserver in plain HTTP on 127.0.0.1, for one developer.

bin/run-local selects this module for migrate, the catalogue import, the admin user and the
Procfile's web, worker and Beat; a command run by hand beside it selects it too
(``DJANGO_SETTINGS_MODULE=proxyhub.settings.local``). Everything else is ``base``: the same
SQLite file and embedded broker under ``var/``, the same metrics directory, the same knobs.
``manage.py check --deploy`` fails here, by design.
"""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import BASE_DIR, DATABASES, PROXYHUB_SEALING_KEYS, VAR_DIR, env, metrics_dir

# Django's debug pages and runserver's static files; DJANGO_DEBUG=false shows the pages a
# deployment would.
DEBUG = env.bool("DJANGO_DEBUG", default=True)

# A throwaway key, so a fresh clone runs with no setup; "django-insecure-" makes check --deploy
# flag it (security.W009) should it ever reach a deployment.
SECRET_KEY = env.str(
    "DJANGO_SECRET_KEY", default="django-insecure-proxyhub-development-key-never-in-production"
)

# The key bin/run-local generated into var/ on the first `make run` (kept out of git), so a
# command run by hand beside it opens what the stack sealed. Unset and no file: the key derived
# from SECRET_KEY (provisioning.sealing), good for a shell, never for a deployment.
_SEALING_KEY_FILE = VAR_DIR / "sealing-key"
if not PROXYHUB_SEALING_KEYS and _SEALING_KEY_FILE.is_file():
    PROXYHUB_SEALING_KEYS = [_SEALING_KEY_FILE.read_text().strip()]

# runserver speaks plain HTTP: no redirect to HTTPS, no HSTS (a browser would remember it for
# 127.0.0.1 for a year), and cookies a browser sends over HTTP.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False

# runserver answers each request on a thread of its own, so a kept connection would only pile up
# (Django's docs: no persistent connections in development).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=0)

PROMETHEUS_MULTIPROC_DIR = metrics_dir(default=str(VAR_DIR / "metrics"))

# The bundled simulator writes its token and CA under var/pvesim (bin/run-local sets the same
# value); a real cluster's files go wherever PROXYHUB_CREDENTIALS_DIR says.
PROXYHUB_CREDENTIALS_DIR = str(
    (BASE_DIR / env.str("PROXYHUB_CREDENTIALS_DIR", default=str(VAR_DIR / "pvesim"))).resolve()
)
