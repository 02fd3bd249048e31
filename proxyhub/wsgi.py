"""WSGI entry point for gunicorn: ``gunicorn proxyhub.wsgi``."""

from django.core.wsgi import get_wsgi_application

from proxyhub.settings import select_default_settings_module

select_default_settings_module()

application = get_wsgi_application()
