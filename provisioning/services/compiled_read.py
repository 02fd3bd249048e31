"""A read of one row by primary key whose SQL Django compiles once per process, not per read.

Every step begins by reading its operation with the proxy, the cluster and its breaker beside
it (``driver``). Django builds and compiles that query anew on every ``get``: with four models'
columns selected, compiling it took twice as long as PostgreSQL took to run it (2.6 ms against
1.4 on this project's CI machine, 400 reads; the compile was 6 % of the worker's busy time in
issue 12's makespan profile). The text does not change from one read to the next, only the key.

``CompiledRead`` compiles the queryset once per database connection settings (the alias, and
whether the server binds the parameters: ``services.prepared_statements`` changes how the text
is sent, so it is compiled under each), keeps the text, and on each read sends it with the
key in the place the compiler put it. The row becomes model instances the way Django's own
``ModelIterable`` makes them, from the same compiler's column map: the same values converted
by the same fields, the related objects in the same caches, the annotations as attributes.
A test holds every field, related object and annotation to what the ORM's ``get`` gives, on
SQLite and PostgreSQL (tests/service/test_compiled_read.py).

What it gives up: only ``get(pk=...)``-shaped reads with no other parameter, and no
``select_for_update``; a queryset outside that shape is refused when the read is built.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet

# How Django's own ModelIterable turns a row into related instances; the stubs leave it out.
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Plan:
    """The compiled read for one connection setting."""

    sql: str
    params: tuple[Any, ...]
    key_at: int
    compiler: Any  # the SQLCompiler that compiled it: its column map turns rows into models
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]
    annotations: dict[str, int]


class CompiledRead(Generic[M]):
    """``queryset.get(pk=key)`` with the query compiled once (module docstring)."""

    def __init__(self, queryset: QuerySet[M]) -> None:
        query = queryset.query
        if query.select_for_update or query.where or query.low_mark or query.high_mark:
            raise ValueError("a compiled read takes an unfiltered, unlocked, unsliced queryset")
        self._queryset = queryset
        self._model: type[M] = queryset.model
        self._plans: dict[tuple[str, bool], _Plan] = {}

    def get(self, key: Any, *, using: str = "default") -> M:
        """The row whose primary key is ``key``; ``DoesNotExist`` when there is none."""
        connection = connections[using]
        setting = (using, bool(getattr(connection.features, "uses_server_side_binding", False)))
        plan = self._plans.get(setting) or self._compile(setting)
        params = list(plan.params)
        params[plan.key_at] = self._model._meta.pk.get_db_prep_value(
            self._model._meta.pk.to_python(key), connection
        )
        with connection.cursor() as cursor:
            cursor.execute(plan.sql, params)
            row = cursor.fetchone()
        if row is None:
            model: Any = self._model  # every concrete model has it; the stubs' Model does not
            raise model.DoesNotExist(
                f"{self._model._meta.object_name} matching query does not exist."
            )
        (converted,) = plan.compiler.results_iter(results=[[row]])
        obj = self._model.from_db(using, plan.init_list, converted[plan.start : plan.end])
        for populator in plan.populators:
            populator.populate(converted, obj)
        for name, at in plan.annotations.items():
            setattr(obj, name, converted[at])
        return obj

    def _compile(self, setting: tuple[str, bool]) -> _Plan:
        using, _ = setting
        connection = connections[using]
        pk = self._model._meta.pk
        # A key no row has, to find where the compiler puts the key among the parameters.
        marker = pk.to_python(uuid.UUID(int=0x5EED) if pk.get_internal_type() == "UUIDField" else 0)
        prepared = pk.get_db_prep_value(marker, connection)
        compiler = self._queryset.filter(pk=marker).query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        at = [i for i, value in enumerate(params) if value == prepared]
        if len(at) != 1:
            raise ValueError(f"the key is not one parameter of the compiled read: {params!r}")
        info = compiler.klass_info
        fields = info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        plan = _Plan(
            sql=sql,
            params=tuple(params),
            key_at=at[0],
            compiler=compiler,
            init_list=[column[0].target.attname for column in compiler.select[start:end]],
            start=start,
            end=end,
            populators=get_related_populators(info, compiler.select, using),
            annotations=dict(compiler.annotation_col_map or {}),
        )
        self._plans[setting] = plan
        return plan
