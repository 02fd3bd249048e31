"""Beat's schedules in the admin: who may change what of proxyhub's own jobs (issue 11).

A staff member holding ``change_periodictask`` may retune a proxyhub schedule's interval and
nothing else: posted changes to its task, arguments, queue or enabled flag are not applied (the
row is read back from the database), it cannot be deleted or disabled through an action, and no
schedule can be pointed at a proxyhub task. A superuser may do all of it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from test_admin_support import messages_of

pytestmark = pytest.mark.django_db

RECONCILE = "proxyhub: reconcile"
HEALTH = "proxyhub: node health checks"


def _url(task: PeriodicTask, view: str = "change") -> str:
    return f"/admin/django_celery_beat/periodictask/{task.pk}/{view}/"


@pytest.fixture
def scheduler(django_user_model: Any) -> Client:
    """Staff holding the beat permissions (view, change, delete, add), not a superuser."""
    user = django_user_model.objects.create_user(username="sam", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_celery_beat", codename__endswith="periodictask"
        )
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def root(django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def _form(row: PeriodicTask, **changes: Any) -> dict[str, Any]:
    """Everything the change page would post for ``row``, with ``changes``."""
    data = {
        "name": row.name,
        "regtask": "",
        "task": row.task,
        "enabled": "on" if row.enabled else "",
        "description": row.description,
        "interval": row.interval_id or "",
        "crontab": "",
        "solar": "",
        "clocked": "",
        "start_time_0": "",
        "start_time_1": "",
        "args": row.args,
        "kwargs": row.kwargs,
        "expires_0": "",
        "expires_1": "",
        "expire_seconds": row.expire_seconds or "",
        "queue": row.queue or "",
        "exchange": row.exchange or "",
        "routing_key": row.routing_key or "",
        "priority": "",
        "headers": row.headers,
        "_save": "Save",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != "" or k in {"regtask", "enabled"}}


def _tampered(row: PeriodicTask, interval: IntervalSchedule) -> dict[str, Any]:
    return _form(
        row,
        task="proxyhub.provisioning.gc",
        args='["x"]',
        kwargs='{"dry_run": true}',
        queue="provisioning",
        headers='{"h": 1}',
        enabled="",
        interval=interval.pk,
    )


def test_staff_may_change_only_the_interval_of_proxyhub_schedules(scheduler: Client) -> None:
    task = PeriodicTask.objects.get(name=RECONCILE)
    before = (task.task, task.args, task.kwargs, task.queue, task.headers, task.enabled)
    slower, _ = IntervalSchedule.objects.get_or_create(every=600, period="seconds")

    response = scheduler.post(_url(task), _tampered(task, slower))

    assert response.status_code == 302, response.content.decode()[:2000]
    task.refresh_from_db()
    assert task.interval_id == slower.pk
    assert (task.task, task.args, task.kwargs, task.queue, task.headers, task.enabled) == before
    assert before[0] == "proxyhub.provisioning.reconcile" and before[-1] is True


def test_the_change_page_shows_staff_the_rest_read_only(scheduler: Client) -> None:
    task = PeriodicTask.objects.get(name=HEALTH)
    page = scheduler.get(_url(task)).content.decode()
    assert 'name="interval"' in page
    for field in ("task", "args", "kwargs", "queue", "enabled", "regtask", "name"):
        assert f'name="{field}"' not in page, field
    assert "proxyhub.health.check_round" in page  # shown, not editable


def test_staff_cannot_delete_or_disable_proxyhub_schedules(scheduler: Client) -> None:
    task = PeriodicTask.objects.get(name=RECONCILE)
    assert scheduler.post(_url(task, "delete"), {"post": "yes"}).status_code == 403
    response = scheduler.post(
        "/admin/django_celery_beat/periodictask/",
        {"action": "disable_tasks", "_selected_action": [task.pk]},
        follow=True,
    )
    task.refresh_from_db()
    assert task.enabled is True
    assert PeriodicTask.objects.filter(name=RECONCILE).exists()
    assert any("only a superuser" in m for m in messages_of(response))


def test_staff_cannot_point_a_schedule_at_a_proxyhub_task(scheduler: Client) -> None:
    every, _ = IntervalSchedule.objects.get_or_create(every=60, period="seconds")
    foreign = PeriodicTask.objects.create(name="backup", task="ops.backup", interval=every)
    response = scheduler.post(_url(foreign), _form(foreign, task="proxyhub.provisioning.gc"))
    assert response.status_code == 200
    assert "only a superuser may schedule it" in response.content.decode()
    foreign.refresh_from_db()
    assert foreign.task == "ops.backup"
    # Their own schedules stay theirs: the action applies to them.
    scheduler.post(
        "/admin/django_celery_beat/periodictask/",
        {"action": "disable_tasks", "_selected_action": [foreign.pk]},
    )
    foreign.refresh_from_db()
    assert foreign.enabled is False


def test_a_superuser_may_change_everything(root: Client) -> None:
    task = PeriodicTask.objects.get(name=RECONCILE)
    slower, _ = IntervalSchedule.objects.get_or_create(every=600, period="seconds")

    response = root.post(_url(task), _tampered(task, slower))

    assert response.status_code == 302, response.content.decode()[:2000]
    task.refresh_from_db()
    assert task.task == "proxyhub.provisioning.gc"
    assert task.args == '["x"]'
    assert task.queue == "provisioning"
    assert task.enabled is False
    assert task.interval_id == slower.pk
    assert root.post(_url(task, "delete"), {"post": "yes"}).status_code == 302
    assert not PeriodicTask.objects.filter(name=RECONCILE).exists()
