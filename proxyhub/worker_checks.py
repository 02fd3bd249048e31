"""The Django system checks a worker runs when it starts: all but the console's and manage.py's.

Celery's Django fixup runs all of Django's checks at worker start (and discards what they
find) unless ``CELERY_SKIP_CHECKS`` is set. The URL, admin, template and static-file checks,
and the untagged middleware check, import the whole console to inspect it: the URLconf, every
admin module, the two-factor views and ``qrcode``. A worker serves none of that, yet would carry
it in its parent and, by fork, in every pool process (issue 12: the worker's memory). So
``proxyhub.celery`` sets ``CELERY_SKIP_CHECKS`` and the worker runs the remaining checks here,
logging whatever they find; ``manage.py check`` and the web still run every check.

The ``commands`` check (``makemigrations`` and ``migrate`` agree on their autodetector) loads
both commands, and with them Django's migration autodetector, writer and questioner: about
0.6 MiB in each worker process for commands a worker never runs.
"""

from __future__ import annotations

import logging

from django.core import checks

log = logging.getLogger("proxyhub.worker")

# What only the web serves (the worker never loads its URLconf or renders a page), and what
# only manage.py runs.
NOT_WORKER_TAGS = frozenset(
    {
        checks.Tags.admin,
        checks.Tags.urls,
        checks.Tags.templates,
        checks.Tags.staticfiles,
        "commands",  # checks.Tags.commands (Django 5.2), which django-stubs does not list yet
    }
)


def worker_check_tags() -> list[str]:
    return sorted(set(checks.registry.registry.tags_available()) - NOT_WORKER_TAGS)


def run_worker_checks() -> list[checks.CheckMessage]:
    """Run the worker's checks; log each warning or error. Returns what they found."""
    found = checks.run_checks(tags=worker_check_tags())
    for message in found:
        if message.level >= checks.WARNING and not message.is_silenced():
            log.log(
                logging.ERROR if message.is_serious() else logging.WARNING,
                "system check",
                extra={"check_id": message.id, "problem": str(message.msg)},
            )
    return found
