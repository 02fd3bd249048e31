"""Journal retention (issue 11, audit): finished operations older than
``PROXYHUB_JOURNAL_RETENTION_DAYS`` go, live work and each live proxy's newest record per kind
stay, and Beat runs the prune on the control queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django_celery_beat.models import PeriodicTask
from pump import make_cluster

from provisioning import tasks
from provisioning.models import Operation, OperationStep, Proxy
from provisioning.models.choices import OperationKind, OperationState, StepState
from provisioning.services import retention
from provisioning.services.clock import db_now

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture
def proxy() -> Proxy:
    cluster = make_cluster()
    return Proxy.objects.create(
        name="alpha", cluster=cluster, zone="pve1", machine_type="small", image="debian-13"
    )


def _op(
    proxy: Proxy | None,
    kind: str,
    state: str,
    age_days: float,
    *,
    steps: int = 2,
    name: str = "alpha",
) -> Operation:
    when = db_now() - age_days * DAY
    finished = state in (OperationState.SUCCEEDED, OperationState.FAILED)
    op = Operation.objects.create(
        kind=kind,
        proxy=proxy,
        proxy_name=name,
        state=state,
        created_at=when - timedelta(minutes=5),
        finished_at=when if finished else None,
    )
    for seq in range(1, steps + 1):
        OperationStep.objects.create(
            operation=op, seq=seq, name="clone", state=StepState.SUCCEEDED, started_at=when
        )
    return op


def test_old_finished_operations_go_with_their_steps(settings: Any, proxy: Proxy) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 30
    first_create = _op(proxy, OperationKind.CREATE, OperationState.FAILED, 200)
    newest_create = _op(proxy, OperationKind.CREATE, OperationState.SUCCEEDED, 100)
    old_reboots = [_op(proxy, OperationKind.REBOOT, OperationState.SUCCEEDED, d) for d in (90, 60)]
    recent = _op(proxy, OperationKind.REBOOT, OperationState.SUCCEEDED, 5)

    assert retention.journal_prune() == 3

    left = set(Operation.objects.values_list("pk", flat=True))
    # Past the retention, only the create that made the running VM is still on record (the
    # newest reboot is inside the window anyway).
    assert left == {newest_create.pk, recent.pk}
    gone = [first_create.pk, *(op.pk for op in old_reboots)]
    assert not OperationStep.objects.filter(operation_id__in=gone).exists()
    assert OperationStep.objects.filter(operation=newest_create).count() == 2


def test_a_live_proxy_keeps_its_newest_record_of_each_kind(settings: Any, proxy: Proxy) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 30
    kept = {
        kind: _op(proxy, kind, OperationState.SUCCEEDED, 400).pk
        for kind in (OperationKind.CREATE, OperationKind.SHUTDOWN, OperationKind.START)
    }
    _op(proxy, OperationKind.START, OperationState.SUCCEEDED, 500)

    assert retention.journal_prune() == 1
    assert set(Operation.objects.values_list("pk", flat=True)) == set(kept.values())


def test_unfinished_operations_are_never_pruned(settings: Any, proxy: Proxy) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 1
    other = Proxy.objects.create(
        name="beta", cluster=proxy.cluster, zone="pve1", machine_type="small", image="debian-13"
    )
    # One active operation per proxy (the database insists), so each on its own proxy or none.
    live = [
        _op(proxy, OperationKind.CREATE, OperationState.WAITING, 300),
        _op(other, OperationKind.DELETE, OperationState.UNKNOWN, 300, name="beta"),
        _op(None, OperationKind.DELETE, OperationState.QUEUED, 300, name="gamma"),
        _op(None, OperationKind.DELETE, OperationState.RUNNING, 300, name="delta"),
    ]
    live_pks = {op.pk for op in live}

    assert retention.journal_prune() == 0
    assert set(Operation.objects.values_list("pk", flat=True)) == live_pks


def test_a_deleted_proxys_history_ages_out_entirely(settings: Any) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 30
    old = [
        _op(None, OperationKind.CREATE, OperationState.SUCCEEDED, 120, name="gone"),
        _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 100, name="gone"),
    ]
    young = _op(None, OperationKind.DELETE, OperationState.FAILED, 10, name="other")

    assert retention.journal_prune() == len(old)
    assert list(Operation.objects.values_list("pk", flat=True)) == [young.pk]


def test_pruning_works_through_a_backlog_in_batches(settings: Any) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 7
    for i in range(23):
        _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 8 + i, steps=1, name=f"p{i}")
    keep = _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 6, steps=1, name="young")

    assert retention.journal_prune(batch=5) == 23
    assert list(Operation.objects.values_list("pk", flat=True)) == [keep.pk]
    assert OperationStep.objects.count() == 1


def test_zero_days_keeps_the_journal_forever(settings: Any) -> None:
    settings.PROXYHUB_JOURNAL_RETENTION_DAYS = 0
    _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 3000, name="ancient")
    assert tasks.prune_journal() == 0
    assert Operation.objects.count() == 1


def test_the_default_keeps_ninety_days_and_beat_prunes_on_the_control_queue(
    settings: Any,
) -> None:
    from django.conf import settings as django_settings

    assert django_settings.PROXYHUB_JOURNAL_RETENTION_DAYS == 90
    schedule = PeriodicTask.objects.get(name="proxyhub: journal pruning")
    assert schedule.task == tasks.prune_journal.name
    assert schedule.queue == "control" and schedule.enabled
    assert django_settings.CELERY_TASK_ROUTES[tasks.prune_journal.name] == {"queue": "control"}
    _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 91, name="old")
    _op(None, OperationKind.DELETE, OperationState.SUCCEEDED, 89, name="young")
    assert tasks.prune_journal() == 1
    assert list(Operation.objects.values_list("proxy_name", flat=True)) == ["young"]
