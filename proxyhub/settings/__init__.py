"""proxyhub's settings, one module per environment, every value from the environment.

``DJANGO_SETTINGS_MODULE`` names one of them (the package itself is not a settings module):

- ``proxyhub.settings.production``: the default of ``manage.py``, ``proxyhub.wsgi``,
  ``proxyhub.asgi`` and ``celery -A proxyhub``, so an operator who sets only the variables of
  ``.env.example`` gets it. DEBUG is off, HTTPS and secure cookies are on, and it refuses to start
  without ``DJANGO_SECRET_KEY`` or with ``DJANGO_DEBUG`` true; it passes
  ``manage.py check --deploy --fail-level WARNING``.
- ``proxyhub.settings.local``: what ``make run`` selects (bin/run-local). DEBUG on unless
  ``DJANGO_DEBUG`` is false, a throwaway secret key when none is set, plain HTTP on 127.0.0.1 (no
  HTTPS redirect, no HSTS, cookies over HTTP). A command run by hand beside ``make run`` selects
  it too: ``export DJANGO_SETTINGS_MODULE=proxyhub.settings.local``.
- ``proxyhub.settings.test``: what pytest uses (``[tool.pytest.ini_options]`` in
  pyproject.toml). A fixed test key, no HTTPS redirect for the test client, process-local
  metrics unless ``PROMETHEUS_MULTIPROC_DIR`` is set.
- ``proxyhub.settings.base``: everything they share; imported by the others, never selected.

So ``DJANGO_DEBUG`` means one thing, DEBUG on or off: in local (default on) and test (default
off) either way; in production only off, since debug pages there would show what must stay
private. ``make run`` no longer sets it: selecting local is what turns DEBUG on.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

DEFAULT_SETTINGS_MODULE = "proxyhub.settings.production"

if os.environ.get("DJANGO_SETTINGS_MODULE") == __name__:
    # Django would load the package as an empty settings module: no apps, so `migrate` would
    # report nothing to do instead of failing. The value the single settings.py used to have.
    raise ImproperlyConfigured(
        f"DJANGO_SETTINGS_MODULE={__name__} names the settings package; select "
        f"{DEFAULT_SETTINGS_MODULE} (or proxyhub.settings.local for development)"
    )


def select_default_settings_module() -> None:
    """Select production unless ``DJANGO_SETTINGS_MODULE`` names a module.

    An empty value counts as unset, as for every variable in ``.env.example``, so a copied
    ``.env`` that leaves it empty still selects production.
    """
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        os.environ["DJANGO_SETTINGS_MODULE"] = DEFAULT_SETTINGS_MODULE
