"""ASGI entry point, for servers that prefer it; proxyhub has no async views of its own."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proxyhub.settings")

application = get_asgi_application()
