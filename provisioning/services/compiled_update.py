"""An UPDATE whose SQL Django compiles once per process, sent with new values each time.

The claim that starts every step delivery (``services.claims``) is one UPDATE of a fixed shape:
the same columns set, the same conditions, new values. Django built and compiled it on every
call, which took about three times as long as PostgreSQL took to run it (1.02 ms against 0.24,
300 claims with the steps' server binding; the claim was 9 % of the worker's busy time in issue
12's makespan profile). ``services.compiled_read`` does the same for the operation's read.

``CompiledUpdate`` builds the statement once per connection setting from a builder given a
marker value for each named parameter, compiles it, and sends each call's values in the
markers' places (``compiled_params``: a value is never sent in a form Django would not have
sent).

Parameters are of the kinds ``compiled_params`` knows only; a list whose length varies (``__in``
over a caller's values) changes the text and cannot be a parameter: pass it as a constant or
use the ORM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet
from django.db.models.sql.subqueries import UpdateQuery

from .compiled_params import Parameters, Plan, Setting, setting

Build = Callable[[Mapping[str, Any]], tuple[QuerySet[Any], dict[str, Any]]]


class CompiledUpdate:
    """``queryset.update(**values)`` with the statement compiled once (module docstring).
    ``build`` returns the queryset and the values from the markers it is given; ``kinds``
    names each parameter's kind (``str``, ``int``, ``uuid.UUID``, ``datetime``)."""

    def __init__(self, build: Build, **kinds: type) -> None:
        self._build = build
        self._parameters = Parameters(kinds)
        self._plans: dict[Setting, Plan] = {}

    def run(self, *, using: str = "default", **values: Any) -> int:
        """Run the UPDATE with ``values`` (one per parameter); the number of rows it changed."""
        if values.keys() != self._parameters.kinds.keys():
            raise TypeError(f"a compiled update takes exactly {sorted(self._parameters.kinds)}")
        now_setting = setting(using)
        plan = self._plans.get(now_setting) or self._compile(now_setting)
        params = plan.fill(self._parameters, values, using)
        connection = connections[using]
        with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
            cursor.execute(plan.sql, params)
            return int(cursor.rowcount)

    def _compile(self, at: Setting) -> Plan:
        using, _ = at
        queryset, updates = self._build(self._parameters.markers)
        # chain(klass) returns a klass; the stubs say Query.
        query: UpdateQuery = queryset.query.chain(UpdateQuery)  # type: ignore[assignment]
        query.add_update_values(updates)
        query.annotations = {}
        query.get_initial_alias()
        if query.related_updates or query.count_active_tables() != 1:
            # Django runs such an update as a read of the keys and then updates: not one text.
            raise ValueError("a compiled update changes one table on conditions of that table")
        sql, params = query.get_compiler(using).as_sql()
        plan = Plan(sql, tuple(params), self._parameters.find(params, using))
        self._plans[at] = plan
        return plan
