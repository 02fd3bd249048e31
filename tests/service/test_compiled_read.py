"""The operation's read compiled once (services/compiled_read.py) gives what the ORM's ``get``
gives: every field, the related rows select_related fetched (or their absence), and the
switches' annotation, in one statement; on SQLite and PostgreSQL, with and without the
server binding the parameters (services.prepared_statements)."""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from typing import Any

import pytest
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pump import Pump, Sim, proxy_spec

from provisioning.models import CircuitBreaker, MaintenanceWindow, Operation
from provisioning.models.choices import OperationKind
from provisioning.services import driver, maintenance, operations, prepared_statements
from provisioning.services.compiled_read import CompiledRead

pytestmark = pytest.mark.django_db


def _snapshot(obj: Model | None, depth: int = 3) -> Any:
    """Every concrete field's value, the annotation, and what sits in the related caches."""
    if obj is None or depth == 0:
        return obj
    values: dict[str, Any] = {
        field.attname: getattr(obj, field.attname) for field in obj._meta.concrete_fields
    }
    values["_type"] = type(obj).__name__
    values["_db"] = obj._state.db
    values["_adding"] = obj._state.adding
    if hasattr(obj, "cluster_switched"):
        values["cluster_switched"] = obj.cluster_switched
    values["_cached"] = {
        name: _snapshot(cached, depth - 1) for name, cached in obj._state.fields_cache.items()
    }
    return values


def _both(pk: Any) -> tuple[Any, Any]:
    compiled = driver._OPERATION_READ
    orm = compiled._queryset.get(pk=pk)
    return _snapshot(compiled.get(pk)), _snapshot(orm)


@pytest.mark.parametrize("server_binding", [False, True])
def test_the_compiled_read_gives_what_the_orm_gives(
    pump: Pump, sim: Sim, server_binding: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if server_binding and not prepared_statements.enabled():
        pytest.skip("the server binds parameters only on PostgreSQL")
    pump.call(operations.proxies_create, specs=[proxy_spec(sim, "p0")])
    pump.run()
    op = Operation.objects.get(proxy__name="p0")
    assert op.proxy_id and op.cluster_id and op.progress
    lone = Operation.objects.create(kind=OperationKind.DELETE, proxy_name="gone")

    def check() -> None:
        for pk in (op.pk, str(op.pk), lone.pk):
            compiled, orm = _both(pk)
            assert compiled == orm
        # The operation's own values arrived converted (the JSON decoded, the key a UUID).
        read = driver._OPERATION_READ.get(str(op.pk))
        assert isinstance(read.pk, uuid.UUID) and read.progress == op.progress
        assert read.proxy is not None and read.proxy.name == "p0"
        assert read.cluster_id == op.cluster_id

    with prepared_statements.steps_prepared() if server_binding else nullcontext():
        check()
        assert CircuitBreaker.objects.filter(cluster_id=op.cluster_id).exists()
        MaintenanceWindow.objects.create(
            cluster_id=op.cluster_id,
            reason="disk swap",
            started_by="ops",
            started_at=timezone.now(),
        )
        check()
        assert not maintenance.no_switch_read(driver._OPERATION_READ.get(op.pk))
        CircuitBreaker.objects.filter(cluster_id=op.cluster_id).delete()
        check()
        with CaptureQueriesContext(connection) as ctx:
            driver._OPERATION_READ.get(op.pk)
        assert len(ctx.captured_queries) == 1


def test_a_missing_row_is_does_not_exist_as_from_the_orm() -> None:
    with pytest.raises(Operation.DoesNotExist):
        driver._OPERATION_READ.get(uuid.uuid4())


def test_only_a_plain_read_by_key_can_be_compiled() -> None:
    for queryset in (
        Operation.objects.filter(kind=OperationKind.CREATE),
        Operation.objects.select_for_update(),
        Operation.objects.all()[:5],
    ):
        with pytest.raises(ValueError, match="unfiltered, unlocked, unsliced"):
            CompiledRead(queryset)
