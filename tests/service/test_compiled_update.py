"""The claim's UPDATE compiled once (services/compiled_update.py, services/claims.py) changes
the same rows to the same values as the ORM's ``update``, in every case the claim decides, on
SQLite and PostgreSQL, with and without the server binding the parameters
(services.prepared_statements); and a statement it cannot send faithfully is refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q, QuerySet
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from provisioning.models import Operation
from provisioning.models.choices import OperationKind, OperationState
from provisioning.services import claims, prepared_statements
from provisioning.services.compiled_update import CompiledUpdate

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=123456)
# What a row can look like when a message for it arrives: (token, state, next step, claim expiry).
CASES = [
    ("t1", OperationState.RUNNING, None, None),
    ("t1", OperationState.RUNNING, NOW - timedelta(seconds=5), NOW - timedelta(seconds=1)),
    ("t1", OperationState.WAITING, NOW + timedelta(milliseconds=100), None),
    ("t1", OperationState.RUNNING, NOW + timedelta(seconds=3), None),  # not due yet
    ("t1", OperationState.RUNNING, None, NOW + timedelta(seconds=9)),  # a live claim
    ("old", OperationState.RUNNING, None, None),  # a stale token
    ("t1", OperationState.SUCCEEDED, None, None),  # finished
]


def _row(token: str, state: str, due: datetime | None, expiry: datetime | None) -> Operation:
    return Operation.objects.create(
        kind=OperationKind.CREATE,
        proxy_name="p",
        dispatch_token=token,
        state=state,
        next_step_at=due,
        claim_token="someone" if expiry else "",
        claim_expires_at=expiry,
        redispatches=2,
    )


def _state(op: Operation) -> tuple[Any, ...]:
    op.refresh_from_db()
    return (
        op.claim_token,
        op.claim_expires_at,
        op.dispatch_token,
        op.redispatches,
        op.state,
        op.next_step_at,
    )


def _orm_claim(pk: Any, claim: str) -> int:
    """The claim as the ORM ran it before it was compiled."""
    free = Q(claim_expires_at__isnull=True) | Q(claim_expires_at__lt=NOW)
    due = Q(next_step_at__isnull=True) | Q(next_step_at__lte=NOW + claims.DUE_SLACK)
    return (
        Operation.objects.filter(pk=pk, dispatch_token="t1", state__in=claims.ACTIVE_STATES)
        .filter(free, due)
        .update(
            claim_token=claim,
            claim_expires_at=NOW + timedelta(seconds=30),
            dispatch_token="",
            redispatches=0,
        )
    )


@contextmanager
def _binding(server: bool) -> Iterator[None]:
    with prepared_statements.steps_prepared() if server else nullcontext():
        yield


@pytest.mark.parametrize("server_binding", [False, True])
def test_the_compiled_claim_changes_what_the_orm_changes(server_binding: bool) -> None:
    if server_binding and not prepared_statements.enabled():
        pytest.skip("the server binds parameters only on PostgreSQL")
    with _binding(server_binding):
        taken = 0
        for case in CASES:
            by_orm, compiled = _row(*case), _row(*case)
            expected = _orm_claim(by_orm.pk, "c1")
            got = claims._TAKE.run(
                pk=str(compiled.pk),
                token="t1",
                now=NOW,
                due_by=NOW + claims.DUE_SLACK,
                claim="c1",
                expires=NOW + timedelta(seconds=30),
            )
            assert got == expected, case
            assert _state(compiled) == _state(by_orm), case
            taken += got
        assert taken == 3  # the first three cases are ours to run
        op = _row(*CASES[0])
        with CaptureQueriesContext(connection) as ctx:
            claims._TAKE.run(
                pk=op.pk,
                token="t1",
                now=NOW,
                due_by=NOW,
                claim="c2",
                expires=NOW,
            )
        assert len(ctx.captured_queries) == 1
        assert _state(op)[0] == "c2"


def _by_text(p: Mapping[str, Any]) -> tuple[QuerySet[Any], dict[str, Any]]:
    return Operation.objects.filter(next_step_at__lte=p["when"]), {"last_error": "x"}


def _by_stage(p: Mapping[str, Any]) -> tuple[QuerySet[Any], dict[str, Any]]:
    return Operation.objects.filter(progress__stage=p["stage"]), {"last_error": "x"}


def _joined(p: Mapping[str, Any]) -> tuple[QuerySet[Any], dict[str, Any]]:
    return Operation.objects.filter(proxy__name=p["name"]), {"last_error": "x"}


def test_a_statement_it_cannot_send_as_django_would_is_refused() -> None:
    # A JSON key's value: Django sends it encoded, so the text is not where it would go.
    with pytest.raises(ValueError, match="is not sent as Django sends a str"):
        CompiledUpdate(_by_stage, stage=str).run(stage="clone")
    with pytest.raises(ValueError, match="changes one table"):
        CompiledUpdate(_joined, name=str).run(name="p0")
    with pytest.raises(TypeError, match="exactly"):
        CompiledUpdate(_by_text, when=datetime).run(when=NOW, extra=1)
    with pytest.raises(TypeError, match="no compiled parameter of kind"):
        CompiledUpdate(_by_text, when=float).run(when=1.5)


def test_a_key_given_as_text_or_as_a_uuid_finds_the_same_row() -> None:
    op = _row(*CASES[0])
    for pk in (op.pk, str(op.pk)):
        op.dispatch_token = "t1"
        Operation.objects.filter(pk=op.pk).update(dispatch_token="t1", claim_expires_at=None)
        assert claims._TAKE.run(pk=pk, token="t1", now=NOW, due_by=NOW, claim="c", expires=NOW), pk
    assert not claims._TAKE.run(
        pk=uuid.uuid4(), token="t1", now=NOW, due_by=NOW, claim="c", expires=NOW
    )
