"""ASGI entry point, for servers that prefer it; proxyhub has no async views of its own."""

from django.core.asgi import get_asgi_application

from proxyhub.settings import select_default_settings_module

select_default_settings_module()

application = get_asgi_application()
