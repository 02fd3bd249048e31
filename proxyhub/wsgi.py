"""WSGI entry point for gunicorn: ``gunicorn proxyhub.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proxyhub.settings")

application = get_wsgi_application()
