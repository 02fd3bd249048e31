"""A read of one row by primary key whose SQL Django compiles once per process, not per read.

Every step begins by reading its operation with the proxy, the cluster and its breaker beside
it (``driver``). Django builds and compiles that query anew on every ``get``: with four models'
columns selected, compiling it took twice as long as PostgreSQL took to run it (2.6 ms against
1.4 on this project's CI machine, 400 reads; the compile was 6 % of the worker's busy time in
issue 12's makespan profile). The text does not change from one read to the next, only the key.

``CompiledRead`` compiles the queryset once per connection setting, keeps the text, and on
each read sends it with the key in the place the compiler put it (``compiled_params``). The
row becomes model instances the way Django's own ``ModelIterable`` makes them, from the same
compiler's column map: the same values converted by the same fields, the related objects in
the same caches, the annotations as attributes.
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

from .compiled_params import Parameters, Plan, Setting, setting

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Read:
    """The compiled read for one connection setting, and how its row becomes models."""

    plan: Plan
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
        pk = self._model._meta.pk
        self._to_python = pk.to_python
        kind = uuid.UUID if pk.get_internal_type() == "UUIDField" else int
        self._parameters = Parameters({"pk": kind})
        self._reads: dict[Setting, _Read] = {}

    def get(self, key: Any, *, using: str = "default") -> M:
        """The row whose primary key is ``key``; ``DoesNotExist`` when there is none."""
        now_setting = setting(using)
        read = self._reads.get(now_setting) or self._compile(now_setting)
        params = read.plan.fill(self._parameters, {"pk": self._to_python(key)}, using)
        with connections[using].cursor() as cursor:
            cursor.execute(read.plan.sql, params)
            row = cursor.fetchone()
        if row is None:
            model: Any = self._model  # every concrete model has it; the stubs' Model does not
            raise model.DoesNotExist(
                f"{self._model._meta.object_name} matching query does not exist."
            )
        (converted,) = read.compiler.results_iter(results=[[row]])
        obj = self._model.from_db(using, read.init_list, converted[read.start : read.end])
        for populator in read.populators:
            populator.populate(converted, obj)
        for name, at in read.annotations.items():
            setattr(obj, name, converted[at])
        return obj

    def _compile(self, at: Setting) -> _Read:
        using, _ = at
        marker = self._parameters.markers["pk"]
        compiler = self._queryset.filter(pk=marker).query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        places = self._parameters.find(params, using)
        if len(places["pk"]) != 1:
            raise ValueError(f"the key is not one parameter of the compiled read: {params!r}")
        info = compiler.klass_info
        fields = info["select_fields"]
        start, end = fields[0], fields[-1] + 1
        read = _Read(
            plan=Plan(sql, tuple(params), places),
            compiler=compiler,
            init_list=[column[0].target.attname for column in compiler.select[start:end]],
            start=start,
            end=end,
            populators=get_related_populators(info, compiler.select, using),
            annotations=dict(compiler.annotation_col_map or {}),
        )
        self._reads[at] = read
        return read
