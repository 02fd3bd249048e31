"""The console says so when the task queue could not be reached (issue 11).

An admin add or action records its operations and commits; the step messages are sent after
commit (``services.dispatch``). When the broker is down that send fails, the request still
succeeds (the data is committed), and this middleware adds a warning to the page that follows:
the work is recorded and starts once the queue is reachable, because the journal sweeper sends
every step whose message never left. It is told of the failures by ``dispatch`` itself (the
``collecting_unsent`` record of this request), so the page says it only when a send really
failed, never on a guess from probing the broker.

It sits after ``MessageMiddleware`` in ``MIDDLEWARE``, so the message it adds once the view
returned is stored with the response and shown on the next page (the redirect after an add or
an action).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.utils.translation import ngettext

from provisioning.services import dispatch


def unsent_message(unsent: dispatch.Unsent) -> str:
    """The warning for what this request could not send."""
    parts = []
    if unsent.operations:
        count = len(unsent.operations)
        parts.append(
            ngettext(
                "The task queue is unreachable: %(count)d operation is recorded and will start "
                "once the queue is reachable again (the journal sweeper sends it then).",
                "The task queue is unreachable: %(count)d operations are recorded and will "
                "start once the queue is reachable again (the journal sweeper sends them then).",
                count,
            )
            % {"count": count}
        )
    for what in unsent.other:
        prefix = "" if parts else "The task queue is unreachable: "
        parts.append(f"{prefix}the {what} was not sent; Beat runs it once the queue is back.")
    return " ".join(parts)


class UnsentWorkNoticeMiddleware:
    """Warns on the next page when this request's messages could not reach the queue."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with dispatch.collecting_unsent() as unsent:
            response = self.get_response(request)
        if unsent and hasattr(request, "_messages"):
            messages.warning(request, unsent_message(unsent))
        return response
