"""The proxyhub Django project.

The Celery app is imported here so that ``celery -A proxyhub`` finds it as ``celery_app``, and so
that it exists (and ``shared_task`` binds to it) whenever Django starts.
"""

from .celery import app as celery_app

__all__ = ("celery_app",)
