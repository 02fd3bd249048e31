"""A broker that is down never fails an admin request whose data committed (issue 11).

Real on-commit callbacks (a transactional database) publish through a real Celery app: first to
a loopback port where nothing listens, then to the real Redis of the test machine (its own
database number). The admin add and the delete action answer as usual, the operations are in
the journal, the next page says the queue is unreachable and the sweeper will send the work,
and once the broker is back the sweeper's message for each operation is in the queue.

Bounded by pytest's timeout, not by a timing assertion: a publish that hung would fail the test.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta
from typing import Any

import pytest
from pump import make_cluster
from redis_broker import broker, queue_messages
from test_admin_support import PROXY_LIST, People, changelist_post, people_fixture  # noqa: F401

from provisioning.models import Operation, Proxy
from provisioning.models.choices import OperationKind, OperationState, Phase
from provisioning.services.dispatch import STEP_QUEUE, STEP_TASK
from provisioning.services.sweeper import operations_sweep

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

UNREACHABLE = "The task queue is unreachable"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _step_messages(queue: Any) -> list[dict[str, Any]]:
    return [
        {"task": m["task"], **m["kwargs"]}
        for m in queue_messages(queue)
        if m["queue"] == STEP_QUEUE
    ]


def _page_messages(client: Any, response: Any) -> str:
    assert response.status_code == 302, response.status_code
    return client.get(response["Location"]).content.decode()


def test_admin_work_is_recorded_shown_as_waiting_and_sent_by_the_sweeper(
    people: People, live_broker: str, live_queue: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = make_cluster()
    standing = Proxy.objects.create(
        name="standing",
        cluster=cluster,
        zone="pve1",
        machine_type="small",
        image="debian-13",
        phase=Phase.RUNNING,
    )
    client = people.client("superuser")
    caplog.set_level(logging.WARNING)

    with broker(f"redis://127.0.0.1:{_closed_port()}/0"):
        added = client.post(
            f"{PROXY_LIST}add/",
            {
                "name": "alpha",
                "cluster": cluster.pk,
                "zone": "pve1",
                "machine_type": "small",
                "image": "debian-13",
                "cloud_init_text": "#cloud-config\n",
            },
        )
        after_add = _page_messages(client, added)
        confirm = client.post(PROXY_LIST, changelist_post("delete_vms", [standing]))
        assert confirm.status_code == 200
        key = confirm.context["idempotency_key"]
        deleted = client.post(
            PROXY_LIST,
            changelist_post("delete_vms", [standing], post="yes", idempotency_key=key),
        )
        after_delete = _page_messages(client, deleted)

    # The data committed, the work is queued in the journal, and each page said why it waits.
    create = Operation.objects.get(proxy_name="alpha")
    delete = Operation.objects.get(proxy_name="standing")
    assert (create.kind, delete.kind) == (OperationKind.CREATE, OperationKind.DELETE)
    assert {create.state, delete.state} == {OperationState.QUEUED}
    for page in (after_add, after_delete):
        assert UNREACHABLE in page
        assert "1 operation is recorded and will start once the queue is reachable" in page
        assert "sweeper" in page
    unsent = [r for r in caplog.records if r.getMessage().startswith("step message not sent")]
    assert {r.operation for r in unsent} == {str(create.pk), str(delete.pk)}  # type: ignore[attr-defined]
    assert queue_messages(live_queue) == []

    # The broker is back: the sweeper sends both steps, with the tokens the journal holds.
    with broker(live_broker):
        assert operations_sweep(grace=timedelta(0)) == 2
    sent = {m["operation_id"]: m for m in _step_messages(live_queue)}
    assert set(sent) == {str(create.pk), str(delete.pk)}
    for op in (create, delete):
        op.refresh_from_db()
        assert sent[str(op.pk)] == {
            "task": STEP_TASK,
            "operation_id": str(op.pk),
            "token": op.dispatch_token,
        }


def test_a_reachable_broker_gets_the_step_and_the_page_says_nothing_of_it(
    people: People, live_broker: str, live_queue: Any
) -> None:
    cluster = make_cluster()
    client = people.client("superuser")
    with broker(live_broker):
        added = client.post(
            f"{PROXY_LIST}add/",
            {
                "name": "beta",
                "cluster": cluster.pk,
                "zone": "pve1",
                "machine_type": "small",
                "image": "debian-13",
                "cloud_init_text": "#cloud-config\n",
            },
        )
        page = _page_messages(client, added)
    op = Operation.objects.get(proxy_name="beta")
    assert UNREACHABLE not in page
    assert [m["operation_id"] for m in _step_messages(live_queue)] == [str(op.pk)]


def test_a_health_round_asked_for_while_the_broker_is_down_is_a_warning_not_an_error(
    people: People,
) -> None:
    cluster = make_cluster()
    client = people.client("superuser")
    with broker(f"redis://127.0.0.1:{_closed_port()}/0"):
        done = client.post(
            "/admin/provisioning/cluster/",
            {"action": "check_now", "_selected_action": [str(cluster.pk)]},
        )
    page = _page_messages(client, done)
    assert f"{UNREACHABLE}: the node health round was not sent" in page
