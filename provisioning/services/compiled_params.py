"""The parameters of a statement compiled once (``compiled_read``, ``compiled_update``).

Such a statement is built once with a marker value for each parameter and compiled by Django;
``Parameters.find`` then locates where each marker landed among the compiled parameters, and
``Parameters.fill`` puts a call's values there, each prepared as Django prepares that kind of
value for the connection. Finding checks that this preparation gives exactly what Django put in
the marker's place, and refuses the statement otherwise, so a value is never sent in a form
Django would not have sent.

The compiled text holds for one connection setting: the alias, and whether the server binds
the parameters (``services.prepared_statements`` switches that per step delivery, and a text
is compiled under each: ``setting``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections

# What a compiled statement's text depends on besides its shape.
Setting = tuple[str, bool]


def setting(using: str) -> Setting:
    """The alias and whether its connection binds parameters on the server right now."""
    features = connections[using].features
    return using, bool(getattr(features, "uses_server_side_binding", False))


def _marker(kind: type, n: int) -> Any:
    """The ``n``-th marker value of ``kind``: distinct from every other marker and from any
    value a statement would hold as a constant."""
    if kind is str:
        return f"compiled-statement-marker-{n}"
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
    if kind is int:
        return int(value)
    return value


class Parameters:
    """Named parameters of given kinds (``str``, ``int``, ``uuid.UUID``, ``datetime``)."""

    def __init__(self, kinds: Mapping[str, type]) -> None:
        self.kinds = dict(kinds)
        self.markers = {name: _marker(kind, n) for n, (name, kind) in enumerate(kinds.items())}

    def find(self, params: Sequence[Any], using: str) -> dict[str, tuple[int, ...]]:
        """Where each marker landed among ``params``, compiled for ``using``."""
        connection = connections[using]
        places: dict[str, tuple[int, ...]] = {}
        for name, kind in self.kinds.items():
            prepared = _prepare(kind, self.markers[name], connection)
            found = tuple(i for i, value in enumerate(params) if value == prepared)
            if not found:
                raise ValueError(
                    f"parameter {name!r} is not sent as Django sends a {kind.__name__}: "
                    f"{prepared!r} is not among {params!r}"
                )
            places[name] = found
        return places


@dataclass(frozen=True)
class Plan:
    """A statement compiled for one setting: its text, its parameters with the markers in, and
    where each named parameter goes."""

    sql: str
    params: tuple[Any, ...]
    places: dict[str, tuple[int, ...]]

    def fill(self, parameters: Parameters, values: Mapping[str, Any], using: str) -> list[Any]:
        """The parameters to send with ``values`` in their places."""
        connection = connections[using]
        out = list(self.params)
        for name, places in self.places.items():
            prepared = _prepare(parameters.kinds[name], values[name], connection)
            for at in places:
                out[at] = prepared
        return out
