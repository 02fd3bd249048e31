"""Settings of the browser tier's worker process: production's, with the embedded broker
polled every tenth of a second instead of every second, so each of a create's eight steps
does not wait up to a second for its message (the ``fast`` simulator's tasks take tenths)."""

from proxyhub.settings.production import *  # noqa: F403
from proxyhub.settings.production import CELERY_BROKER_TRANSPORT_OPTIONS

CELERY_BROKER_TRANSPORT_OPTIONS = {**CELERY_BROKER_TRANSPORT_OPTIONS, "polling_interval": 0.1}
