"""An UPDATE whose SQL Django compiles once per process, sent with new values each time.

The claim that starts every step delivery (``services.claims``) is one UPDATE of a fixed shape:
the same columns set, the same conditions, new values. Django built and compiled it on every
call, which took about three times as long as PostgreSQL took to run it (1.02 ms against 0.24,
300 claims with the steps' server binding; the claim was 9 % of the worker's busy time in issue
12's makespan profile). ``services.compiled_read`` does the same for the operation's read.

``CompiledUpdate`` builds the statement once per connection setting from a builder given a
marker value for each named parameter, compiles it, and finds where each marker landed among
the compiled parameters. A call puts its values there, each prepared as Django prepares that
kind of value for the connection (``_PREPARE``). Compiling checks that this preparation gives
exactly what Django put in the marker's place, and refuses the statement otherwise, so a value
is never sent in a form Django would not have sent.

Parameters are of the kinds in ``_MARKERS`` only; a list whose length varies (``__in`` over a
caller's values) changes the text and cannot be a parameter: pass it as a constant or use the
ORM.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet
from django.db.models.sql.subqueries import UpdateQuery

Build = Callable[[Mapping[str, Any]], tuple[QuerySet[Any], dict[str, Any]]]


def _marker(kind: type, n: int) -> Any:
    """The ``n``-th marker value of ``kind``: distinct from every other marker and from any
    value a statement would hold as a constant."""
    if kind is str:
        return f"compiled-update-marker-{n}"
    if kind is int:
        return 987_654_321 + n
    if kind is uuid.UUID:
        return uuid.UUID(int=0x5EED_0000 + n)
    if kind is datetime:
        return datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC) + timedelta(microseconds=n)
    raise TypeError(f"no compiled parameter of kind {kind.__name__}")


def _prepare(kind: type, value: Any, connection: Any) -> Any:
    """``value`` as Django sends a value of ``kind`` to ``connection``."""
    if kind is uuid.UUID:
        value = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        return value if connection.features.has_native_uuid_field else value.hex
    if kind is datetime:
        return connection.ops.adapt_datetimefield_value(value)
    return value


@dataclass(frozen=True)
class _Plan:
    sql: str
    params: tuple[Any, ...]
    places: dict[str, tuple[int, ...]]


class CompiledUpdate:
    """``queryset.update(**values)`` with the statement compiled once (module docstring).
    ``build`` returns the queryset and the values from the markers it is given; ``kinds``
    names each parameter's kind (``str``, ``int``, ``uuid.UUID``, ``datetime``)."""

    def __init__(self, build: Build, **kinds: type) -> None:
        self._build = build
        self._kinds = kinds
        self._plans: dict[tuple[str, bool], _Plan] = {}

    def run(self, *, using: str = "default", **values: Any) -> int:
        """Run the UPDATE with ``values`` (one per parameter); the number of rows it changed."""
        if values.keys() != self._kinds.keys():
            raise TypeError(f"a compiled update takes exactly {sorted(self._kinds)}")
        connection = connections[using]
        setting = (using, bool(getattr(connection.features, "uses_server_side_binding", False)))
        plan = self._plans.get(setting) or self._compile(setting)
        params = list(plan.params)
        for name, places in plan.places.items():
            prepared = _prepare(self._kinds[name], values[name], connection)
            for at in places:
                params[at] = prepared
        with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
            cursor.execute(plan.sql, params)
            return int(cursor.rowcount)

    def _compile(self, setting: tuple[str, bool]) -> _Plan:
        using, _ = setting
        connection = connections[using]
        markers = {name: _marker(kind, n) for n, (name, kind) in enumerate(self._kinds.items())}
        queryset, updates = self._build(markers)
        # chain(klass) returns a klass; the stubs say Query.
        query: UpdateQuery = queryset.query.chain(UpdateQuery)  # type: ignore[assignment]
        query.add_update_values(updates)
        query.annotations = {}
        query.get_initial_alias()
        if query.related_updates or query.count_active_tables() != 1:
            # Django runs such an update as a read of the keys and then updates: not one text.
            raise ValueError("a compiled update changes one table on conditions of that table")
        sql, params = query.get_compiler(using).as_sql()
        places: dict[str, tuple[int, ...]] = {}
        for name, kind in self._kinds.items():
            prepared = _prepare(kind, markers[name], connection)
            found = tuple(i for i, value in enumerate(params) if value == prepared)
            if not found:
                raise ValueError(
                    f"parameter {name!r} is not sent as Django sends a {kind.__name__}: "
                    f"{prepared!r} is not among {params!r}"
                )
            places[name] = found
        plan = _Plan(sql=sql, params=tuple(params), places=places)
        self._plans[setting] = plan
        return plan
